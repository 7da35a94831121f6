"""Error types. Every message names the file, shard or key and what is wrong with it."""

from __future__ import annotations

import enum
from typing import Any

from shardmaker import compat

__all__ = ["BuildError", "ImageDataError", "InputError", "OnError", "ShardmakerError"]


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


__getattr__ = compat.module_getattr(
    __name__, {"VerifyError": ("the problems list that shardmaker.verify.verify returns", _VerifyError)}
)
