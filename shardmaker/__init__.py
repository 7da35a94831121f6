"""shardmaker: pack HR/LR super-resolution pairs into verified, deterministic tar shards."""

from shardmaker.errors import BuildError, InputError, ShardmakerError, VerifyError

__all__ = ["BuildError", "InputError", "ShardmakerError", "VerifyError"]
__version__ = "0.1.0"
