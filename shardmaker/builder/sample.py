"""Per-sample work, run in build worker processes: read, check, make LR, encode, describe."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import posixpath
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash
from fsspec.core import url_to_fs

from shardmaker import compat, storage
from shardmaker.builder.sources import Pair, Skipped
from shardmaker.errors import InputError, OnError, brief
from shardmaker.format import tario
from shardmaker.format import tiles as tl
from shardmaker.format.manifest import hr_member, lr_member, pair_fits
from shardmaker.format.schema import TILED
from shardmaker.imaging import codecs
from shardmaker.imaging.codecs import Codec, ImageDataError
from shardmaker.imaging.resize import ResizeMethod, downscale
from shardmaker.imaging.tiled import encode_tiled

AUTO_TILE_PIXELS = 8_000_000  # --tiles auto: images over this (a 4K frame is 8.3 M) are stored tiled


class LrMethod(str, enum.Enum):
    """Where a sample's LR images come from; the value is what the manifest and ``--lr-method`` say."""

    MATLAB = ResizeMethod.MATLAB.value  # generated: MATLAB imresize on im2double input
    MATLAB_UINT8 = ResizeMethod.MATLAB_UINT8.value  # generated: MATLAB imresize on uint8 input
    PROVIDED = "provided"  # read from the LR folders given with --lr

    @property
    def resize(self) -> ResizeMethod | None:
        return None if self is LrMethod.PROVIDED else ResizeMethod(self.value)


@dataclasses.dataclass(frozen=True)
class SampleConfig:
    """Everything that decides a sample's bytes (and nothing that does not)."""

    scales: tuple[int, ...]  # generated scales; ignored when LR images are provided
    codec: Codec = Codec.PNG
    png_level: int = 1
    lr_method: LrMethod = LrMethod.MATLAB
    mod_crop: bool = True
    drop_alpha: bool = False
    max_pixels: int = 1 << 28
    storage_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    tiles: int | str = "off"  # "off", "auto" (images over AUTO_TILE_PIXELS) or a tile side in HR pixels

    def __post_init__(self) -> None:
        if self.tiles not in ("off", "auto") and not (
            type(self.tiles) is int and tl.MIN_TILE <= self.tiles <= tl.MAX_TILE and not any(self.tiles % s for s in self.scales)
        ):
            raise ValueError(
                f"tiles must be off, auto or a side in [{tl.MIN_TILE}, {tl.MAX_TILE}] that every scale divides, "
                f"got {brief(self.tiles)} for scales {list(self.scales)}"
            )
        try:
            object.__setattr__(self, "lr_method", LrMethod(self.lr_method))
        except ValueError:
            raise ValueError(f"lr_method must be one of {', '.join(m.value for m in LrMethod)}, got {self.lr_method!r}") from None
        if not 0 <= self.png_level <= 9:
            raise ValueError(f"png level must be 0..9, got {self.png_level}")
        if self.lr_method is not LrMethod.PROVIDED:
            if not self.scales or any(s < 2 for s in self.scales):
                raise ValueError(f"scales must be integers >= 2, got {self.scales}")


@dataclasses.dataclass(frozen=True)
class EncodedSample:
    key: str
    tar_bytes: bytes  # the sample's tar members, ready to append to a shard
    hr_size: tuple[int, int]


def _read(url: str, storage_options: dict[str, Any]) -> bytes:
    """A source file's bytes; a local one must be a regular file (``InputError`` naming it if it is a
    FIFO, device or folder: never blocks)."""
    try:
        fs, path = url_to_fs(url, **storage_options)
        with storage.open_input(fs, path) as f:
            return f.read()
    except OSError as exc:
        raise InputError(url, f"cannot read ({exc})") from None


def _load(url: str, cfg: SampleConfig) -> np.ndarray:
    try:
        return codecs.load_source(_read(url, cfg.storage_options), cfg.drop_alpha, cfg.max_pixels, posixpath.splitext(url)[1])
    except ImageDataError as exc:
        raise InputError(url, str(exc)) from None


def _describe(arr: np.ndarray) -> tuple[int, int]:
    return (16 if arr.dtype == np.uint16 else 8), (1 if arr.ndim == 2 else arr.shape[2])


