"""Per-sample work, run in build worker processes: read, check, make LR, encode, describe."""

from __future__ import annotations

import contextlib
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
from shardmaker.builder.regions import DEFAULT_REGION, Region, region_lr, valid_share
from shardmaker.builder.sources import Pair, Skipped
from shardmaker.errors import InputError, OnError, brief
from shardmaker.format import tario
from shardmaker.format import tiles as tl
from shardmaker.format.manifest import hr_member, lr_member, pair_fits
from shardmaker.format.schema import TILED
from shardmaker.imaging import codecs
from shardmaker.imaging.codecs import Codec, ImageDataError
from shardmaker.imaging.regions import TiffFallback, TiffRegions, is_tiff
from shardmaker.imaging.resize import ResizeMethod
from shardmaker.imaging.tiled import encode_tiled

MIN_REGION, MAX_REGION = 512, 1 << 14  # --region bounds (HR pixels per side): a region read is at most 16384^2
AUTO_TILE_PIXELS = 8_000_000  # --tiles auto: images over this (a 4K frame is 8.3 M) are stored tiled


class LrMethod(str, enum.Enum):
    """Where a sample's LR images come from; the value is what the manifest and ``--lr-method`` say."""

    MATLAB = ResizeMethod.MATLAB.value  # generated: MATLAB imresize on im2double input
    MATLAB_UINT8 = ResizeMethod.MATLAB_UINT8.value  # generated: MATLAB imresize on uint8 input
    PROVIDED = "provided"  # read from the LR folders given with --lr
    NONE = "none"  # HR only (--hr-only): the stream makes LR per patch (SRDataset(lr="bicubic"))

    @property
    def resize(self) -> ResizeMethod | None:
        return None if self in (LrMethod.PROVIDED, LrMethod.NONE) else ResizeMethod(self.value)


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
    region: int = DEFAULT_REGION  # images larger than this (HR pixels, either side) become region samples
    min_valid: float = 0.0  # drop samples whose share of non-flat content is below this

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
        if type(self.region) is not int or not MIN_REGION <= self.region <= MAX_REGION:
            raise ValueError(f"region must be a side in [{MIN_REGION}, {MAX_REGION}] HR pixels, got {brief(self.region)}")
        if not (isinstance(self.min_valid, (int, float)) and 0 <= self.min_valid <= 1):
            raise ValueError(f"min_valid must be a share in [0, 1], got {brief(self.min_valid)}")
        if not 0 <= self.png_level <= 9:
            raise ValueError(f"png level must be 0..9, got {self.png_level}")
        if self.lr_method is LrMethod.NONE:
            object.__setattr__(self, "scales", ())
        elif self.lr_method is not LrMethod.PROVIDED:
            if not self.scales or any(s < 2 for s in self.scales):
                raise ValueError(f"scales must be integers >= 2, got {self.scales}")


@dataclasses.dataclass(frozen=True)
class EncodedSample:
    key: str
    tar_bytes: bytes  # the sample's tar members, ready to append to a shard
    hr_size: tuple[int, int]
    tiles: int = 0  # HR tile side; 0: stored whole


class SourceImage:
    """A source image, read whole or by region. A TIFF is read through ``tifffile``, decoding only the
    segments a region touches (a region sample of a slide never holds the whole image); any other
    format is decoded whole (within ``max_pixels``). A local source must be a regular file
    (``InputError`` naming it if it is a FIFO, device or folder: never blocks)."""

    def __init__(self, url: str, cfg: SampleConfig) -> None:
        self.url, self._cfg = url, cfg
        self._f: Any = None
        self._tif: TiffRegions | None = None
        self._pixels: np.ndarray | None = None
        ext = posixpath.splitext(url)[1]
        try:
            fs, path = url_to_fs(url, **cfg.storage_options)
            f = storage.open_input(fs, path)
        except OSError as exc:
            raise InputError(url, f"cannot read ({exc})") from None
        try:
            head = f.read(8)
            f.seek(0)
            if is_tiff(head) and ext.lower() in (".tif", ".tiff"):
                try:
                    self._tif, self._f = TiffRegions(f, cfg.drop_alpha, posixpath.basename(path)), f
                    self.height, self.width = self._tif.height, self._tif.width
                    return
                except TiffFallback:
                    f.seek(0)
            self._pixels = codecs.load_source(f.read(), cfg.drop_alpha, cfg.max_pixels, ext)
            self.height, self.width = self._pixels.shape[:2]
            f.close()
        except ImageDataError as exc:
            self.close(f)
            raise InputError(url, str(exc)) from None
        except OSError as exc:
            self.close(f)
            raise InputError(url, f"cannot read ({exc})") from None
        except BaseException:
            self.close(f)
            raise

    def close(self, f: Any = None) -> None:
        for h in (self._tif, self._f, f):
            if h is not None:
                with contextlib.suppress(Exception):
                    h.close()
        self._tif = self._f = None

    def __enter__(self) -> SourceImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def whole(self) -> np.ndarray:
        if self._pixels is None:
            try:
                codecs.check_pixels(self.width, self.height, self._cfg.max_pixels)
            except ImageDataError as exc:
                raise InputError(self.url, str(exc)) from None
            return self.read(0, 0, self.height, self.width)
        return self._pixels

    def read(self, y: int, x: int, h: int, w: int) -> np.ndarray:
        """The ``h x w`` pixels at ``(y, x)`` (a region sample's: only ``--region`` bounds it, not
        ``max_pixels``, for a TIFF read by region)."""
        if self._pixels is None:
            assert self._tif is not None
            try:
                return self._tif.read(y, x, h, w)
            except TiffFallback:  # segments that need imagecodecs, missing here: the whole TIFF as Pillow reads it
                self._f.seek(0)
                try:
                    self._pixels = codecs.load_source(self._f.read(), self._cfg.drop_alpha, self._cfg.max_pixels, ".tif")
                except ImageDataError as exc:
                    raise InputError(self.url, str(exc)) from None
            except ImageDataError as exc:
                raise InputError(self.url, str(exc)) from None
        return self._pixels[y : y + h, x : x + w]


