"""Image codecs: read source images, encode/decode shard members (PNG, QOI).

Arrays are ``HxW`` (grey) or ``HxWx3`` (RGB), dtype uint8 or uint16. Decoding never runs
anything but an image decoder: no pickles, no arbitrary objects.
"""

from __future__ import annotations

import enum
import io
import struct
import warnings
import zlib

import deflate  # libdeflate: inflates a PNG's image data ~1.9x faster than zlib (bench/png_decode.py)
import numpy as np
import pyspng  # libspng: reads 16-bit PNG and is ~1.7x faster than Pillow on 4K images
import qoi
from PIL import Image

# Pillow's own bomb guard (Image.MAX_IMAGE_PIXELS) is left as the user set it: we never change it
# for the process. Our limit (check_pixels, --max-pixels) is checked from the header first.
_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".tif": "TIFF", ".tiff": "TIFF", ".bmp": "BMP", ".webp": "WEBP"}

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SOURCE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp")
# PNG colour type -> channels (0 grey, 2 RGB, 3 palette, 4 grey+alpha, 6 RGBA)
_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}


class Codec(str, enum.Enum):
    """How image members are stored; the value is the member extension."""

    PNG = "png"
    QOI = "qoi"


class ImageDataError(ValueError):
    """Bytes that are not a usable image; the caller adds the file or member name."""


def png_header(data: bytes) -> tuple[int, int, int, int] | None:
    """``(width, height, bit_depth, colour_type)`` from a PNG's IHDR, or None if not a PNG."""
    if len(data) < 29 or not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR":
        return None
    w, h, depth, ctype = struct.unpack(">IIBB", data[16:26])
    return w, h, depth, ctype


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


_STORED = 65535  # the most bytes one stored (uncompressed) deflate block holds
_STORED_HEAD = struct.pack("<BHH", 0, _STORED, _STORED ^ 0xFFFF)
_IEND = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
_FAST_MAX = (1 << 31) - (1 << 20)  # inflated bytes; a PNG chunk holds at most 2**31 - 1


