"""Deprecated public names: each still works for one release and warns where it is used."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any


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
