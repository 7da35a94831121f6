"""Image member headers (PNG IHDR, QOI), read and checked before any pixel is decoded.

A member's header says how large its decode will be; a PNG of 30000x30000 grey pixels fits in
under 1 MB of file. So sizes, channels and depth are checked against the manifest, the scale and
a pixel limit first, and a sample that fails never reaches a decoder.
"""

from __future__ import annotations

import dataclasses
import struct

from shardmaker.format.frames import PNG_SIGNATURE as PNG_SIGNATURE
from shardmaker.format.frames import HeaderError as HeaderError
from shardmaker.format.frames import jpeg_frame, png_frame, webp_frame
from shardmaker.format.schema import MIXED, pair_fits

QOI_MAGIC = b"qoif"
DEFAULT_MAX_PIXELS = 1 << 28  # 268 M pixels: 16384 x 16384
_PNG_COLOUR = {0: "grey", 2: "RGB", 3: "palette", 4: "grey+alpha", 6: "RGBA"}
HEAD_BYTES = 1 << 20  # a member's first bytes that hold its header (a JPEG's frame header may follow 64 KiB segments)
# The largest member an image of N pixels can honestly be: its raw pixels (at the codec's widest:
# 16-bit RGB PNG, QOI's 5-byte RGBA op, ...) times a factor for encoding overhead, plus slack for
# metadata (EXIF, ICC, text chunks). Anything larger is not an image of that size, and is never read whole.
MEMBER_FACTOR = 2
MEMBER_SLACK = 16 << 20
_WIDEST = {"png": 6, "qoi": 5, "jpg": 3, "jpeg": 3, "webp": 4, MIXED: 6}  # bytes per pixel at the codec's widest


@dataclasses.dataclass(frozen=True)
class ImageHeader:
    width: int
    height: int
    channels: int
    bit_depth: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def png_header(data: bytes | memoryview) -> ImageHeader:
    f = png_frame(data)
    ctype = data[25]
    if ctype not in (0, 2):
        raise HeaderError(f"PNG colour type {_PNG_COLOUR.get(ctype, ctype)}: image members are grey or RGB only")
    if f.precision not in (8, 16):
        raise HeaderError(f"PNG bit depth {f.precision}: image members are 8- or 16-bit")
    return ImageHeader(f.width, f.height, f.components, f.precision)


def qoi_header(data: bytes | memoryview) -> ImageHeader:
    if len(data) < 14 + 8 or bytes(data[:4]) != QOI_MAGIC:
        raise HeaderError("not a QOI image (no qoif header)")
    w, h, channels = struct.unpack(">IIB", data[4:13])
    if channels != 3:
        raise HeaderError(f"QOI with {channels} channels: QOI members are 8-bit RGB only")
    if not w or not h:
        raise HeaderError(f"QOI of {w}x{h} pixels")
    return ImageHeader(w, h, 3, 8)


def jpeg_header(data: bytes | memoryview) -> ImageHeader:
    """Size, components and precision from a JPEG's frame header, walking the marker segments."""
    f = jpeg_frame(data)
    if f is None:
        if len(data) >= HEAD_BYTES:
            raise HeaderError(f"JPEG without a frame header in its first {len(data)} bytes")
        raise HeaderError("not a JPEG (no frame header before the image data)")
    if f.precision != 8:
        raise HeaderError(f"JPEG of {f.precision}-bit precision: JPEG members are 8-bit")
    if f.components not in (1, 3):
        raise HeaderError(f"JPEG with {f.components} components (CMYK?): image members are grey or RGB only")
    return ImageHeader(f.width, f.height, f.components, 8)


def webp_header(data: bytes | memoryview) -> ImageHeader:
    """Size from a WebP's first chunk (lossy VP8, lossless VP8L or extended VP8X)."""
    f = webp_frame(data)
    if f.alpha:
        raise HeaderError("WebP with alpha: image members are grey or RGB only")
    return ImageHeader(f.width, f.height, 3, 8)


_HEADERS = {"png": png_header, "qoi": qoi_header, "jpg": jpeg_header, "jpeg": jpeg_header, "webp": webp_header}


def sniff(data: bytes | memoryview) -> str:
    """The codec a member's first bytes declare (``png``, ``jpg``, ``webp``, ``qoi``): how a member
    of a side that mixes formats (``hr.img``) is read; ``img`` (no decoder) when none."""
    head = bytes(data[:12])
    if head.startswith(PNG_SIGNATURE):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "webp"
    return "qoi" if head.startswith(QOI_MAGIC) else MIXED


def image_header(data: bytes | memoryview, ext: str) -> ImageHeader:
    """The header of a member by its codec or name (``png``, ``x4.jpg``), checked before any decode."""
    ext = ext.rsplit(".", 1)[-1].lower()
    parse = _HEADERS.get(sniff(data) if ext == MIXED else ext)
    if parse is None:
        raise HeaderError(f"no decoder for .{ext} members")
    return parse(data)


def member_limit(ext: str, pixels: int, head: ImageHeader | None = None) -> int:
    """The most bytes a ``.{ext}`` member of at most ``pixels`` pixels may have (of ``head``'s size and
    kind when its header is known): a larger one is refused before it is read."""
    if head is None:
        per = _WIDEST.get(ext.rsplit(".", 1)[-1].lower(), 6)
    else:
        pixels, per = head.pixels, max(head.channels, 3 if ext.endswith("qoi") else 1) * head.bit_depth // 8 + 2
    return MEMBER_FACTOR * pixels * per + MEMBER_SLACK


def check_pair(
    hr: ImageHeader, lr: ImageHeader, scale: int, expected_hr: tuple[int, int] | None = None, max_pixels: int = DEFAULT_MAX_PIXELS
) -> None:
    """The pair the headers describe is one the manifest promised, within ``max_pixels``."""
    if expected_hr is not None and (hr.width, hr.height) != tuple(expected_hr):
        raise HeaderError(f"HR header says {hr.width}x{hr.height}, the manifest says {expected_hr[0]}x{expected_hr[1]}")
    if hr.pixels > max_pixels:
        raise HeaderError(
            f"HR of {hr.width}x{hr.height} = {hr.pixels} pixels is over max_pixels={max_pixels} "
            "(possible decompression bomb; raise max_pixels if the data is genuine)"
        )
    if not pair_fits((hr.height, hr.width), (lr.height, lr.width), scale):
        raise HeaderError(f"HR {hr.width}x{hr.height} is not {scale} x LR {lr.width}x{lr.height} (wrong scale?)")
    if (hr.channels, hr.bit_depth) != (lr.channels, lr.bit_depth):
        raise HeaderError(f"HR is {hr.bit_depth}-bit x{hr.channels}, LR {lr.bit_depth}-bit x{lr.channels}")