def _inflated_png(data: bytes | memoryview) -> bytes | None:
    """The same PNG with its image data inflated by libdeflate and stored again uncompressed, for
    libspng to unfilter; None where this does not apply and the PNG goes to libspng as it is.

    libspng inflates with zlib, which is most of its time on a 4K photo; libdeflate inflates the
    same stream ~1.9x faster, and libspng reads stored deflate blocks at memory speed. Every chunk
    before the image data is kept, none after it (they carry no pixels). Applies to non-interlaced
    PNGs whose IDAT chunks are one run and inflate to exactly their rows; the Adler-32 and the
    CRC are written anew, so libspng checks the new file as it would any other. Anything else
    (interlaced, a corrupt stream, a truncated file) returns None: libspng then decodes or rejects
    the original, with its own error.
    """
    mv = memoryview(data)
    if len(mv) < 45 or mv[:8] != PNG_SIGNATURE or mv[8:16] != b"\x00\x00\x00\x0dIHDR":
        return None
    w, h, depth, ctype, method, filt, interlace = struct.unpack(">IIBBBBB", mv[16:29])
    if interlace or method or filt or ctype not in _PNG_CHANNELS or depth not in (1, 2, 4, 8, 16) or not w or not h:
        return None
    n = h * (1 + (w * (1 if ctype == 3 else _PNG_CHANNELS[ctype]) * depth + 7) // 8)
    if n > _FAST_MAX:
        return None
    pos, first, end = 33, 0, 0
    idat: list[memoryview] = []
    while pos + 12 <= len(mv):
        length, tag = struct.unpack(">I4s", mv[pos : pos + 8])
        if pos + 12 + length > len(mv):
            return None
        if tag == b"IDAT":
            if idat and pos != end:
                return None  # IDAT chunks not in one run: not a valid PNG, libspng says so
            first = first or pos
            idat.append(mv[pos + 8 : pos + 8 + length])
            end = pos + 12 + length
        elif tag == b"IEND":
            break
        pos += 12 + length
    if not idat:
        return None
    try:
        raw = deflate.zlib_decompress(idat[0] if len(idat) == 1 else b"".join(idat), n)
    except deflate.DeflateError:
        return None
    if len(raw) != n:
        return None
    rows = memoryview(raw)
    full, rest = divmod(n, _STORED)
    stream: list[bytes | memoryview] = [b"\x78\x01"]  # zlib header: deflate, 32K window, no dictionary
    for i in range(full):
        stream += (_STORED_HEAD, rows[i * _STORED : (i + 1) * _STORED])
    stream += (struct.pack("<BHH", 1, rest, rest ^ 0xFFFF), rows[full * _STORED :], struct.pack(">I", deflate.adler32(raw)))
    size = sum(len(part) for part in stream)
    crc = deflate.crc32(b"IDAT")
    for part in stream:
        crc = deflate.crc32(part, crc)
    return b"".join([mv[:first], struct.pack(">I", size), b"IDAT", *stream, struct.pack(">I", crc), _IEND])


def _decode_png(data: bytes | memoryview) -> np.ndarray:
    """PNG bytes -> array with the channels the file declares (alpha kept): libdeflate inflates and
    libspng unfilters where ``_inflated_png`` applies (our shards' PNGs do), libspng alone otherwise."""
    head = png_header(bytes(data[:29]))
    if head is None:
        raise ImageDataError("not a PNG file")
    _, _, depth, ctype = head
    grey_alpha8 = ctype == 4 and depth < 16  # libspng has no 8-bit grey+alpha output: RGBA, then G, A
    try:
        arr = pyspng.load(_inflated_png(data) or bytes(data), "RGBA" if grey_alpha8 else None)
    except Exception as exc:
        raise ImageDataError(f"corrupt or truncated PNG ({exc})") from None
    if grey_alpha8:
        arr = arr[:, :, 1::2]
    elif depth == 16 and ctype in _PNG_CHANNELS:
        # pyspng returns 16-bit images as RGBA/GA; keep the declared channels only.
        want = _PNG_CHANNELS[ctype]
        arr = arr[:, :, :want] if want > 1 else arr[:, :, 0]
    return arr


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
    want = _FORMATS.get(ext.lower()) if ext else None
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


def load_source(data: bytes, drop_alpha: bool = False, max_pixels: int = 1 << 28, ext: str | None = None) -> np.ndarray:
    """Decode a source image (PNG/JPEG/TIFF/BMP/WebP, 8/16-bit, grey/RGB) after a size check."""
    if not data:
        raise ImageDataError("empty file")
    w, h = image_size(data, ext)
    check_pixels(w, h, max_pixels)
    arr = _decode_png(data) if data.startswith(PNG_SIGNATURE) else _decode_pillow(data)
    return _normalise(arr, drop_alpha)


# ---- shard members -------------------------------------------------------------------------


def _png_chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


def _encode_png(arr: np.ndarray, level: int) -> bytes:
    """PNG writer for 8/16-bit grey/RGB: filter "Average" on every row, then deflate.

    Level 1 uses zlib's run-length strategy. On 4K photos this encodes ~3x faster than Pillow at
    level 1, gives smaller files, and decodes ~25% faster (bench/build_bench.py). Levels 2-9
    use zlib's default strategy at that level. The bytes depend only on the pixels and zlib.
    """
    h, w = arr.shape[:2]
    c = 1 if arr.ndim == 2 else arr.shape[2]
    depth = 16 if arr.dtype == np.uint16 else 8
    raw = np.ascontiguousarray(arr, dtype=">u2" if depth == 16 else np.uint8).reshape(h, -1).view(np.uint8)
    bpp = c * depth // 8
    # Average filter: raw - floor((left + up) / 2), neighbours outside the image count as 0.
    pred = np.zeros(raw.shape, np.uint16)
    pred[:, bpp:] = raw[:, :-bpp]
    pred[1:] += raw[:-1]
    pred >>= 1
    rows = np.empty((h, raw.shape[1] + 1), np.uint8)
    rows[:, 0] = 3
    np.subtract(raw, pred, out=rows[:, 1:], casting="unsafe")  # wraps mod 256, as PNG wants
    strategy = zlib.Z_RLE if level == 1 else zlib.Z_DEFAULT_STRATEGY
    comp = zlib.compressobj(level, zlib.DEFLATED, 15, 9, strategy)
    idat = comp.compress(rows.data) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", w, h, depth, 0 if c == 1 else 2, 0, 0, 0)
    return PNG_SIGNATURE + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def encode(arr: np.ndarray, codec: Codec, png_level: int = 1) -> bytes:
    """Encode an ``HxW``/``HxWx3`` uint8/uint16 array losslessly."""
    codec = Codec(codec)
    if codec is Codec.QOI:
        if arr.dtype != np.uint8 or arr.ndim != 3:
            raise ImageDataError("QOI stores 8-bit RGB only; use --codec png for grey or 16-bit images")
        return bytes(qoi.encode(np.ascontiguousarray(arr)))
    if arr.dtype not in (np.uint8, np.uint16) or arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] != 3):
        raise ImageDataError(f"cannot store a {arr.dtype} array of shape {arr.shape} as PNG")
    return _encode_png(arr, png_level)


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
MEMBER_EXTENSIONS = ("png", "qoi", "jpg", "jpeg", "webp")


def decode(data: bytes | memoryview, ext: str) -> np.ndarray:
    """Decode a shard member by its extension: ``png`` (8/16-bit), ``qoi`` (straight from a view),
    ``jpg``/``jpeg`` (libjpeg-turbo, else Pillow), ``webp``; ``x4.jpg`` counts as ``jpg``."""
    ext = ext.rsplit(".", 1)[-1].lower()
    if ext == Codec.QOI.value:
        try:
            return qoi.decode(data)
        except Exception as exc:
            raise ImageDataError(f"corrupt QOI data ({exc})") from None
    if ext == Codec.PNG.value:
        return _normalise(_decode_png(data), drop_alpha=False)
    if ext in _MEMBER_DECODERS:
        return _normalise(_MEMBER_DECODERS[ext](data if isinstance(data, bytes) else bytes(data)), drop_alpha=False)
    raise ImageDataError(f"unknown member extension {ext!r} (decoders: {', '.join(MEMBER_EXTENSIONS)})")
