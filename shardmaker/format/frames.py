"""The size an encoded image declares before any pixel of it is decoded: JPEG (SOF), PNG (IHDR),
WebP (VP8/VP8L/VP8X), JPEG 2000 (SIZ, raw codestream or JP2 boxes) and JPEG XL (SizeHeader, raw or
in its container).

A decoder allocates what the header says; 40 bytes can say 30000x30000. So every member and every
TIFF segment is measured here first, and its declared frame checked against what it must be (the
manifest's size, a segment's box) before the decoder sees it. ``headers`` adds the member rules.
"""

from __future__ import annotations

import dataclasses
import enum
import struct

__all__ = ["Frame", "FrameCodec", "HeaderError", "declared_frame"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_COMPONENTS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}  # colour type -> decoded samples (palette decodes to RGB)


class HeaderError(ValueError):
    """A member whose header is not what the format allows; the caller adds shard and key."""


class FrameCodec(enum.Enum):
    JPEG = "jpeg"
    PNG = "png"
    WEBP = "webp"
    JPEG2000 = "jpeg2000"
    JPEGXL = "jpegxl"


@dataclasses.dataclass(frozen=True)
class Frame:
    """Declared ``width x height``; ``components`` and ``precision`` (bits) where the header says them (0: not read)."""

    width: int
    height: int
    components: int = 0
    precision: int = 0
    alpha: bool = False

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1:
            raise HeaderError(f"an image of {self.width}x{self.height} pixels")


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers (not DHT, JPG, DAC)


def jpeg_frame(data: bytes | memoryview) -> Frame | None:
    """A JPEG's frame header, walking the marker segments; None when the data ends (or the scan
    starts) before one is found."""
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
            return None
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            raise HeaderError(f"JPEG segment of length {length} at byte {i}")
        if marker in _SOF:
            if i + 10 > n:
                return None
            depth, h, w, comps = data[i + 4], (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8], data[i + 9]
            if not w or not h:  # 0 height: "defined by DNL", a size no header check can bound
                raise HeaderError(f"JPEG of {w}x{h} pixels")
            return Frame(w, h, comps, depth)
        i += 2 + length
    return None


def png_frame(data: bytes | memoryview) -> Frame:
    if len(data) < 33 or bytes(data[:8]) != PNG_SIGNATURE or bytes(data[8:16]) != b"\0\0\0\x0dIHDR":
        raise HeaderError("not a PNG (no IHDR header)")
    w, h, depth, ctype = struct.unpack(">IIBB", data[16:26])
    if not w or not h:
        raise HeaderError(f"PNG of {w}x{h} pixels")
    return Frame(w, h, _PNG_COMPONENTS.get(ctype, 4), depth, ctype in (4, 6))


def webp_frame(data: bytes | memoryview) -> Frame:
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
    if not w or not h:
        raise HeaderError(f"WebP of {w}x{h} pixels")
    return Frame(w, h, 4 if alpha else 3, 8, alpha)


def _boxes(data: bytes | memoryview, start: int = 0) -> dict[bytes, tuple[int, int]]:
    """ISO base media boxes (JP2, JPEG XL container) at the top level: type -> (payload start, end); the first of each."""
    out: dict[bytes, tuple[int, int]] = {}
    i, n = start, len(data)
    while i + 8 <= n:
        size, kind = struct.unpack(">I4s", data[i : i + 8])
        head = 8
        if size == 1:
            if i + 16 > n:
                break
            size, head = struct.unpack(">Q", data[i + 8 : i + 16])[0], 16
        elif size == 0:
            size = n - i
        if size < head:
            raise HeaderError(f"a box of {size} bytes at byte {i}")
        out.setdefault(kind, (i + head, min(i + size, n)))
        i += size
    return out


def j2k_frame(data: bytes | memoryview) -> Frame:
    """A JPEG 2000 image's SIZ marker segment, from a raw codestream or a JP2 file's ``jp2c`` box."""
    at = 0
    if bytes(data[:4]) != b"\xff\x4f\xff\x51":
        box = _boxes(data).get(b"jp2c")
        if box is None:
            raise HeaderError("not a JPEG 2000 image (no codestream)")
        at = box[0]
    siz = bytes(data[at : at + 42])
    if len(siz) < 42 or siz[:4] != b"\xff\x4f\xff\x51":
        raise HeaderError("not a JPEG 2000 image (no SIZ marker)")
    xs, ys, xo, yo = struct.unpack(">IIII", siz[8:24])
    comps = struct.unpack(">H", siz[40:42])[0]
    first = bytes(data[at + 42 : at + 43])
    if xs <= xo or ys <= yo or not comps or not first:
        raise HeaderError(f"JPEG 2000 SIZ of {xs - xo}x{ys - yo} pixels, {comps} components")
    return Frame(xs - xo, ys - yo, comps, (first[0] & 0x7F) + 1)


class _Bits:
    """JPEG XL's bit reader: least significant bit first."""

    def __init__(self, data: bytes) -> None:
        self.value, self.pos, self.size = int.from_bytes(data, "little"), 0, 8 * len(data)

    def u(self, n: int) -> int:
        if self.pos + n > self.size:
            raise HeaderError("JPEG XL size header is truncated")
        v = (self.value >> self.pos) & ((1 << n) - 1)
        self.pos += n
        return v

    def size_field(self, small: bool) -> int:
        if small:
            return (self.u(5) + 1) * 8
        return 1 + self.u((9, 13, 18, 30)[self.u(2)])


_JXL_RATIOS = {1: (1, 1), 2: (12, 10), 3: (4, 3), 4: (3, 2), 5: (16, 9), 6: (5, 4), 7: (2, 1)}
_JXL_CONTAINER = b"\0\0\0\x0cJXL \r\n\x87\n"


def jxl_frame(data: bytes | memoryview) -> Frame:
    """A JPEG XL image's SizeHeader (the first fields of its codestream, raw or in a ``jxlc``/``jxlp`` box)."""
    at = 0
    if bytes(data[:12]) == _JXL_CONTAINER:
        boxes = _boxes(data, 12)
        if b"jxlc" in boxes:
            at = boxes[b"jxlc"][0]
        elif b"jxlp" in boxes:
            at = boxes[b"jxlp"][0] + 4  # a partial codestream box starts with its index
        else:
            raise HeaderError("not a JPEG XL image (a container without a codestream)")
    if bytes(data[at : at + 2]) != b"\xff\x0a":
        raise HeaderError("not a JPEG XL image (no codestream signature)")
    bits = _Bits(bytes(data[at + 2 : at + 12]))
    small = bool(bits.u(1))
    height = bits.size_field(small)
    ratio = bits.u(3)
    if ratio:
        num, den = _JXL_RATIOS[ratio]
        width = height * num // den
    else:
        width = bits.size_field(small)
    return Frame(width, height)


_READERS = {FrameCodec.PNG: png_frame, FrameCodec.WEBP: webp_frame, FrameCodec.JPEG2000: j2k_frame, FrameCodec.JPEGXL: jxl_frame}


def declared_frame(data: bytes | memoryview, codec: FrameCodec) -> Frame:
    """The frame ``data`` declares in its ``codec``'s header: a ``HeaderError`` when it has none."""
    if codec is FrameCodec.JPEG:
        frame = jpeg_frame(data)
        if frame is None:
            raise HeaderError("JPEG without a frame header before its image data")
        return frame
    return _READERS[codec](data)
