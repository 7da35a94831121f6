"""``shardmaker build`` and ``merge``: sources -> deterministic tar shards + manifest.

``config`` (what is asked), ``sources`` (scan and pair), ``sample`` (one pair encoded), ``writer``
(one shard), ``output`` and ``outdir`` (the output folder and its safety rules), ``run`` (the build),
``merge`` (parts joined)."""

from typing import Any

from shardmaker import deprecation
from shardmaker.builder.config import BuildConfig, BuildResult, part_manifest_name, shard_name
from shardmaker.builder.merge import PartsPending, merge, merge_when_ready
from shardmaker.builder.run import build, fingerprint, order_samples
from shardmaker.builder.sample import SampleConfig

__all__ = [
    "BuildConfig",
    "BuildResult",
    "PartsPending",
    "SampleConfig",
    "build",
    "fingerprint",
    "merge",
    "merge_when_ready",
    "order_samples",
    "part_manifest_name",
    "shard_name",
]

__getattr__: Any = deprecation.module_getattr(__name__, {"BuildOptions": ("shardmaker.builder.BuildConfig", BuildConfig)})
