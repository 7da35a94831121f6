"""Deprecated public names and module paths: each still works for one release and warns where it is used.

A public door of ``shardmaker`` (``wdsr`` uses it for its own deprecated names)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["WdsrDeprecationWarning", "alias_modules", "module_getattr", "warn"]


class WdsrDeprecationWarning(DeprecationWarning):
    """A name or argument that goes in the next release; the message says what replaces it."""


def warn(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"{old} is deprecated and goes in the next release; use {new}", WdsrDeprecationWarning, stacklevel=stacklevel)


def module_getattr(module: str, aliases: dict[str, tuple[str, Any]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that serves ``aliases`` (old name -> (what to use, object)) with a warning."""

    def __getattr__(name: str) -> Any:
        if name in aliases:
            new, obj = aliases[name]
            warn(f"{module}.{name}", new)
            return obj
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Old module paths (``wdsr.stream``, ``shardmaker.codecs``, ...) served as the modules that
    replaced them, with a warning; consulted only after the real finders found nothing."""

    def __init__(self, moved: dict[str, str]) -> None:
        self.moved = moved

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.moved:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # a plain module, filled in below

    def exec_module(self, module: types.ModuleType) -> None:
        new = self.moved[module.__name__]
        warn(f"the module {module.__name__}", new, stacklevel=4)
        target = importlib.import_module(new)
        module.__dict__.update({k: v for k, v in target.__dict__.items() if not k.startswith("__")})
        module.__getattr__ = lambda name: getattr(target, name)  # type: ignore[method-assign]


def alias_modules(moved: dict[str, str]) -> None:
    """Serve each old module path in ``moved`` (old -> new) with a deprecation warning, for one release."""
    for finder in sys.meta_path:
        if isinstance(finder, _MovedModules):
            finder.moved.update(moved)
            return
    sys.meta_path.append(_MovedModules(dict(moved)))
