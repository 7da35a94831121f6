"""Large source images read region by region: tiled or stripped TIFF (BigTIFF, OME-TIFF and pyramidal
slides at level 0, GeoTIFF) through ``tifffile``, decoding only the segments a region overlaps, so
a build's memory is bounded by the region it works on, never the whole image.

Compressed segments (deflate, LZW, zstd, JPEG, ...) are decoded by ``tifffile``, with
``imagecodecs`` (the ``tiff`` extra) for all but deflate: without it such a file is one clear
error. Every segment's size, byte count, the size its own codec header declares (JPEG, PNG, WebP,
JPEG 2000, JPEG XL: read before decoding, held to the segment's box) and decoded shape are checked around its
decode; a file ``tifffile`` cannot parse is an :class:`ImageDataError`, never its own exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, BinaryIO, TypeVar

import numpy as np

from shardmaker.errors import ImageDataError
from shardmaker.format.frames import FrameCodec, HeaderError, declared_frame

__all__ = ["MAX_SEGMENT_PIXELS", "MissingCodecError", "TiffFallback", "TiffRegions", "is_tiff"]

T = TypeVar("T")
MAX_SEGMENT_PIXELS = 1 << 26  # one tile or strip: 8192 x 8192
_SIDE = 1 << 20
TIFF_MAGICS = (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+")  # classic and BigTIFF, both byte orders
# TIFF compressions whose segments are whole images of another codec, which decodes to the size its own
# header declares: that header is read and held to the segment's box before the decode. The stream
# codecs (none, LZW, deflate, zstd, LZMA, PackBits) decode into the box itself.
_FRAME_CODECS = {6: FrameCodec.JPEG, 7: FrameCodec.JPEG, 33007: FrameCodec.JPEG, 34892: FrameCodec.JPEG}
_FRAME_CODECS |= {33003: FrameCodec.JPEG2000, 33004: FrameCodec.JPEG2000, 33005: FrameCodec.JPEG2000}
_FRAME_CODECS |= {34712: FrameCodec.JPEG2000, 34933: FrameCodec.PNG, 34927: FrameCodec.WEBP, 50001: FrameCodec.WEBP}
_FRAME_CODECS |= {50002: FrameCodec.JPEGXL, 52546: FrameCodec.JPEGXL}


class TiffFallback(ImageDataError):
    """A TIFF this reader leaves to a whole-image decoder (Pillow): a photometric interpretation
    other than grey or RGB (palette, CMYK, MinIsWhite, ...), or segments that need a codec missing here."""


class MissingCodecError(TiffFallback):
    """A TIFF whose segments need ``imagecodecs`` (the ``tiff`` extra), which is not installed:
    ``compression`` names their codec (``JPEG``, ``LZW``, ...)."""

    def __init__(self, message: str, compression: str = "") -> None:
        super().__init__(message)
        self.compression = compression

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (str(self), self.compression))


def _name(value: Any) -> str:
    """A tag value's enum name, or the number itself (tifffile leaves a value no enum knows an int)."""
    return str(getattr(value, "name", value))