def _lr_images(pair: Pair, hr: np.ndarray, cfg: SampleConfig) -> dict[int, tuple[np.ndarray, str | None]]:
    """scale -> (LR array, LR source relative path or None when generated)."""
    h, w = hr.shape[:2]
    out: dict[int, tuple[np.ndarray, str | None]] = {}
    if cfg.lr_method is LrMethod.PROVIDED:
        for s, url, rel in pair.lr:
            lr = _load(url, cfg)
            lh, lw = lr.shape[:2]
            if not pair_fits((h, w), (lh, lw), s) or ((h, w) != (s * lh, s * lw) and not cfg.mod_crop):
                raise InputError(url, f"LR {lw}x{lh} does not fit HR {w}x{h} at scale {s}")
            if _describe(lr) != _describe(hr):
                raise InputError(url, f"LR is {_describe(lr)} (bit depth, channels) but HR is {_describe(hr)}")
            out[s] = (lr, rel)
        return out
    method = cfg.lr_method.resize
    assert method is not None
    if method is ResizeMethod.MATLAB_UINT8 and hr.dtype != np.uint8:
        raise InputError(pair.hr, "16-bit image: --lr-method matlab-uint8 takes 8-bit images only (use matlab)")
    for s in sorted(cfg.scales):
        ch, cw = (h // s) * s, (w // s) * s
        if ch == 0 or cw == 0:
            raise InputError(pair.hr, f"{w}x{h} is smaller than the scale {s}")
        if (ch, cw) != (h, w) and not cfg.mod_crop:
            raise InputError(pair.hr, f"{w}x{h} is not a multiple of the scale {s} (allow with --mod-crop)")
        out[s] = (downscale(hr[:ch, :cw], s, method), None)
    return out


def tile_side(cfg: SampleConfig, hr_hw: tuple[int, int], scales: Sequence[int]) -> int | None:
    """The tile side an image of ``hr_hw`` is stored with (None: whole): ``--tiles auto`` tiles
    images over ``AUTO_TILE_PIXELS`` with the smallest side >= 256 that every scale divides."""
    if cfg.tiles == "off":
        return None
    if cfg.tiles == "auto":
        return tl.tile_side(scales) if hr_hw[0] * hr_hw[1] > AUTO_TILE_PIXELS else None
    side = int(cfg.tiles)
    if any(side % s for s in scales):  # provided LR: the scales come from the LR folders
        raise ValueError(f"--tiles {side} is not a multiple of every scale {list(scales)}")
    return side


def _encode(img: np.ndarray, cfg: SampleConfig, tile: int | None) -> bytes:
    return codecs.encode(img, cfg.codec, cfg.png_level) if tile is None else encode_tiled(img, tile, cfg.codec, cfg.png_level)


def encode_sample(pair: Pair, cfg: SampleConfig) -> EncodedSample:
    """Build one sample's tar members: ``{key}.json``, ``{key}.hr.ext``, ``{key}.lr_x{s}.ext`` (ext
    ``tiles`` for an image stored tiled: :func:`tile_side`)."""
    hr = _load(pair.hr, cfg)
    h, w = hr.shape[:2]
    lrs = _lr_images(pair, hr, cfg)
    tile = tile_side(cfg, (h, w), sorted(lrs))
    ext = Codec(cfg.codec).value if tile is None else TILED
    members: dict[str, bytes] = {}
    try:
        members[hr_member(ext)] = _encode(hr, cfg, tile)
        for s, (lr, _) in lrs.items():
            members[lr_member(s, ext)] = _encode(lr, cfg, None if tile is None else tile // s)
    except ImageDataError as exc:
        raise InputError(pair.hr, str(exc)) from None
    bit_depth, channels = _describe(hr)
    meta: dict[str, Any] = {
        "key": pair.key,
        "source": pair.hr_rel,
        "hr_size": [w, h],
        "scales": sorted(lrs),
        "bit_depth": bit_depth,
        "channels": channels,
        "lr_method": cfg.lr_method.value,
        "lr_sizes": {str(s): [lr.shape[1], lr.shape[0]] for s, (lr, _) in lrs.items()},
        "hr_crop": {str(s): [s * lr.shape[1], s * lr.shape[0]] for s, (lr, _) in lrs.items()},
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in members.items()},
        "xxh3_64": {name: xxhash.xxh3_64_hexdigest(data) for name, data in members.items()},  # fast check when streaming
    }
    if tile is not None:
        meta["tiles"] = tile  # HR tile side; each LR member's is tile // s
    if cfg.lr_method is LrMethod.PROVIDED:
        meta["lr_sources"] = {str(s): rel for s, (_, rel) in lrs.items()}
    blob = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    parts = [tario.member_bytes(f"{pair.key}.json", blob)]
    parts += [tario.member_bytes(f"{pair.key}.{name}", data) for name, data in members.items()]
    return EncodedSample(pair.key, b"".join(parts), (w, h))


def encode_or_skip(pair: Pair, cfg: SampleConfig, on_error: OnError) -> EncodedSample | Skipped:
    """``encode_sample``, turning bad input into a ``Skipped`` record when skipping."""
    try:
        return encode_sample(pair, cfg)
    except InputError as exc:
        if on_error is not OnError.SKIP:
            raise
        return Skipped(exc.path, exc.reason)


__getattr__ = compat.module_getattr(__name__, {"PROVIDED": ("shardmaker.builder.sample.LrMethod.PROVIDED", LrMethod.PROVIDED)})