def _load(url: str, cfg: SampleConfig) -> np.ndarray:
    with SourceImage(url, cfg) as img:
        return img.whole()


def describe_kind(arr: np.ndarray) -> tuple[int, int]:
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
            if describe_kind(lr) != describe_kind(hr):
                raise InputError(url, f"LR is {describe_kind(lr)} (bit depth, channels) but HR is {describe_kind(hr)}")
            out[s] = (lr, rel)
        return out
    if cfg.lr_method is LrMethod.NONE:
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
        out[s] = (whole_lr(hr, s, method), None)
    return out


def whole_lr(img: np.ndarray, s: int, method: ResizeMethod) -> np.ndarray:
    """``downscale(mod_crop(img), s)``, MATLAB-exact, made in row bands (bounded float64 passes)."""
    h, w = img.shape[:2]
    return region_lr(lambda y, x, hh, ww: img[y : y + hh, x : x + ww], (h, w), Region(0, 0, h, w), s, method)


def tile_side(cfg: SampleConfig, hr_hw: tuple[int, int], scales: Sequence[int]) -> int | None:
    """The tile side an image of ``hr_hw`` is stored with (None: whole): ``--tiles auto`` tiles
    images over ``AUTO_TILE_PIXELS`` with the smallest side >= 256 that every scale divides."""
    if cfg.tiles == "off":
        return None
    if cfg.tiles == "auto":
        return tl.tile_side(scales or (1,)) if hr_hw[0] * hr_hw[1] > AUTO_TILE_PIXELS else None
    side = int(cfg.tiles)
    if any(side % s for s in scales):  # provided LR: the scales come from the LR folders
        raise ValueError(f"--tiles {side} is not a multiple of every scale {list(scales)}")
    return side


def encode_image(img: np.ndarray, cfg: SampleConfig, tile: int | None) -> bytes:
    return codecs.encode(img, cfg.codec, cfg.png_level) if tile is None else encode_tiled(img, tile, cfg.codec, cfg.png_level)


