"""Tiled image members (``{key}.hr.tiles``, ``{key}.lr_x{s}.tiles``): one member per image, read a
few tiles at a time, every bound checked before a tile is decoded.

A large image (an 8K frame, a remote-sensing scene, a pathology slide) is stored as a grid of
``T x T`` tiles, each an independent QOI (8-bit RGB) or PNG (grey, 16-bit) image, so a patch
decodes only the tiles it touches. Layout, little-endian::

    0   8  magic b"WDSRTILE"
    8   2  version (1)
    10  1  codec: 1 QOI, 2 PNG
    11  1  channels (1 or 3)
    12  1  bit depth (8 or 16)
    13  3  zero
    16  4  width        20  4  height
    24  4  tile side T  28  4  tile count (= ceil(W/T) * ceil(H/T), row-major)
    32  24 x count: per tile offset u64 (from the member's start), length u32, zero u32, xxh3_64 u64
    ... the tiles, contiguous, in index order, ending at the member's end

Edge tiles are smaller (``W - c*T`` wide in the last column). An LR member of scale ``s`` has its
own header with side ``T / s``, so its tiles lie on the HR grid. The checks here are the format's:
sizes and counts against the member's bytes, offsets contiguous and in range, lengths bounded by
what an encoding of the tile can take, each tile's own image header equal to its box. They raise
:class:`TileFormatError`; readers add shard, key and tile.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
from collections.abc import Sequence

import numpy as np
import xxhash

from shardmaker.format.headers import PNG_SIGNATURE, HeaderError, image_header
from shardmaker.format.schema import MAX_SIDE

__all__ = [
    "HEADER_BYTES",
    "INDEX_DTYPE",
    "MAGIC",
    "MAX_TILES",
    "TILE_HEAD_BYTES",
    "TileFormatError",
    "TiledHeader",
    "check_tile",
    "max_tile_bytes",
    "pack",
    "parse_header",
    "parse_index",
    "tile_side",
    "tile_view",
]

MAGIC = b"WDSRTILE"
VERSION = 1
HEADER_BYTES = 32
INDEX_DTYPE = np.dtype([("offset", "<u8"), ("length", "<u4"), ("zero", "<u4"), ("xxh3", "<u8")])
TILE_HEAD_BYTES = 33  # what check_tile reads of a tile: a PNG's signature and IHDR, a QOI header
MAX_TILES = 1 << 20  # per member: 150k for a 100k x 100k slide at T = 256
MIN_TILE, MAX_TILE = 8, 1 << 15
_CODECS = {1: "qoi", 2: "png"}
_CODEC_IDS = {v: k for k, v in _CODECS.items()}
_HEAD = struct.Struct("<8sHBBB3xIIII")


class TileFormatError(ValueError):
    """A tiled member that breaks the layout; ``tile`` is the tile's index when one tile is at fault."""

    def __init__(self, reason: str, tile: int | None = None) -> None:
        super().__init__(reason if tile is None else f"tile {tile}: {reason}")
        self.reason, self.tile = reason, tile

    def __reduce__(self) -> tuple[type, tuple[str, int | None]]:
        return (type(self), (self.reason, self.tile))