def _as_data_error(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, with any error but ours an :class:`ImageDataError`: tifffile parses tags lazily, and a
    crafted IFD fails there in any type (an unknown enum value, a multi-valued tag where one is expected,
    fewer byte counts than offsets); it is the file's error, never a crash of the build."""
    try:
        return fn(*args)
    except ImageDataError:
        raise
    except Exception as e:  # noqa: BLE001 - tifffile raises many types on crafted files
        raise ImageDataError(f"{what}: not a readable TIFF ({type(e).__name__}: {str(e)[:200]})") from None


def is_tiff(head: bytes) -> bool:
    return head[:4] in TIFF_MAGICS


class TiffRegions:
    """One TIFF's base image (series 0, level 0) as ``height x width [x 3]`` uint8/uint16 pixels
    read by region, from a path or an open binary file (left open). ``drop_alpha`` keeps the colour
    of an RGBA or grey+alpha image."""

    def __init__(self, source: str | BinaryIO, drop_alpha: bool = False, name: str | None = None) -> None:
        import tifffile

        self.path = source if isinstance(source, str) else (name or "TIFF file")
        try:  # an open file goes in as a FileHandle with a name (a descriptor's own name is a number)
            self._tif = tifffile.TiffFile(source if isinstance(source, str) else tifffile.FileHandle(source, name=self.path))
            series = self._tif.series[0]
            level = series.levels[0]
            page = level.keyframe
            self._pages = len(level.pages)
        except Exception as e:  # noqa: BLE001 - tifffile raises many types on crafted files
            raise ImageDataError(f"not a readable TIFF ({type(e).__name__}: {str(e)[:200]})") from None
        try:
            _as_data_error("TIFF tags", self._setup, page, drop_alpha)
        except BaseException:
            self.close()
            raise

    def _setup(self, page: Any, drop_alpha: bool) -> None:
        if self._pages != 1:
            raise ImageDataError(f"TIFF level 0 has {self._pages} pages (planes or a stack): one image is expected")
        photometric = int(page.photometric)
        jpeg_ycbcr = photometric == 6 and int(page.compression) in (6, 7)  # tifffile decodes JPEG YCbCr to RGB
        if photometric not in (1, 2) and not jpeg_ycbcr:
            raise TiffFallback(f"TIFF photometric {_name(page.photometric)}: region reads take grey or RGB only")
        if page.dtype not in (np.uint8, np.uint16):
            raise ImageDataError(f"TIFF of {page.dtype} samples: 8- and 16-bit images only")
        spp = int(page.samplesperpixel)
        if spp not in (1, 2, 3, 4):
            raise ImageDataError(f"TIFF with {spp} samples per pixel: grey or RGB (with alpha) only")
        if spp in (2, 4) and not drop_alpha:
            raise ImageDataError("TIFF with alpha: give --drop-alpha to keep its colour channels")
        self.height, self.width = int(page.imagelength), int(page.imagewidth)
        if not (1 <= self.height <= _SIDE and 1 <= self.width <= _SIDE):
            raise ImageDataError(f"TIFF of {self.width}x{self.height} pixels: sides must be in [1, {_SIDE}]")
        self.channels = 1 if spp <= 2 else 3
        self.bit_depth = 8 * np.dtype(page.dtype).itemsize
        self._page, self._spp = page, spp
        self._separate = int(page.planarconfig) == 2 and spp > 1
        sh, sw = (int(page.tilelength), int(page.tilewidth)) if page.is_tiled else (int(page.rowsperstrip), self.width)
        self._seg = (max(1, min(sh, self.height)), max(1, sw))
        if self._seg[0] * self._seg[1] > MAX_SEGMENT_PIXELS:
            raise ImageDataError(f"TIFF segments of {sw}x{sh} pixels: over {MAX_SEGMENT_PIXELS} (a bomb?)")
        self._grid = (-(-self.height // self._seg[0]), -(-self.width // self._seg[1]))
        per_plane = self._grid[0] * self._grid[1]
        if len(page.dataoffsets) != per_plane * (spp if self._separate else 1):
            raise ImageDataError(f"TIFF lists {len(page.dataoffsets)} segments, its layout has {per_plane}")

    def __enter__(self) -> TiffRegions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._tif.close()

    def sparse(self, y: int, x: int, h: int, w: int) -> bool:
        """Whether every segment the region overlaps is sparse (byte count 0, never written: zeros),
        from the segment table alone: such a region is known flat without decoding anything."""
        (sh, sw), (rows, cols) = self._seg, self._grid
        counts = self._page.databytecounts
        planes = range(self.channels if self._separate else 1)
        return all(
            int(counts[p * rows * cols + r * cols + c]) == 0
            for p in planes
            for r in range(y // sh, (y + h - 1) // sh + 1)
            for c in range(x // sw, (x + w - 1) // sw + 1)
        )

    def read(self, y: int, x: int, h: int, w: int) -> np.ndarray:
        """The ``h x w`` region at ``(y, x)``: HxW (grey) or HxWx3, from the segments it overlaps."""
        if not (0 <= y and 0 <= x and h > 0 and w > 0 and y + h <= self.height and x + w <= self.width):
            raise ValueError(f"{self.path}: region {w}x{h} at ({x}, {y}) is not inside the {self.width}x{self.height} image")
        dtype = np.uint8 if self.bit_depth == 8 else np.uint16
        out = np.zeros((h, w, self.channels), dtype=dtype)
        (sh, sw), (_, cols) = self._seg, self._grid
        planes = range(self._spp if self._separate else 1)
        for plane in planes:
            if self._separate and plane >= self.channels:
                continue  # an alpha plane, dropped
            for r in range(y // sh, (y + h - 1) // sh + 1):
                for c in range(x // sw, (x + w - 1) // sw + 1):
                    i = plane * self._grid[0] * cols + r * cols + c
                    seg = _as_data_error(f"TIFF segment {i}", self._segment, i)
                    ty, tx = r * sh, c * sw
                    y0, x0, y1, x1 = max(y, ty), max(x, tx), min(y + h, ty + sh), min(x + w, tx + sw)
                    part = seg[y0 - ty : y1 - ty, x0 - tx : x1 - tx]
                    if self._separate:
                        out[y0 - y : y1 - y, x0 - x : x1 - x, plane] = part[..., 0]
                    else:
                        out[y0 - y : y1 - y, x0 - x : x1 - x] = part[..., : self.channels]
        return out[..., 0] if self.channels == 1 else out

    def _segment(self, i: int) -> np.ndarray:
        """Segment ``i`` decoded, ``sh x sw x samples``, its byte count bounded before it is read."""
        page = self._page
        sh, sw = self._seg
        samples = 1 if self._separate else self._spp
        raw = sh * sw * samples * (self.bit_depth // 8)
        offset, count = int(page.dataoffsets[i]), int(page.databytecounts[i])
        if count > 2 * raw + (1 << 20):
            raise ImageDataError(f"TIFF segment {i} of {count} bytes: over what a {sw}x{sh} segment can take")
        if count == 0:  # a sparse segment (never written): zeros
            return np.zeros((sh, sw, samples), dtype=page.dtype)
        fh = self._tif.filehandle
        try:
            fh.seek(offset)
            data = fh.read(count)
            if len(data) != count:
                raise ImageDataError(f"TIFF segment {i}: {count} bytes at {offset}, the file ends first")
            self._check_declared(i, data)
            seg, _, shape = page.decode(data, i, jpegtables=page.jpegtables)
        except ImageDataError:
            raise
        except Exception as e:  # noqa: BLE001 - a codec's own error on corrupt data
            if "imagecodecs" in str(e):  # tifffile needs it for LZW, zstd, JPEG, ... segments: the tiff extra
                raise MissingCodecError(
                    f"TIFF segment {i}: {_name(page.compression)} segments need imagecodecs (pip install 'wdsr[tiff]')",
                    _name(page.compression),
                ) from None
            raise ImageDataError(f"TIFF segment {i}: {type(e).__name__}: {str(e)[:200]}") from None
        short = (1, self._rows(i), sw, samples)  # a last strip holds the rows left
        if seg is None or tuple(seg.shape) not in ((1, sh, sw, samples), short):
            got = None if seg is None else tuple(seg.shape)
            raise ImageDataError(f"TIFF segment {i} decoded to {got}, its layout says {(1, sh, sw, samples)}")
        return seg[0]

    def _rows(self, i: int) -> int:
        """The rows of image segment ``i`` holds: its box's, or those left in a last strip."""
        row = (i % (self._grid[0] * self._grid[1])) // self._grid[1]
        return min(self._seg[0], self.height - row * self._seg[0])

    def _check_declared(self, i: int, data: bytes) -> None:
        """A segment of an image codec (JPEG, PNG, WebP, JPEG 2000, JPEG XL) declares its own size in
        its header, and its decoder allocates that: it must be the segment's box (or a last strip's
        rows), with no more samples or bits than the box holds, before any pixel is decoded."""
        compression = int(self._page.compression)
        codec = _FRAME_CODECS.get(compression)
        where = f"{self.path}: TIFF segment {i}"
        if codec is None:
            import tifffile

            if compression in tifffile.TIFF.IMAGE_COMPRESSIONS:
                name = _name(self._page.compression)
                raise ImageDataError(f"{where}: {name} segments declare a size no check reads here; refused before decoding")
            return
        try:
            frame = declared_frame(data, codec)
        except HeaderError as e:
            raise ImageDataError(f"{where}: {e}; refused before decoding") from None
        (sh, sw), samples = self._seg, 1 if self._separate else self._spp
        if frame.width != sw or frame.height not in (sh, self._rows(i)):
            raise ImageDataError(
                f"{where}: its {codec.value} header declares {frame.width}x{frame.height} pixels, "
                f"the segment is {sw}x{sh}; refused before decoding"
            )
        if frame.components > max(samples, 3) or frame.precision > self.bit_depth:
            raise ImageDataError(
                f"{where}: its {codec.value} header declares {frame.components} components of {frame.precision} bits, "
                f"the TIFF has {samples} of {self.bit_depth}; refused before decoding"
            )
