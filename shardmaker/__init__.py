"""shardmaker: pack HR/LR super-resolution pairs into verified, deterministic tar shards.

For Python users, the same work as the command line::

    import shardmaker
    result = shardmaker.build(shardmaker.BuildConfig(hr_src="photos/", out="shards/"))  # x4, MATLAB-exact LR
    shardmaker.build(shardmaker.BuildConfig("photos/", "x234/", sample=shardmaker.SampleConfig(scales=(2, 3, 4))))
    shardmaker.merge("shards/")                      # after parts built with BuildConfig(part=(i, n))
    shardmaker.index("other/{000..009}.tar", "other/", shardmaker.IndexConfig(hr="jpg", lr={4: "x4.jpg"}))
    problems = shardmaker.verify("shards/", deep=True)  # [] when every check passed
    manifest = shardmaker.load("shards/")            # the checked manifest.json

The house: ``format/`` (the one door to shard bytes), ``imaging/`` (codecs, PNG, MATLAB resize),
``builder/`` (build and merge), ``index`` (foreign shards), ``verify``, ``cli``. Public modules for
other packages (``wdsr``): ``shardmaker.format``, ``shardmaker.imaging``, ``shardmaker.storage``,
``shardmaker.errors``, ``shardmaker.deprecation``, ``shardmaker.commandline``; each names its ``__all__``.
"""

from typing import Any

from shardmaker import deprecation, errors
from shardmaker.builder import BuildConfig, BuildResult, SampleConfig, build, merge
from shardmaker.builder.clips import natural_key
from shardmaker.builder.sources import hr_stem_of, lr_name_pattern
from shardmaker.builder.video import VIDEO_EXTENSIONS, video_frames, video_info
from shardmaker.errors import BuildError, InputError, OnError, ShardmakerError
from shardmaker.format import Manifest, ManifestError, load
from shardmaker.index import IndexConfig, IndexResult, index
from shardmaker.verify import verify
from shardmaker.version import __version__

__all__ = [
    "BuildConfig",
    "BuildError",
    "BuildResult",
    "IndexConfig",
    "IndexResult",
    "InputError",
    "Manifest",
    "ManifestError",
    "OnError",
    "SampleConfig",
    "ShardmakerError",
    "VIDEO_EXTENSIONS",
    "build",
    "hr_stem_of",
    "index",
    "load",
    "lr_name_pattern",
    "merge",
    "natural_key",
    "__version__",
    "verify",
    "video_frames",
    "video_info",
]

# module paths of the flat layout (before 0.2), served for one release with a warning
deprecation.alias_modules(
    {
        "shardmaker._compat": "shardmaker.deprecation",
        "shardmaker.compat": "shardmaker.deprecation",  # until 0.3: the module's name said too little
        "shardmaker.clikit": "shardmaker.commandline",
        **{f"shardmaker.{m}": f"shardmaker.imaging.{m}" for m in ("codecs", "png", "resize")},
        **{f"shardmaker.{m}": f"shardmaker.builder.{m}" for m in ("outdir", "sources", "sample", "writer")},
    }
)


def __getattr__(name: str) -> Any:  # deprecated names, served with a warning
    if name == "VerifyError":
        return errors.__getattr__(name)
    raise AttributeError(f"module 'shardmaker' has no attribute {name!r}")