@dataclasses.dataclass(frozen=True)
class TiledHeader:
    """What a tiled member's first 32 bytes say, checked (:func:`parse_header`)."""

    width: int
    height: int
    tile: int
    channels: int
    bit_depth: int
    codec: str  # "qoi" or "png"
    cols: int = dataclasses.field(init=False, compare=False)
    rows: int = dataclasses.field(init=False, compare=False)

    def __post_init__(self) -> None:  # the grid, once: box() is on every tile's path
        object.__setattr__(self, "cols", -(-self.width // self.tile))
        object.__setattr__(self, "rows", -(-self.height // self.tile))

    @property
    def count(self) -> int:
        return self.rows * self.cols

    @property
    def data_start(self) -> int:
        """Where the first tile starts: after the header and the index."""
        return HEADER_BYTES + self.count * INDEX_DTYPE.itemsize

    def box(self, i: int) -> tuple[int, int, int, int]:
        """Tile ``i``'s ``(y, x, h, w)`` in the image."""
        r, c = divmod(i, self.cols)
        y, x = r * self.tile, c * self.tile
        return y, x, min(self.tile, self.height - y), min(self.tile, self.width - x)

    def touched(self, y: int, x: int, h: int, w: int) -> list[int]:
        """The tiles (row-major) that the region ``(y, x, h, w)`` overlaps; it must lie inside the image."""
        if not (0 <= y and 0 <= x and h > 0 and w > 0 and y + h <= self.height and x + w <= self.width):
            raise ValueError(f"region {w}x{h} at ({x}, {y}) is not inside the {self.width}x{self.height} image")
        t = self.tile
        rows = range(y // t, (y + h - 1) // t + 1)
        cols = range(x // t, (x + w - 1) // t + 1)
        return [r * self.cols + c for r in rows for c in cols]

    def pack(self) -> bytes:
        return _HEAD.pack(
            MAGIC, VERSION, _CODEC_IDS[self.codec], self.channels, self.bit_depth, self.width, self.height, self.tile, self.count
        )


def max_tile_bytes(h: TiledHeader, th: int, tw: int) -> int:
    """The most bytes an encoding of a ``tw x th`` tile can take (QOI's worst case; PNG as stored
    deflate blocks), plus slack for headers: a length above it is refused before any read."""
    raw = th * tw * h.channels * (h.bit_depth // 8)
    if h.codec == "qoi":
        return th * tw * (h.channels + 1) + 14 + 8
    rows = raw + th  # a filter byte per row
    return rows + 5 * (rows // 16383 + 1) + 4096


def parse_header(head: bytes | memoryview, member_size: int | None = None) -> TiledHeader:
    """The checked header of a tiled member from its first bytes (at least 32)."""
    if len(head) < HEADER_BYTES:
        raise TileFormatError(f"{len(head)} bytes: shorter than the {HEADER_BYTES}-byte header")
    magic, version, codec, channels, depth, w, h, t, count = _HEAD.unpack(bytes(head[:HEADER_BYTES]))
    if magic != MAGIC:
        raise TileFormatError("not a tiled member (no WDSRTILE magic)")
    if version != VERSION:
        raise TileFormatError(f"version {version}; this reader knows version {VERSION}")
    if codec not in _CODECS:
        raise TileFormatError(f"codec {codec}: tiles are QOI (1) or PNG (2)")
    if channels not in (1, 3) or depth not in (8, 16):
        raise TileFormatError(f"{depth}-bit x{channels}: tiles are grey or RGB, 8- or 16-bit")
    if _CODECS[codec] == "qoi" and (channels, depth) != (3, 8):
        raise TileFormatError(f"QOI tiles are 8-bit RGB, the header says {depth}-bit x{channels}")
    if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
        raise TileFormatError(f"{w}x{h}: sides must be in [1, {MAX_SIDE}]")
    if not MIN_TILE <= t <= MAX_TILE:
        raise TileFormatError(f"tile side {t}: must be in [{MIN_TILE}, {MAX_TILE}]")
    out = TiledHeader(w, h, t, channels, depth, _CODECS[codec])
    if count != out.count:
        raise TileFormatError(f"tile count {count}: a {w}x{h} image in {t}-pixel tiles has {out.count}")
    if count > MAX_TILES:
        raise TileFormatError(f"{count} tiles: over {MAX_TILES} (store it with a larger tile side)")
    if member_size is not None and member_size < out.data_start + count:
        raise TileFormatError(f"{member_size} bytes: too short for the header and index of {count} tiles")
    return out


def parse_index(h: TiledHeader, raw: bytes | memoryview, member_size: int) -> np.ndarray:
    """The checked tile index (``INDEX_DTYPE`` array) from the bytes after the header: offsets
    contiguous from :attr:`TiledHeader.data_start` to ``member_size``, every length above 0 and
    within :func:`max_tile_bytes` of its tile's box."""
    n = h.count
    if len(raw) < n * INDEX_DTYPE.itemsize:
        raise TileFormatError(f"index of {n} tiles needs {n * INDEX_DTYPE.itemsize} bytes, {len(raw)} given")
    index = np.frombuffer(raw, dtype=INDEX_DTYPE, count=n)
    offsets, lengths = index["offset"].astype(np.int64, copy=False), index["length"].astype(np.int64)
    if np.any(index["zero"]):
        raise TileFormatError("index entries have a non-zero reserved field", int(np.flatnonzero(index["zero"])[0]))
    if np.any(offsets < 0):  # an offset past 2^63 reads as negative here
        raise TileFormatError("offset past the member's end", int(np.flatnonzero(offsets < 0)[0]))
    want = h.data_start + np.concatenate(([0], np.cumsum(lengths)[:-1]))
    bad = np.flatnonzero(offsets != want)
    if bad.size:
        raise TileFormatError(f"offset {int(offsets[bad[0]])}, contiguous tiles put it at {int(want[bad[0]])}", int(bad[0]))
    if int(want[-1] + lengths[-1]) != member_size:
        raise TileFormatError(f"the tiles end at byte {int(want[-1] + lengths[-1])}, the member at {member_size}")
    limits = _limits(h)
    over = np.flatnonzero((lengths <= 0) | (lengths > limits))
    if over.size:
        i = int(over[0])
        raise TileFormatError(f"length {int(lengths[i])}: must be in [1, {int(limits[i])}] for its box", i)
    return index


def _limits(h: TiledHeader) -> np.ndarray:
    """:func:`max_tile_bytes` of every tile: four box sizes at most (inner, last column, last row, corner)."""
    t = h.tile
    last_w, last_h = h.width - (h.cols - 1) * t, h.height - (h.rows - 1) * t
    grid = np.full((h.rows, h.cols), max_tile_bytes(h, t, t), dtype=np.int64)
    grid[:, -1] = max_tile_bytes(h, t, last_w)
    grid[-1, :] = max_tile_bytes(h, last_h, t)
    grid[-1, -1] = max_tile_bytes(h, last_h, last_w)
    return grid.reshape(-1)


def tile_view(member: bytes | memoryview, h: TiledHeader, index: np.ndarray, i: int, verify: bool = False) -> memoryview:
    """Tile ``i``'s bytes, a view into the whole ``member``; its digest checked when ``verify``."""
    if not 0 <= i < h.count:
        raise TileFormatError(f"no tile {i} in a grid of {h.count}")
    off, n, _, digest = index.item(i)  # one Python tuple: cheaper than three field lookups
    view = memoryview(member)[off : off + n]
    if len(view) != n:
        raise TileFormatError(f"{n} bytes at {off}: the member has {len(member)}", i)
    if verify and xxhash.xxh3_64_intdigest(view) != digest:
        raise TileFormatError("xxh3_64 of its bytes differs from the index", i)
    return view


def check_tile(h: TiledHeader, i: int, data: bytes | memoryview) -> None:
    """Tile ``i``'s own image header is the box, channels and depth the grid says: so its decode
    is never larger than ``T * T * channels * bytes``."""
    _, _, th, tw = h.box(i)
    if bytes(data[: len(want := _expected_prefix(h, th, tw))]) == want:
        return  # the common case: the header's bytes are the ones the grid implies
    try:
        got = image_header(data, h.codec)
    except HeaderError as e:
        raise TileFormatError(str(e), i) from None
    if (got.width, got.height, got.channels, got.bit_depth) != (tw, th, h.channels, h.bit_depth):
        raise TileFormatError(
            f"its header says {got.width}x{got.height} {got.bit_depth}-bit x{got.channels}, "
            f"the grid {tw}x{th} {h.bit_depth}-bit x{h.channels}",
            i,
        )


@functools.lru_cache(maxsize=64)
def _expected_prefix(h: TiledHeader, th: int, tw: int) -> bytes:
    """The leading header bytes of a valid ``tw x th`` tile: QOI magic, size and channels; PNG
    signature and IHDR up to colour type (compression, filter and interlace are checked by decoders)."""
    if h.codec == "qoi":
        return b"qoif" + struct.pack(">IIB", tw, th, 3)
    return PNG_SIGNATURE + b"\0\0\0\x0dIHDR" + struct.pack(">IIBB", tw, th, h.bit_depth, 0 if h.channels == 1 else 2)


def pack(h: TiledHeader, tiles: Sequence[bytes]) -> bytes:
    """The member for ``h`` and its encoded tiles (in index order)."""
    if len(tiles) != h.count:
        raise ValueError(f"{len(tiles)} tiles for a grid of {h.count}")
    index = np.zeros(h.count, dtype=INDEX_DTYPE)
    lengths = np.fromiter(map(len, tiles), dtype=np.int64, count=h.count)
    index["offset"] = h.data_start + np.concatenate(([0], np.cumsum(lengths)[:-1]))
    index["length"] = lengths
    index["xxh3"] = [xxhash.xxh3_64_intdigest(t) for t in tiles]
    return b"".join([h.pack(), index.tobytes(), *tiles])


def tile_side(scales: Sequence[int], at_least: int = 256) -> int:
    """The smallest side ``>= at_least`` that every scale divides: 256 for {2, 4}, 264 for {2, 3, 4}."""
    step = math.lcm(*scales)
    return -(-at_least // step) * step
