"""shardmaker: pack HR/LR super-resolution pairs into verified, deterministic tar shards."""

from typing import Any

from shardmaker.errors import BuildError, InputError, OnError, ShardmakerError

__all__ = ["BuildError", "InputError", "OnError", "ShardmakerError"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:  # deprecated names, served with a warning
    from shardmaker import errors

    if name == "VerifyError":
        return errors.__getattr__(name)
    raise AttributeError(f"module 'shardmaker' has no attribute {name!r}")
