"""Errors that name the shard and key."""

from __future__ import annotations

from typing import Any

from shardmaker.exitcodes import Unavailable


class SampleError(ValueError):
    """One sample (or a whole shard when ``key`` is None) cannot be used."""

    def __init__(self, shard: str, key: str | None = None, reason: str | None = None) -> None:
        if reason is None:  # one finished message: how torch re-raises a DataLoader worker's error
            super().__init__(shard)
            self.shard, self.key, self.reason = shard, key, shard
            return
        where = shard if key is None else f"{shard} key {key!r}"
        super().__init__(f"{where}: {reason}")
        self.shard, self.key, self.reason = shard, key, reason

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # survive the trip from a DataLoader worker
        return (type(self), (self.shard, self.key, self.reason))


class SampleUnavailable(SampleError, Unavailable):
    """A shard that could not be read because storage stayed unreachable, throttled or failing through
    every retry: not the data's fault; the command exits 69 (shardmaker.exitcodes), trying later may work.
    Built from one message too, so it reaches the trainer from a DataLoader worker as itself."""
