"""shardmaker: pack HR/LR super-resolution pairs into verified, deterministic tar shards.

The house: ``format/`` (the one door to shard bytes), ``imaging/`` (codecs, PNG, MATLAB resize),
``builder/`` (build and merge), ``index`` (foreign shards), ``verify``, ``cli``. Public modules for
other packages (``wdsr``): ``shardmaker.format``, ``shardmaker.imaging``, ``shardmaker.storage``,
``shardmaker.errors``, ``shardmaker.compat``, ``shardmaker.clikit``; each names its ``__all__``.
"""

from typing import Any

from shardmaker import compat
from shardmaker.errors import BuildError, InputError, OnError, ShardmakerError

__all__ = ["BuildError", "InputError", "OnError", "ShardmakerError"]
__version__ = "0.1.0"

# module paths of the flat layout (before 0.2), served for one release with a warning
compat.alias_modules(
    {
        "shardmaker._compat": "shardmaker.compat",
        **{f"shardmaker.{m}": f"shardmaker.imaging.{m}" for m in ("codecs", "png", "resize")},
        **{f"shardmaker.{m}": f"shardmaker.builder.{m}" for m in ("outdir", "sources", "sample", "writer")},
        "shardmaker.build": "shardmaker.builder",  # the build module until 0.2
    }
)


def __getattr__(name: str) -> Any:  # deprecated names, served with a warning
    from shardmaker import errors

    if name == "VerifyError":
        return errors.__getattr__(name)
    raise AttributeError(f"module 'shardmaker' has no attribute {name!r}")
