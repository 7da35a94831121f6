"""Image codecs: read source images, encode/decode shard members (PNG in ``shardmaker.imaging.png``, QOI).

Arrays are ``HxW`` (grey) or ``HxWx3`` (RGB), dtype uint8 or uint16. Decoding never runs
anything but an image decoder: no pickles, no arbitrary objects.
"""

from __future__ import annotations

import enum
import io
import warnings

import numpy as np
import qoi
from PIL import Image

from shardmaker.errors import ImageDataError
from shardmaker.format.headers import DEFAULT_MAX_PIXELS, HeaderError, ImageHeader, image_header, sniff
from shardmaker.imaging import png
from shardmaker.imaging.png import SIGNATURE as PNG_SIGNATURE
from shardmaker.imaging.png import header as png_header

# Pillow's own bomb guard (Image.MAX_IMAGE_PIXELS) is left as the user set it: we never change it
# for the process. Our limit (check_pixels, --max-pixels) is checked from the header first.
_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".tif": "TIFF", ".tiff": "TIFF", ".bmp": "BMP", ".webp": "WEBP"}

SOURCE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp")


class Codec(str, enum.Enum):
    """How image members are stored; the value is the member extension."""

    PNG = "png"
    QOI = "qoi"


def check_pixels(w: int, h: int, max_pixels: int) -> None:
    if w * h > max_pixels:
        raise ImageDataError(
            f"{w}x{h} = {w * h} pixels is over the limit of {max_pixels} "
            "(possible decompression bomb; raise --max-pixels if the image is genuine)"
        )


def _normalise(arr: np.ndarray, drop_alpha: bool) -> np.ndarray:
    """Grey+alpha / RGBA -> grey / RGB when allowed; otherwise an error."""
    if arr.ndim == 3 and arr.shape[2] in (2, 4):
        if not drop_alpha:
            raise ImageDataError("has an alpha channel; pass --drop-alpha to ignore it")
        arr = arr[:, :, : arr.shape[2] - 1]
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] != 3):
        raise ImageDataError(f"unsupported pixel layout {arr.shape}")
    return np.ascontiguousarray(arr)


def _decode_pillow(data: bytes) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Corrupt EXIF data": harmless for the pixels
            im = Image.open(io.BytesIO(data))
            im.load()
    except Image.DecompressionBombError:
        raise ImageDataError(
            f"over Pillow's own limit of {2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels "
            "(PIL.Image.MAX_IMAGE_PIXELS, which wdsr never changes); PNG sources have no such limit"
        ) from None
    except Exception as exc:
        raise ImageDataError(f"corrupt, truncated or unknown image ({exc})") from None
    if im.mode in ("I;16", "I;16B", "I;16L"):
        return np.asarray(im, dtype=np.uint16)
    if im.mode == "I":
        arr = np.asarray(im)
        if arr.min() < 0 or arr.max() > 65535:
            raise ImageDataError("32-bit integer image with values outside 0..65535")
        return arr.astype(np.uint16)
    if im.mode in ("RGB", "L", "RGBA", "LA"):
        return np.asarray(im)
    if im.mode in ("P", "PA"):
        has_alpha = im.mode == "PA" or "transparency" in im.info
        return np.asarray(im.convert("RGBA" if has_alpha else "RGB"))
    if im.mode in ("1", "CMYK", "YCbCr", "LAB", "HSV"):
        return np.asarray(im.convert("L" if im.mode == "1" else "RGB"))
    raise ImageDataError(f"unsupported image mode {im.mode!r}")


def image_size(data: bytes, ext: str | None = None) -> tuple[int, int]:
    """``(width, height)`` from the header alone, without decoding pixels; with ``ext`` (".jpg"),
    content of another format than the name says is an error."""
    want = _FORMATS.get("." + ext.lower().lstrip(".")) if ext else None  # ".jpg" or "jpg"
    head = png_header(data)
    if head is not None:
        if want not in (None, "PNG"):
            raise ImageDataError(f"the content is a PNG, not the {want} its name says")
        return head[0], head[1]
    if want == "PNG":
        raise ImageDataError("not a readable image: no PNG signature, though the name says .png")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a header cut short warns; the caller may retry whole
            im = Image.open(io.BytesIO(data), formats=[want] if want else None)
            bits = getattr(im, "tag_v2", {}).get(258) if im.format == "TIFF" else None
            if isinstance(bits, tuple) and len(bits) >= 3 and max(bits) > 8:
                raise ImageDataError("16-bit colour TIFF is not supported; convert it to 16-bit PNG")
            return im.size
    except ImageDataError:
        raise
    except Exception as exc:
        raise ImageDataError(f"not a readable image ({exc})") from None


