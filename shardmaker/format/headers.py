"""Image member headers (PNG IHDR, QOI), read and checked before any pixel is decoded.

A member's header says how large its decode will be; a PNG of 30000x30000 grey pixels fits in
under 1 MB of file. So sizes, channels and depth are checked against the manifest, the scale and
a pixel limit first, and a sample that fails never reaches a decoder.
"""

from __future__ import annotations

import dataclasses
import struct

from shardmaker.format.schema import pair_fits

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
QOI_MAGIC = b"qoif"
DEFAULT_MAX_PIXELS = 1 << 28  # 268 M pixels: 16384 x 16384
_PNG_COLOUR = {0: "grey", 2: "RGB", 3: "palette", 4: "grey+alpha", 6: "RGBA"}
HEAD_BYTES = 1 << 20  # a member's first bytes that hold its header (a JPEG's frame header may follow 64 KiB segments)
# The largest member an image of N pixels can honestly be: its raw pixels (at the codec's widest:
# 16-bit RGB PNG, QOI's 5-byte RGBA op, ...) times a factor for encoding overhead, plus slack for
# metadata (EXIF, ICC, text chunks). Anything larger is not an image of that size, and is never read whole.
MEMBER_FACTOR = 2
MEMBER_SLACK = 16 << 20
_WIDEST = {"png": 6, "qoi": 5, "jpg": 3, "jpeg": 3, "webp": 4}  # bytes per pixel at the codec's widest


class HeaderError(ValueError):
    """A member whose header is not what the format allows; the caller adds shard and key."""


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
    if len(data) < 33 or bytes(data[:8]) != PNG_SIGNATURE or bytes(data[8:16]) != b"\0\0\0\x0dIHDR":
        raise HeaderError("not a PNG (no IHDR header)")
    w, h, depth, ctype = struct.unpack(">IIBB", data[16:26])
    if ctype not in (0, 2):
        raise HeaderError(f"PNG colour type {_PNG_COLOUR.get(ctype, ctype)}: image members are grey or RGB only")
    if depth not in (8, 16):
        raise HeaderError(f"PNG bit depth {depth}: image members are 8- or 16-bit")
    if not w or not h:
        raise HeaderError(f"PNG of {w}x{h} pixels")
    return ImageHeader(w, h, 1 if ctype == 0 else 3, depth)


def qoi_header(data: bytes | memoryview) -> ImageHeader:
    if len(data) < 14 + 8 or bytes(data[:4]) != QOI_MAGIC:
        raise HeaderError("not a QOI image (no qoif header)")
    w, h, channels = struct.unpack(">IIB", data[4:13])
    if channels != 3:
        raise HeaderError(f"QOI with {channels} channels: QOI members are 8-bit RGB only")
    if not w or not h:
        raise HeaderError(f"QOI of {w}x{h} pixels")
    return ImageHeader(w, h, 3, 8)


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers (not DHT, JPG, DAC)


def jpeg_header(data: bytes | memoryview) -> ImageHeader:
    """Size, components and precision from a JPEG's frame header, walking the marker segments."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        raise HeaderError("not a JPEG (no SOI marker)")
    i = 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            raise HeaderError(f"not a JPEG (no marker at byte {i})")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        if marker in (0xD9, 0xDA):
            break
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            raise HeaderError(f"JPEG segment of length {length} at byte {i}")
        if marker in _SOF:
            if i + 10 > n:
                break
            depth, h, w, comps = data[i + 4], (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8], data[i + 9]
            if depth != 8:
                raise HeaderError(f"JPEG of {depth}-bit precision: JPEG members are 8-bit")
            if comps not in (1, 3):
                raise HeaderError(f"JPEG with {comps} components (CMYK?): image members are grey or RGB only")
            if not w or not h:
                raise HeaderError(f"JPEG of {w}x{h} pixels")
            return ImageHeader(w, h, comps, 8)
        i += 2 + length
    if i + 4 > n and n >= HEAD_BYTES:
        raise HeaderError(f"JPEG without a frame header in its first {n} bytes")
    raise HeaderError("not a JPEG (no frame header before the image data)")


def webp_header(data: bytes | memoryview) -> ImageHeader:
    """Size from a WebP's first chunk (lossy VP8, lossless VP8L or extended VP8X)."""
    head = bytes(data[:30])
    if len(head) < 30 or head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        raise HeaderError("not a WebP image (no RIFF/WEBP header)")
    chunk = head[12:16]
    if chunk == b"VP8 ":
        if head[23:26] != b"\x9d\x01\x2a":
            raise HeaderError("not a WebP image (bad VP8 frame header)")
        w, h = struct.unpack("<HH", head[26:30])
        w, h, alpha = w & 0x3FFF, h & 0x3FFF, False
    elif chunk == b"VP8L":
        if head[20] != 0x2F:
            raise HeaderError("not a WebP image (bad VP8L signature)")
        bits = struct.unpack("<I", head[21:25])[0]
        w, h, alpha = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, bool((bits >> 28) & 1)
    elif chunk == b"VP8X":
        flags = head[20]
        if flags & 0x02:
            raise HeaderError("animated WebP: image members are single images")
        w = int.from_bytes(head[24:27], "little") + 1
        h = int.from_bytes(head[27:30], "little") + 1
        alpha = bool(flags & 0x10)
    else:
        raise HeaderError(f"WebP with a {chunk!r} first chunk")
    if alpha:
        raise HeaderError("WebP with alpha: image members are grey or RGB only")
    if not w or not h:
        raise HeaderError(f"WebP of {w}x{h} pixels")
    return ImageHeader(w, h, 3, 8)


_HEADERS = {"png": png_header, "qoi": qoi_header, "jpg": jpeg_header, "jpeg": jpeg_header, "webp": webp_header}


def image_header(data: bytes | memoryview, ext: str) -> ImageHeader:
    """The header of a member by its codec or name (``png``, ``x4.jpg``), checked before any decode."""
    parse = _HEADERS.get(ext.rsplit(".", 1)[-1].lower())
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
