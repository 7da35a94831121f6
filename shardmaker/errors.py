"""Error types. Every message names the file, shard or key and what is wrong with it."""

from __future__ import annotations

import enum
import importlib
import re
from types import ModuleType
from typing import Any

from shardmaker import deprecation

__all__ = [
    "EXTRAS",
    "BuildError",
    "ImageDataError",
    "InputError",
    "MissingExtraError",
    "OnError",
    "ShardmakerError",
    "brief",
    "missing_extra_of",
    "require_extra",
]

BRIEF_CHARS = 80  # the most characters of a user-given value an error message quotes


def brief(value: Any, limit: int = BRIEF_CHARS) -> str:
    """``repr(value)`` for an error message, at most ``limit`` characters: never formats an unbounded value.

    Containers are described by type and length past the limit, without building their whole repr
    (a YAML "billion laughs" value is a few KB on disk and gigabytes as a repr).
    """
    if isinstance(value, (str, bytes)):
        text = repr(value[: limit + 1])
    elif isinstance(value, (int, float, bool)) or value is None:
        text = repr(value) if not isinstance(value, int) or value.bit_length() < 3 * limit else "<huge int>"
    elif isinstance(value, (list, tuple, dict, set, frozenset)):
        text = f"<{type(value).__name__} of {len(value)} items>"
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else list(value)[:9]
        if len(value) <= 8 and all(_scalar(v, limit) for v in items):
            text = repr(value)
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def brief_ends(text: str, limit: int = BRIEF_CHARS) -> str:
    """``repr(text)`` for an error message, its middle elided past ``limit`` characters: for a path or
    URL pattern, whose end (the file name, the braces) says as much as its start."""
    if len(text) <= limit:
        return repr(text)
    head = limit // 3
    return repr(text[:head] + "..." + text[-(limit - head - 3) :])


def _scalar(v: Any, limit: int) -> bool:
    if isinstance(v, int):
        return v.bit_length() < 3 * limit  # under ``limit`` digits, and no int-to-str digit limit hit
    return v is None or isinstance(v, float) or (isinstance(v, str) and len(v) <= limit)


class ImageDataError(ValueError):
    """Bytes that are not a usable image; the caller adds the file or member name."""


class ShardmakerError(Exception):
    """Base class; the CLI turns it into a one-line message and exit status 2."""


class InputError(ShardmakerError, ValueError):
    """A source image or the source tree is unusable (missing, corrupt, unpairable, ...)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # keep (path, reason) across worker processes
        return (type(self), (self.path, self.reason))


def unreadable(exc: BaseException) -> str:
    """The reason of an :class:`InputError` for a decoder's own exception on a source (any type: a crafted
    file reaches code paths its decoder never meant to raise from): one line, its type and start."""
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"cannot read it ({type(exc).__name__}{': ' + first if first else ''})"


class BuildError(ShardmakerError):
    """The build cannot go on: output refused, write failed, parts inconsistent."""


# optional packages a command may need -> the extra of pyproject.toml that installs them
EXTRAS = {
    "av": "video",
    "imagecodecs": "tiff",
    "tensorboard": "tensorboard",
    "s3fs": "s3",
    "simplejpeg": "jpeg",
    "scikit-image": "demo",
    "spandrel": "zoo",
}


class MissingExtraError(ShardmakerError, ValueError):
    """An optional package a command needs is not installed: settings that cannot become valid by
    trying again (exit 2), never skipped as one bad sample. The message names the extra to install."""

    def __init__(self, package: str, needed_for: str, detail: str = "") -> None:
        how = f"pip install 'wdsr[{EXTRAS[package]}]'" if package in EXTRAS else f"pip install {package}"
        super().__init__(f"{needed_for} needs {package}, which is not installed{f' ({detail})' if detail else ''}: {how}")
        self.package, self.needed_for, self.detail = package, needed_for, detail

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # across worker processes
        return (type(self), (self.package, self.needed_for, self.detail))


def require_extra(module: str, needed_for: str, package: str | None = None) -> ModuleType:
    """``import module`` (``"av"``, ``"torch.utils.tensorboard"``), or a :class:`MissingExtraError`
    naming ``package`` (default: the module's top level) and the extra that installs it (:data:`EXTRAS`)."""
    package = package or module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        detail = "" if getattr(exc, "name", None) in (package, module) else str(exc)[:120]
        raise MissingExtraError(package, needed_for, detail) from None


def missing_extra_of(exc: BaseException) -> MissingExtraError | None:
    """The :class:`MissingExtraError` an import error raised outside our code stands for: fsspec's
    "Install s3fs to access S3" for an ``s3://`` URL, or an optional package of :data:`EXTRAS` not
    found; None for any other error."""
    if isinstance(exc, MissingExtraError) or not isinstance(exc, ImportError):
        return None
    m = re.fullmatch(r"Install (\S+) to access (.+)", str(exc).strip())
    if m:  # fsspec's registry: a URL scheme whose filesystem package is missing
        return MissingExtraError(m.group(1), f"reading {m.group(2)}")
    name = (getattr(exc, "name", None) or "").split(".")[0]
    return MissingExtraError(name, "this command") if name in EXTRAS else None


class OnError(str, enum.Enum):
    """What to do with a bad sample, in ``shardmaker build`` and in ``wdsr.SRDataset`` alike."""

    FAIL = "fail"  # raise, naming the file/shard and key
    SKIP = "skip"  # leave the sample out, count and log it (the stream keeps batch counts equal)


class _VerifyError(ShardmakerError):
    """Never raised: ``shardmaker.verify.verify`` returns its problems (the CLI exits 1 on any)."""


__getattr__ = deprecation.module_getattr(
    __name__, {"VerifyError": ("the problems list that shardmaker.verify.verify returns", _VerifyError)}
)
