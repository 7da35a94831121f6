"""What image and clip samples share, in build worker processes: the settings that decide a sample's
bytes (:class:`SampleConfig`), source images read whole or by region (:class:`SourceImage`), LR made
MATLAB-exactly (:func:`whole_lr`), the rule an LR image is held to (:func:`check_lr`), and encoding."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import posixpath
from collections.abc import Sequence
from typing import Any

import numpy as np
from fsspec.core import url_to_fs

from shardmaker import storage
from shardmaker.builder.regions import DEFAULT_REGION, Region, region_lr
from shardmaker.errors import InputError, MissingExtraError, ShardmakerError, brief, unreadable
from shardmaker.format import pair_fits
from shardmaker.format import tiles as tl
from shardmaker.imaging import codecs
from shardmaker.imaging.codecs import Codec, ImageDataError
from shardmaker.imaging.regions import MissingCodecError, TiffFallback, TiffRegions, is_tiff
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
        except ShardmakerError:
            self.close(f)
            raise
        except Exception as exc:  # noqa: BLE001 - a decoder's own error on a crafted file: the file's error
            self.close(f)
            raise InputError(url, unreadable(exc)) from None
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

    def sparse(self, y: int, x: int, h: int, w: int) -> bool:
        """Whether the region is all sparse TIFF segments (zeros never written): known without a decode."""
        return self._pixels is None and self._tif is not None and self._tif.sparse(y, x, h, w)

    def read(self, y: int, x: int, h: int, w: int) -> np.ndarray:
        """The ``h x w`` pixels at ``(y, x)`` (a region sample's: ``--region`` bounds it; the whole
        image was checked against ``max_pixels`` when its regions were planned)."""
        if self._pixels is None:
            assert self._tif is not None
            try:
                return self._tif.read(y, x, h, w)
            except MissingCodecError as exc:  # segments that need imagecodecs, missing here
                if (y, x, h, w) != (0, 0, self.height, self.width):  # a region: never the whole image instead
                    what = f"{self.url}: reading this TIFF ({exc.compression} segments) region by region"
                    raise MissingExtraError("imagecodecs", what) from None
                self._f.seek(0)  # the whole image was asked for: the whole TIFF as Pillow reads it
                try:
                    self._pixels = codecs.load_source(self._f.read(), self._cfg.drop_alpha, self._cfg.max_pixels, ".tif")
                except ImageDataError as exc:
                    raise InputError(self.url, str(exc)) from None
            except ImageDataError as exc:
                raise InputError(self.url, str(exc)) from None
            except ShardmakerError:
                raise
            except Exception as exc:  # noqa: BLE001 - a decoder's own error on a crafted file: the file's error
                raise InputError(self.url, unreadable(exc)) from None
        return self._pixels[y : y + h, x : x + w]


def load_whole(url: str, cfg: SampleConfig) -> np.ndarray:
    with SourceImage(url, cfg) as img:
        return img.whole()


def describe_kind(arr: np.ndarray) -> tuple[int, int]:
    return (16 if arr.dtype == np.uint16 else 8), (1 if arr.ndim == 2 else arr.shape[2])


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


def check_lr(url: str, hr_hw: tuple[int, int], lr_hw: tuple[int, int], s: int, mod_crop: bool) -> None:
    """The rule a provided LR image (or clip frame) is held to, for image, region and clip samples
    alike: HR is ``s x`` LR, plus less than ``s`` only with ``--mod-crop``; else an ``InputError``
    naming the LR file."""
    (h, w), (lh, lw) = hr_hw, lr_hw
    if not pair_fits((h, w), (lh, lw), s):
        raise InputError(url, f"LR {lw}x{lh} does not fit HR {w}x{h} at scale {s}")
    if (h, w) != (s * lh, s * lw) and not mod_crop:
        raise InputError(url, f"LR {lw}x{lh} does not fit HR {w}x{h} at scale {s} without a mod-crop (allow with --mod-crop)")


def check_kind(url: str, lr: np.ndarray, kind: tuple[int, int]) -> None:
    """A provided LR image is of its HR's kind (bit depth, channels); else an ``InputError`` naming it."""
    if describe_kind(lr) != kind:
        raise InputError(url, f"LR is {describe_kind(lr)} (bit depth, channels) but HR is {kind}")


def check_scale(url: str, hr_hw: tuple[int, int], s: int, mod_crop: bool, what: str = "") -> None:
    """The rule an HR image (or clip frame, ``what=" frames"``) is held to when its LR is made: at least
    ``s`` on each side, and a multiple of ``s`` unless ``--mod-crop``; else an ``InputError`` naming it."""
    h, w = hr_hw
    if h < s or w < s:
        raise InputError(url, f"{w}x{h}{what} is smaller than the scale {s}")
    if (h % s or w % s) and not mod_crop:
        raise InputError(url, f"{w}x{h}{what} is not a multiple of the scale {s} (allow with --mod-crop)")