def _region_images(
    pair: Pair, src: SourceImage, cfg: SampleConfig
) -> tuple[np.ndarray, dict[int, tuple[np.ndarray, str | None]]] | Skipped:
    """A region sample's HR and LR images, read by region (the whole source is never held): LR made
    MATLAB-exactly from the region and a margin (equal to the crop of the whole image's LR), or the
    matching region of each provided LR image. ``Skipped`` (``valid`` set) for a region under
    ``--min-valid``."""
    r, (W, H) = pair.region, pair.image_size or pair.hr_size
    assert r is not None
    if (src.width, src.height) != (W, H):
        raise InputError(pair.hr, f"is {src.width}x{src.height} now, {W}x{H} when the build planned its regions")
    if cfg.lr_method is LrMethod.PROVIDED:
        hr = src.read(r.y, r.x, r.h, r.w)
        if (dropped := _dropped(pair, hr, cfg)) is not None:
            return dropped
        lrs: dict[int, tuple[np.ndarray, str | None]] = {}
        for s, url, rel in pair.lr:
            with SourceImage(url, cfg) as lsrc:
                lh, lw = (min(r.y + r.h, s * lsrc.height) - r.y) // s, (min(r.x + r.w, s * lsrc.width) - r.x) // s
                if not pair_fits((H, W), (lsrc.height, lsrc.width), s) or lh < 1 or lw < 1:
                    raise InputError(url, f"LR {lsrc.width}x{lsrc.height} does not fit HR {W}x{H} at scale {s}")
                lr = np.ascontiguousarray(lsrc.read(r.y // s, r.x // s, lh, lw))
            if describe_kind(lr) != describe_kind(hr):
                raise InputError(url, f"LR is {describe_kind(lr)} (bit depth, channels) but HR is {describe_kind(hr)}")
            lrs[s] = (lr, rel)
        return hr, lrs
    if cfg.lr_method is LrMethod.NONE:  # HR only: a region sample is an image of its own
        hr = src.read(r.y, r.x, r.h, r.w)
        dropped = _dropped(pair, hr, cfg)
        return (hr, {}) if dropped is None else dropped
    method = cfg.lr_method.resize
    assert method is not None
    m = 3 * max(cfg.scales)  # region_lr's margin at the largest scale
    by, bx = max(0, r.y - m), max(0, r.x - m)
    buf = src.read(by, bx, min(H, r.y + r.h + m) - by, min(W, r.x + r.w + m) - bx)
    hr = buf[r.y - by : r.y - by + r.h, r.x - bx : r.x - bx + r.w]
    if (dropped := _dropped(pair, hr, cfg)) is not None:
        return dropped
    if method is ResizeMethod.MATLAB_UINT8 and hr.dtype != np.uint8:
        raise InputError(pair.hr, "16-bit image: --lr-method matlab-uint8 takes 8-bit images only (use matlab)")

    def read(y: int, x: int, h: int, w: int) -> np.ndarray:
        return buf[y - by : y - by + h, x - bx : x - bx + w]

    lrs = {}
    for s in sorted(cfg.scales):
        if (H % s or W % s) and not cfg.mod_crop:
            raise InputError(pair.hr, f"{W}x{H} is not a multiple of the scale {s} (allow with --mod-crop)")
        try:
            lrs[s] = (region_lr(read, (H, W), r, s, method), None)
        except ValueError as exc:  # a region thinner than the scale (an image of a few pixels on one side)
            raise InputError(pair.hr, str(exc)) from None
    return hr, lrs


def _dropped(pair: Pair, hr: np.ndarray, cfg: SampleConfig) -> Skipped | None:
    """A sample under ``--min-valid``: its share of non-flat content is too small (not an error)."""
    if cfg.min_valid <= 0:
        return None
    share = valid_share(hr)
    if share >= cfg.min_valid:
        return None
    what = "region" if pair.region is not None else "image"
    return Skipped(pair.hr, f"{what} is {share:.1%} content, under --min-valid {cfg.min_valid:g}", pair.key, round(share, 4))


def encode_sample(pair: Pair, cfg: SampleConfig) -> EncodedSample | Skipped:
    """Build one sample's tar members: ``{key}.json``, ``{key}.hr.ext``, ``{key}.lr_x{s}.ext`` (ext
    ``tiles`` for an image stored tiled: :func:`tile_side`). A region sample (``pair.region``) is
    read by region. A ``Skipped`` with ``valid`` set for a sample under ``--min-valid``."""
    with SourceImage(pair.hr, cfg) as src:
        if pair.region is None:
            hr = src.whole()
            if (dropped := _dropped(pair, hr, cfg)) is not None:
                return dropped
            lrs = _lr_images(pair, hr, cfg)
        else:
            got = _region_images(pair, src, cfg)
            if isinstance(got, Skipped):
                return got
            hr, lrs = got
    h, w = hr.shape[:2]
    tile = tile_side(cfg, (h, w), sorted(lrs))
    ext = Codec(cfg.codec).value if tile is None else TILED
    members: dict[str, bytes] = {}
    try:
        members[hr_member(ext)] = encode_image(hr, cfg, tile)
        for s, (lr, _) in lrs.items():
            members[lr_member(s, ext)] = encode_image(lr, cfg, None if tile is None else tile // s)
    except ImageDataError as exc:
        raise InputError(pair.hr, str(exc)) from None
    bit_depth, channels = describe_kind(hr)
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
        **({} if pair.region is None else {"region": dataclasses.asdict(pair.region), "image_size": list(pair.image_size or ())}),
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
    del hr, lrs, members
    return EncodedSample(pair.key, b"".join(parts), (w, h), tile or 0)


def encode_or_skip(pair: Pair, cfg: SampleConfig, on_error: OnError) -> EncodedSample | Skipped:
    """``encode_sample``, turning bad input into a ``Skipped`` record when skipping."""
    try:
        if pair.clip is not None:
            from shardmaker.builder.clips import encode_segment

            return encode_segment(pair, cfg)  # type: ignore[no-any-return]
        return encode_sample(pair, cfg)
    except InputError as exc:
        if on_error is not OnError.SKIP:
            raise
        return Skipped(exc.path, exc.reason)


__getattr__ = compat.module_getattr(__name__, {"PROVIDED": ("shardmaker.builder.sample.LrMethod.PROVIDED", LrMethod.PROVIDED)})
