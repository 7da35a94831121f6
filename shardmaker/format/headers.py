"""Image member headers (PNG IHDR, QOI), read and checked before any pixel is decoded.

A member's header says how large its decode will be; a PNG of 30000x30000 grey pixels fits in
under 1 MB of file. So sizes, channels and depth are checked against the manifest, the scale and
a pixel limit first, and a sample that fails never reaches a decoder.
"""

from __future__ import annotations

import dataclasses
import struct

from shardmaker.format.manifest import pair_fits

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
QOI_MAGIC = b"qoif"
DEFAULT_MAX_PIXELS = 1 << 28  # 268 M pixels: 16384 x 16384
_PNG_COLOUR = {0: "grey", 2: "RGB", 3: "palette", 4: "grey+alpha", 6: "RGBA"}


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


def image_header(data: bytes | memoryview, ext: str) -> ImageHeader:
    if ext == "png":
        return png_header(data)
    if ext == "qoi":
        return qoi_header(data)
    raise HeaderError(f"no decoder for .{ext} members")


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
