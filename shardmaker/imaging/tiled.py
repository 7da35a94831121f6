"""Tiled members in and out: an image cut into independent tiles (:mod:`shardmaker.format.tiles`),
and a region read back by decoding only the tiles it touches, each once."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import xxhash

from shardmaker.format import tiles as tl
from shardmaker.imaging.codecs import Codec, ImageDataError, decode, encode

__all__ = ["RangeReader", "TiledImage", "decode_region", "encode_tiled", "read_layout"]


def encode_tiled(img: np.ndarray, tile: int, codec: Codec | str = Codec.QOI, png_level: int = 1) -> bytes:
    """``img`` (HxW or HxWx3, uint8/uint16) as a tiled member of ``tile``-pixel tiles.

    QOI holds 8-bit RGB only (``ImageDataError`` otherwise, as for a whole image)."""
    codec = Codec(codec)
    channels = 1 if img.ndim == 2 else img.shape[2]
    depth = 8 * img.dtype.itemsize
    if codec is Codec.QOI and (channels, depth) != (3, 8):
        raise ImageDataError("QOI stores 8-bit RGB only; use --codec png for grey or 16-bit images")
    h = tl.TiledHeader(img.shape[1], img.shape[0], tile, channels, depth, codec.value)
    parts = []
    for i in range(h.count):
        y, x, th, tw = h.box(i)
        parts.append(encode(np.ascontiguousarray(img[y : y + th, x : x + tw]), codec, png_level))
    return tl.pack(h, parts)


class RangeReader(Protocol):
    """A tiled member read by range (a local shard's file, an object store): only what is asked for.

    A reader whose reads are requests (an object store) may also have ``prefetch(spans)``: told the
    ``(offset, length)`` spans about to be read, it fetches them at once (:meth:`TiledImage.prefetch`)."""

    def __len__(self) -> int: ...

    def read(self, offset: int, n: int) -> bytes: ...


Member = bytes | bytearray | memoryview | RangeReader


def _bytes_at(member: Member, offset: int, n: int) -> bytes | memoryview:
    if isinstance(member, (bytes, bytearray, memoryview)):
        return memoryview(member)[offset : offset + n]
    try:
        return member.read(offset, n)
    except OSError as e:
        raise tl.TileFormatError(f"cannot read {n} bytes at {offset}: {e}") from None


def read_layout(member: Member) -> tuple[tl.TiledHeader, np.ndarray]:
    """The checked header and index of a tiled member (of a reader: two reads, header and index)."""
    size = len(member)
    h = tl.parse_header(_bytes_at(member, 0, tl.HEADER_BYTES), size)
    return h, tl.parse_index(h, _bytes_at(member, tl.HEADER_BYTES, h.data_start - tl.HEADER_BYTES), size)


class TiledImage:
    """A tiled member as a lazily decoded ``H x W [x C]`` image: slicing it (``img[y0:y1, x0:x1]``)
    decodes only the tiles the slice touches, each tile once for the object's life, and returns a
    new array. ``shape_hw`` views only the top-left part (an HR cropped to ``scale x LR``).

    Every tile's bytes are checked (range; digest when ``verify``) and its own header against its
    box before it is decoded (:mod:`shardmaker.format.tiles`). A member that can ``prefetch`` is
    told the tiles a region needs before they are read, and :meth:`prefetch` tells it those of many
    regions at once (a sample's patches)."""

    def __init__(
        self,
        member: Member,
        layout: tuple[tl.TiledHeader, np.ndarray] | None = None,
        shape_hw: tuple[int, int] | None = None,
        verify: bool = False,
    ) -> None:
        self.header, self._index = layout if layout is not None else read_layout(member)
        h = self.header
        hh, ww = shape_hw if shape_hw is not None else (h.height, h.width)
        if not (0 < hh <= h.height and 0 < ww <= h.width):
            raise ValueError(f"a {ww}x{hh} view of a {h.width}x{h.height} tiled image")
        self._member, self._verify = member, verify
        self.shape: tuple[int, ...] = (hh, ww) if h.channels == 1 else (hh, ww, h.channels)
        self.dtype = np.dtype(np.uint8 if h.bit_depth == 8 else np.uint16)
        self._tiles: dict[int, np.ndarray] = {}
        self._prefetch = getattr(member, "prefetch", None)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def tiles_decoded(self) -> int:
        return len(self._tiles)

    def tile(self, i: int) -> np.ndarray:
        """Tile ``i`` decoded (once), its bytes and header checked first."""
        got = self._tiles.get(i)
        if got is None:
            got = self._tiles[i] = self.decode_tile(i)
        return got

    def decode_tile(self, i: int) -> np.ndarray:
        """Tile ``i`` read, checked and decoded now, not kept (``tile`` keeps it): what a whole-member
        check (``shardmaker verify --deep``) walks, in the memory of one tile."""
        h = self.header
        data: bytes | memoryview
        if isinstance(self._member, (bytes, bytearray, memoryview)):
            data = tl.tile_view(memoryview(self._member), h, self._index, i, self._verify)
        else:  # read now: just this tile's bytes, then checked as a view would be
            off, n, _, digest = self._index.item(i)
            data = _bytes_at(self._member, off, n)
            if len(data) != n:
                raise tl.TileFormatError(f"{len(data)} of its {n} bytes at {off} could be read", i)
            if self._verify and xxhash.xxh3_64_intdigest(data) != digest:
                raise tl.TileFormatError("xxh3_64 of its bytes differs from the index", i)
        tl.check_tile(h, i, data)
        try:
            got = decode(data, h.codec)
        except ImageDataError as e:
            raise tl.TileFormatError(str(e), i) from None
        _, _, th, tw = h.box(i)
        if got.shape[:2] != (th, tw) or got.dtype != self.dtype:  # the decoder agrees with the header
            raise tl.TileFormatError(f"decoded to {got.shape} {got.dtype}, the grid says {th}x{tw} {self.dtype}", i)
        return got

    def prefetch(self, boxes: list[tuple[int, int, int, int]]) -> None:
        """The regions ``(y, x, h, w)`` about to be sliced: a member that can ``prefetch`` starts
        fetching the tiles they touch that are not decoded yet, all at once; others ignore it."""
        if self._prefetch is None:
            return
        h, want = self.header, set[int]()
        for y, x, bh, bw in boxes:
            want.update(i for i in h.touched(y, x, bh, bw) if i not in self._tiles)
        spans = []
        for i in sorted(want):
            off, n, _, _ = self._index.item(i)
            spans.append((off, n))
        if spans:
            self._prefetch(spans)

    def region(self, y: int, x: int, height: int, width: int) -> np.ndarray:
        if not (0 <= y and 0 <= x and height > 0 and width > 0 and y + height <= self.shape[0] and x + width <= self.shape[1]):
            raise ValueError(f"region {width}x{height} at ({x}, {y}) is not inside the {self.shape[1]}x{self.shape[0]} image")
        out = np.empty((height, width, *self.shape[2:]), dtype=self.dtype)
        h = self.header
        self.prefetch([(y, x, height, width)])  # a whole image (val) too: its tiles in a few requests
        for i in h.touched(y, x, height, width):
            pix = self.tile(i)
            ty, tx, th, tw = h.box(i)
            y0, x0 = max(y, ty), max(x, tx)
            y1, x1 = min(y + height, ty + th), min(x + width, tx + tw)
            out[y0 - y : y1 - y, x0 - x : x1 - x] = pix[y0 - ty : y1 - ty, x0 - tx : x1 - tx]
        return out

    def __getitem__(self, key: tuple[slice, slice] | tuple[slice, slice, slice]) -> np.ndarray:
        """Basic slices of rows and columns (a third ``:`` for channels); steps of 1 only."""
        if not isinstance(key, tuple) or len(key) not in (2, 3) or not all(isinstance(k, slice) for k in key):
            raise TypeError("a TiledImage takes [y0:y1, x0:x1] slices")
        if len(key) == 3 and key[2] != slice(None):
            raise TypeError("a TiledImage slices rows and columns only")
        (y0, y1, ys), (x0, x1, xs) = key[0].indices(self.shape[0]), key[1].indices(self.shape[1])
        if ys != 1 or xs != 1 or y1 <= y0 or x1 <= x0:
            raise TypeError(f"a TiledImage takes non-empty slices with step 1, got {key}")
        return self.region(y0, x0, y1 - y0, x1 - x0)

    def __array__(self, dtype: Any = None, copy: object = None) -> np.ndarray:
        whole = self.region(0, 0, self.shape[0], self.shape[1])
        return whole if dtype is None else whole.astype(dtype)


def decode_region(
    member: Member,
    y: int,
    x: int,
    height: int,
    width: int,
    layout: tuple[tl.TiledHeader, np.ndarray] | None = None,
    verify: bool = False,
) -> np.ndarray:
    """The ``height x width`` region at ``(y, x)`` of a tiled member (HxW for grey, HxWx3 for RGB),
    from the tiles it touches only; every tile's bytes and header are checked before its decode."""
    return TiledImage(member, layout, verify=verify).region(y, x, height, width)
