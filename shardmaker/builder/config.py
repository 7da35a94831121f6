"""What a build is asked for (:class:`BuildConfig`), what it gives back, and the names it writes."""

from __future__ import annotations

import dataclasses
import re

from shardmaker import deprecation
from shardmaker.builder.clipplan import ClipOptions
from shardmaker.builder.sample import SampleConfig
from shardmaker.builder.sources import Skipped, lr_name_pattern
from shardmaker.errors import OnError

STATE_DIR = "_build"
WRITER_REVISION = 4  # bump when the bytes written for the same inputs change (3: xxh3_64 in {key}.json; 4: probe)
SHARD_FILE = re.compile(r"^shard-(?:\d{4}-)?\d{6}\.tar$")


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    hr_src: str | tuple[str, ...]  # a folder; several folders or brace patterns of files (keys prefixed)
    out: str
    lr_srcs: tuple[str, ...] = ()
    lr_pattern: str | None = None  # how LR files are named: '{stem}_LRBI_x{s}'; None: same stem or stem + x{s}
    sample: SampleConfig = dataclasses.field(default_factory=lambda: SampleConfig(scales=(4,)))
    shard_size: int = 256 * 10**6
    max_samples: int | None = None
    workers: int = 1
    seed: int = 0
    part: tuple[int, int] | None = None  # (index, count)
    on_error: OnError = OnError.FAIL
    overwrite: bool = False
    progress: bool = True
    clips: ClipOptions | None = None  # CLIPS is a folder of clips (frame folders, videos): samples are clip segments
    strict_resume: bool = False  # resume only over sources whose content hash is unchanged (reads them all once)
    from_index: str | None = None  # build --from IDX: the samples of an index of image files (hr_src: its HR root)
    skip_errors: dataclasses.InitVar[bool | None] = None  # deprecated: on_error=OnError.SKIP

    def __post_init__(self, skip_errors: bool | None) -> None:
        if skip_errors is not None:
            deprecation.warn("BuildConfig(skip_errors=...)", "BuildConfig(on_error=OnError.SKIP)", stacklevel=4)
            object.__setattr__(self, "on_error", OnError.SKIP if skip_errors else OnError.FAIL)
        object.__setattr__(self, "on_error", OnError(self.on_error))
        if self.lr_pattern is not None:
            lr_name_pattern(self.lr_pattern)
            if not self.lr_srcs:
                raise ValueError("--lr-pattern names the files of --lr folders; give at least one --lr")
        if self.shard_size < 4096:
            raise ValueError(f"--shard-size must be at least 4096 bytes, got {self.shard_size}")
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"--max-samples must be >= 1, got {self.max_samples}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.part is not None and not (0 <= self.part[0] < self.part[1]):
            raise ValueError(f"--part I/N needs 0 <= I < N, got {self.part[0]}/{self.part[1]}")


@dataclasses.dataclass
class BuildResult:
    manifest_path: str
    samples: int
    shards: int
    bytes: int
    reused_shards: int
    skipped: list[Skipped]
    seconds: float
    complete: bool  # False for a part: run `shardmaker merge` once every part is done
    manifest_url: str = ""  # manifest_path as a URL (s3://bucket/...; local paths stay plain)
    ignored: list[str] = dataclasses.field(default_factory=list)  # source files that are not images (notes.txt)
    dropped: list[Skipped] = dataclasses.field(default_factory=list)  # samples under --min-valid (not errors)
    clips: int = 0  # a clip build (--clips): the source clips this build (or part) wrote; 0 otherwise


def shard_name(index: int, part: tuple[int, int] | None) -> str:
    return f"shard-{index:06d}.tar" if part is None else f"shard-{part[0]:04d}-{index:06d}.tar"


def part_manifest_name(part: tuple[int, int]) -> str:
    return f"manifest.part-{part[0]:04d}-of-{part[1]:04d}.json"
