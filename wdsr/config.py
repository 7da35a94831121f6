"""``DatasetConfig``: every option of an ``SRDataset``, keyword-only, validated once, enums inside."""

from __future__ import annotations

import dataclasses
import enum
import os
from typing import Any

import numpy as np

from shardmaker import format as fmt
from shardmaker.errors import OnError, brief
from wdsr.bounds import check_number
from wdsr.degrade import draw_arrays, registry
from wdsr.pipeline.checks import Verify
from wdsr.pipeline.clips import ClipConfig
from wdsr.pipeline.epoch import StreamConfig
from wdsr.pipeline.patches import PatchConfig
from wdsr.pipeline.read import Fetch, ReadConfig
from wdsr.pipeline.sample import LrMode
from wdsr.store.remote import Retry


class Split(str, enum.Enum):
    TRAIN = "train"
    VAL = "val"


# The range of every number an SRDataset takes: one rule, used here and by ``wdsr train`` for its
# flags and config files (in the flags' words). Seeds: what numpy's SeedSequence, torch.manual_seed
# and wdsr.seeds all accept; sizes in bytes; the rest generous but finite (no value reaches numpy's
# int64 or an allocation of its own size).
LIMITS: dict[str, tuple[int, int]] = {
    "scale": (1, 64),
    "patch_size": (1, 1 << 16),
    "patches_per_image": (1, 1 << 16),
    "batch_size": (1, 1 << 16),
    "shuffle_buffer": (0, 1 << 24),
    "seed": (0, 2**63 - 1),
    "min_patch_std": (0, 65535),
    "max_tries": (1, 10**6),
    "tile": (1, 1 << 20),
    "tile_overlap": (0, 1 << 20),
    "max_pixels": (1, 1 << 48),
    "read_ahead": (0, 1024),
    "cache_limit": (1, 1 << 60),
    "decoded_cache_limit": (1, 1 << 60),
}
MAX_PATH_CHARS = 4096  # a folder or URL setting longer than this is refused (PATH_MAX)


def _check_types(c: DatasetConfig) -> None:
    """Every field of the right type and in range (a wrong type raises here, never later in a worker)."""
    optional = ("min_patch_std", "tile", "cache_limit", "decoded_cache_limit")
    for name, (lo, hi) in LIMITS.items():
        value = getattr(c, name)
        if value is None and name in optional:
            continue
        checked = check_number(name, value, lo, hi, integer=name != "min_patch_std")
        object.__setattr__(c, name, checked)
    for name in ("augment", "return_keys"):
        if not isinstance(getattr(c, name), bool):
            raise ValueError(f"{name} must be True or False, got {brief(getattr(c, name))}")
    for name in ("cache_dir", "decoded_cache"):
        value = getattr(c, name)
        if value is not None and (not isinstance(value, (str, os.PathLike)) or len(os.fspath(value)) > MAX_PATH_CHARS):
            raise ValueError(f"{name} must be a folder path of at most {MAX_PATH_CHARS} characters, got {brief(value)}")
    if not isinstance(c.retry, Retry):
        raise ValueError(f"retry must be a wdsr.Retry, got {brief(c.retry)}")
    object.__setattr__(c, "lr", LrMode.of(c.lr))
    if c.clip is not None and not isinstance(c.clip, ClipConfig):
        raise ValueError(f"clip must be a wdsr.ClipConfig, got {brief(c.clip)}")
    if c.degrade is not None:
        _check_degrade(c)


