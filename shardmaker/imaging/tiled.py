"""Tiled members in and out: an image cut into independent tiles (:mod:`shardmaker.format.tiles`),
and a region read back by decoding only the tiles it touches, each once."""

from __future__ import annotations

import numpy as np

from shardmaker.format import tiles as tl
from shardmaker.imaging.codecs import Codec, ImageDataError, decode, encode

__all__ = ["decode_region", "encode_tiled", "read_layout"]


def encode_tiled(img: np.ndarray, tile: int, codec: Codec | str = Codec.QOI, png_level: int = 1) -> bytes:
    """``img`` (HxW or HxWx3, uint8/uint16) as a tiled member of ``tile``-pixel tiles.

    QOI holds 8-bit RGB only; grey and 16-bit images take PNG tiles whatever ``codec`` says."""
    codec = Codec(codec)
    channels = 1 if img.ndim == 2 else img.shape[2]
    depth = 8 * img.dtype.itemsize
    if codec is Codec.QOI and (channels, depth) != (3, 8):
        codec = Codec.PNG
    h = tl.TiledHeader(img.shape[1], img.shape[0], tile, channels, depth, codec.value)
    parts = []
    for i in range(h.count):
        y, x, th, tw = h.box(i)
        parts.append(encode(np.ascontiguousarray(img[y : y + th, x : x + tw]), codec, png_level))
    return tl.pack(h, parts)


def read_layout(member: bytes | memoryview) -> tuple[tl.TiledHeader, np.ndarray]:
    """The checked header and index of a whole tiled member."""
    h = tl.parse_header(member, len(member))
    return h, tl.parse_index(h, memoryview(member)[tl.HEADER_BYTES : h.data_start], len(member))


def decode_region(
    member: bytes | memoryview,
    y: int,
    x: int,
    height: int,
    width: int,
    layout: tuple[tl.TiledHeader, np.ndarray] | None = None,
    verify: bool = False,
) -> np.ndarray:
    """The ``height x width`` region at ``(y, x)`` of a tiled member (HxW for grey, HxWx3 for RGB),
    from the tiles it touches only; every tile's bytes and header are checked before its decode."""
    h, index = layout if layout is not None else read_layout(member)
    dtype = np.uint8 if h.bit_depth == 8 else np.uint16
    out = np.empty((height, width) if h.channels == 1 else (height, width, h.channels), dtype=dtype)
    for i in h.touched(y, x, height, width):
        data = tl.tile_view(member, h, index, i, verify)
        tl.check_tile(h, i, data)
        try:
            pix = decode(data, h.codec)
        except ImageDataError as e:
            raise tl.TileFormatError(str(e), i) from None
        ty, tx, th, tw = h.box(i)
        if pix.shape[:2] != (th, tw) or pix.dtype != dtype:  # the decoder agrees with the header it was given
            raise tl.TileFormatError(f"decoded to {pix.shape} {pix.dtype}, the grid says {th}x{tw} {dtype.__name__}", i)
        y0, x0 = max(y, ty), max(x, tx)
        y1, x1 = min(y + height, ty + th), min(x + width, tx + tw)
        out[y0 - y : y1 - y, x0 - x : x1 - x] = pix[y0 - ty : y1 - ty, x0 - tx : x1 - tx]
    return out
