"""``DatasetConfig``: every option of an ``SRDataset``, keyword-only, validated once, enums inside."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from shardmaker import format as fmt
from shardmaker.errors import OnError
from wdsr.pipeline.decode import Verify
from wdsr.pipeline.epoch import StreamConfig
from wdsr.pipeline.patches import PatchConfig
from wdsr.pipeline.read import Fetch, ReadConfig
from wdsr.store.remote import Retry


class Split(str, enum.Enum):
    TRAIN = "train"
    VAL = "val"


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

    def __post_init__(self) -> None:
        for name, kind in (("split", Split), ("on_error", OnError), ("verify", Verify), ("fetch", Fetch)):
            value = getattr(self, name)
            try:
                object.__setattr__(self, name, kind(value))
            except ValueError:
                raise ValueError(f"{name} must be one of {', '.join(m.value for m in kind)}, got {value!r}") from None
        if self.patches_per_image < 1 or self.batch_size < 1:
            raise ValueError("patches_per_image and batch_size must be >= 1")
        if self.tile is not None and not 0 <= self.tile_overlap < self.tile:
            raise ValueError(f"tile_overlap must be in [0, tile), got {self.tile_overlap} for tile {self.tile}")
        if self.read_ahead < 0:
            raise ValueError(f"read_ahead must be >= 0, got {self.read_ahead}")
        if self.decoded_cache_limit is not None and self.decoded_cache_limit <= 0:
            raise ValueError(f"decoded_cache_limit must be a positive number of bytes, got {self.decoded_cache_limit}")
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