def _check_degrade(c: DatasetConfig) -> None:
    """``degrade=``: a wdsr.degrade config whose patch and scale are the dataset's, for training."""
    d: Any = c.degrade
    if type(d) not in registry.CONFIGS:  # an instance of one of the models' configs
        raise ValueError(f"degrade must be a {registry.config_names()} (or None), got {brief(d)}")
    name = type(d).__name__
    if c.split is not Split.TRAIN:
        raise ValueError("degrade= makes training pairs; validate on stored LR or lr='bicubic' (split='val' without degrade=)")
    if c.lr is not LrMode.STORED:
        raise ValueError(f"degrade= makes the LR on the device; lr='{c.lr.value}' is another way to make it: give one of them")
    if c.clip is not None:
        raise ValueError("degrade= of clip datasets is not there yet (degradations per frame)")
    if c.scale != d.scale:
        raise ValueError(f"scale={c.scale} but degrade={name}(scale={d.scale}): give the same scale to both")
    if c.patch_size != d.gt_size:
        raise ValueError(
            f"patch_size={c.patch_size} but degrade={name}(gt_size={d.gt_size}): the HR patch is the degradation's "
            f"input, give the same size to both (patch_size={d.gt_size})"
        )
    draw_arrays(d, np.random.default_rng(0), c.patch_size)  # a patch too small for its kernels: refused here, not in a worker


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    """What an ``SRDataset`` streams and how. Strings are accepted for the enums (the CLI's
    spelling) and turned into them here; everything else about a run (world, epoch, workers,
    position) belongs to the loader, not to this."""

    scale: int = 4
    patch_size: int = 192  # HR side of a patch; a multiple of scale
    patches_per_image: int = 16  # k: patches cut from each decoded pair per epoch
    batch_size: int = 16
    shuffle_buffer: int = 1024  # patches waiting per worker; <= 1: no shuffling
    augment: bool = True  # one of the 8 dihedral transforms per patch
    seed: int = 0
    split: Split = Split.TRAIN
    on_error: OnError = OnError.FAIL
    min_patch_std: float | None = None  # reject flatter HR patches (e.g. black endoscope borders)
    max_tries: int = 10
    verify: Verify = Verify.XXH3
    tile: int | None = None  # val: LR tile side; None = whole images
    tile_overlap: int = 8
    return_keys: bool = False
    max_pixels: int = fmt.DEFAULT_MAX_PIXELS  # HR pixels; checked from the header, before decoding
    # reading (remote datasets)
    retry: Retry = Retry()
    read_ahead: int = 1
    fetch: Fetch = Fetch.RANGES
    cache_dir: str | None = None
    cache_limit: int | None = None
    # node-wide decoded pairs (wdsr.store.decoded): e.g. /dev/shm/wdsr; the limit in bytes (None: all)
    decoded_cache: str | None = None
    decoded_cache_limit: int | None = None
    # video clips (shardmaker build --clips): windows of frames instead of patches of images
    clip: ClipConfig | None = None
    # LR: "stored" (the dataset's), or made per patch from HR MATLAB-exactly: "bicubic" (matlab), "bicubic-uint8"
    lr: LrMode = LrMode.STORED
    # degradations made on the device (wdsr.degrade): batches are (hr, params) for wdsr.Degrader(cfg)
    degrade: Any = None

    def __post_init__(self) -> None:
        for name, kind in (("split", Split), ("on_error", OnError), ("verify", Verify), ("fetch", Fetch)):
            value = getattr(self, name)
            try:
                if not isinstance(value, str) or len(value) > 64:  # an enum's own lookup repr()s what it is given
                    raise ValueError
                object.__setattr__(self, name, kind(value))
            except ValueError:
                raise ValueError(f"{name} must be one of {', '.join(m.value for m in kind)}, got {brief(value)}") from None
        _check_types(self)
        if self.tile is not None and not 0 <= self.tile_overlap < self.tile:
            raise ValueError(f"tile_overlap must be in [0, tile), got {self.tile_overlap} for tile {self.tile}")
        if self.split is Split.TRAIN:
            self.patch_config()

    def patch_config(self) -> PatchConfig:
        return PatchConfig(self.scale, self.patch_size, self.augment, self.min_patch_std, self.max_tries)

    def stream_config(self) -> StreamConfig:
        return StreamConfig(
            self.patch_config(), self.patches_per_image, self.batch_size, self.shuffle_buffer, self.seed, self.return_keys
        )

    def read_config(self) -> ReadConfig:
        return ReadConfig(self.retry, self.read_ahead, self.fetch, self.cache_dir, self.cache_limit)

    @classmethod
    def from_options(cls, base: DatasetConfig | None = None, **options: Any) -> DatasetConfig:
        """``base`` (or the defaults) with ``options`` replaced; an unknown name is a TypeError naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown SRDataset option {unknown[0]!r}; the options are: {', '.join(sorted(known))}")
        options = {k: v for k, v in options.items() if not (k == "retry" and v is None)}
        return dataclasses.replace(base, **options) if base is not None else cls(**options)
