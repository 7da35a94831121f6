"""Error types. Every message names the file, shard or key and what is wrong with it."""

from __future__ import annotations

from typing import Any


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


class VerifyError(ShardmakerError):
    """A shard set does not match its manifest."""
