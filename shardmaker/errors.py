"""Error types. Every message names the file, shard or key and what is wrong with it."""

from __future__ import annotations

import enum
from typing import Any

from shardmaker import deprecation

__all__ = ["BuildError", "ImageDataError", "InputError", "OnError", "ShardmakerError", "brief"]

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


class BuildError(ShardmakerError):
    """The build cannot go on: output refused, write failed, parts inconsistent."""


class OnError(str, enum.Enum):
    """What to do with a bad sample, in ``shardmaker build`` and in ``wdsr.SRDataset`` alike."""

    FAIL = "fail"  # raise, naming the file/shard and key
    SKIP = "skip"  # leave the sample out, count and log it (the stream keeps batch counts equal)


class _VerifyError(ShardmakerError):
    """Never raised: ``shardmaker.verify.verify`` returns its problems (the CLI exits 1 on any)."""


__getattr__ = deprecation.module_getattr(
    __name__, {"VerifyError": ("the problems list that shardmaker.verify.verify returns", _VerifyError)}
)