def load_source(
    data: bytes, drop_alpha: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS, ext: str | None = None
) -> np.ndarray:
    """Decode a source image (PNG/JPEG/TIFF/BMP/WebP, 8/16-bit, grey/RGB) after its header's size is checked
    against ``max_pixels`` (nothing is decoded before)."""
    if not data:
        raise ImageDataError("empty file")
    w, h = image_size(data, ext)
    check_pixels(w, h, max_pixels)
    arr = png.decode(data) if data.startswith(PNG_SIGNATURE) else _decode_pillow(data)
    return _normalise(arr, drop_alpha)


# ---- shard members -------------------------------------------------------------------------


def encode(arr: np.ndarray, codec: Codec, png_level: int = 1) -> bytes:
    """Encode an ``HxW``/``HxWx3`` uint8/uint16 array losslessly."""
    codec = Codec(codec)
    if codec is Codec.QOI:
        if arr.dtype != np.uint8 or arr.ndim != 3:
            raise ImageDataError("QOI stores 8-bit RGB only; use --codec png for grey or 16-bit images")
        return bytes(qoi.encode(np.ascontiguousarray(arr)))
    if arr.dtype not in (np.uint8, np.uint16) or arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] != 3):
        raise ImageDataError(f"cannot store a {arr.dtype} array of shape {arr.shape} as PNG")
    return png.encode(arr, png_level)


def _decode_jpeg(data: bytes) -> np.ndarray:
    """libjpeg-turbo through simplejpeg where it is installed (the ``jpeg`` extra), else Pillow."""
    try:
        import simplejpeg
    except ImportError:
        return _decode_pillow(data)
    try:
        h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        limit = 2 * (Image.MAX_IMAGE_PIXELS or 0)
        if limit and h * w > limit:  # the same bound as Pillow's, checked from the header before decoding
            raise ImageDataError(f"{w}x{h} is over Pillow's own limit of {limit} pixels (PIL.Image.MAX_IMAGE_PIXELS)")
        grey = str(colorspace).lower() in ("gray", "grey")
        arr = simplejpeg.decode_jpeg(data, colorspace="GRAY" if grey else "RGB")
    except ValueError as exc:
        raise ImageDataError(f"corrupt or truncated JPEG ({exc})") from None
    return arr[:, :, 0] if arr.ndim == 3 and arr.shape[2] == 1 else arr


# the decoder of a member, by the last part of its extension ("x4.jpg" -> "jpg"); anything else is
# refused: a member is never unpickled or loaded as code, whatever its name says
_MEMBER_DECODERS = {"jpg": _decode_jpeg, "jpeg": _decode_jpeg, "webp": _decode_pillow}
MEMBER_EXTENSIONS = ("png", "qoi", "jpg", "jpeg", "webp", "img")


def decode(data: bytes | memoryview, ext: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode a shard member by its extension: ``png`` (8/16-bit), ``qoi`` (straight from a view),
    ``jpg``/``jpeg`` (libjpeg-turbo, else Pillow), ``webp``; ``x4.jpg`` counts as ``jpg``; ``img`` (a
    side of an index that mixes formats) is decoded as the format its bytes declare.

    The header is read and checked first (grey or RGB, 8 or 16 bits, at most ``max_pixels``), so a
    member that would decode large is refused before any pixel is decoded; the pixels must then be
    what the header declared."""
    ext = ext.rsplit(".", 1)[-1].lower()
    if ext not in MEMBER_EXTENSIONS:
        raise ImageDataError(f"unknown member extension {ext!r} (decoders: {', '.join(MEMBER_EXTENSIONS)})")
    if ext == "img":
        ext = sniff(data)
        if ext == "img":
            raise ImageDataError("not a PNG, JPEG, WebP or QOI file (its first bytes)")
    try:
        head = image_header(data, ext)
    except HeaderError as exc:
        raise ImageDataError(str(exc)) from None
    check_pixels(head.width, head.height, max_pixels)
    arr = _decode_member(data, ext)
    want = (head.height, head.width) if head.channels == 1 else (head.height, head.width, head.channels)
    if arr.shape != want or arr.dtype != (np.uint16 if head.bit_depth == 16 else np.uint8):
        raise ImageDataError(f"decodes to {arr.dtype} {list(arr.shape)}, not the {_kind(head)} its header declares")
    return arr


def _kind(head: ImageHeader) -> str:
    return f"{head.width}x{head.height} {head.bit_depth}-bit {'grey' if head.channels == 1 else 'RGB'}"


def _decode_member(data: bytes | memoryview, ext: str) -> np.ndarray:
    if ext == Codec.QOI.value:
        try:
            return qoi.decode(data)
        except Exception as exc:
            raise ImageDataError(f"corrupt QOI data ({exc})") from None
    if ext == Codec.PNG.value:
        return _normalise(png.decode(data), drop_alpha=False)
    return _normalise(_MEMBER_DECODERS[ext](data if isinstance(data, bytes) else bytes(data)), drop_alpha=False)
