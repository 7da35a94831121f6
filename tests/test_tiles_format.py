"""Tiled image members (issue 26, the format layer): round trips on real photos, regions that decode
only the tiles they touch, and crafted members that end in TileFormatError, never a hang, an
over-read or another exception."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardmaker.format import tiles as tl
from shardmaker.imaging import Codec, TiledImage, downscale, encode
from shardmaker.imaging.tiled import decode_region, encode_tiled, read_layout
from tests.helpers import photos
from wdsr.pipeline.patches import PatchConfig, cut_patches
from wdsr.pipeline.whole import DecodedPair


def _kinds() -> list[tuple[str, np.ndarray, Codec]]:
    rgb = photos()[2]  # 400 x 600 coffee
    grey = np.ascontiguousarray(rgb[..., 1])
    deep = (rgb.astype(np.uint16) * 257 + np.arange(rgb.shape[1], dtype=np.uint16)[None, :, None]).astype(np.uint16)
    return [("rgb8-qoi", rgb, Codec.QOI), ("rgb8-png", rgb, Codec.PNG), ("grey8", grey, Codec.PNG), ("rgb16", deep, Codec.PNG)]


@pytest.mark.parametrize("name,img,codec", _kinds(), ids=[k[0] for k in _kinds()])
@pytest.mark.parametrize("tile", [64, 96, 256])
def test_regions_equal_the_crop(name: str, img: np.ndarray, codec: Codec, tile: int) -> None:
    member = encode_tiled(img, tile, codec)
    h, _ = read_layout(member)
    assert (h.width, h.height, h.tile) == (img.shape[1], img.shape[0], tile)
    assert h.codec == ("qoi" if name == "rgb8-qoi" else "png")
    rng = np.random.default_rng(0)
    for _ in range(12):
        ph, pw = int(rng.integers(1, 200)), int(rng.integers(1, 200))
        y, x = int(rng.integers(0, img.shape[0] - ph + 1)), int(rng.integers(0, img.shape[1] - pw + 1))
        np.testing.assert_array_equal(decode_region(member, y, x, ph, pw, verify=True), img[y : y + ph, x : x + pw])
    np.testing.assert_array_equal(decode_region(member, 0, 0, img.shape[0], img.shape[1]), img)


def test_edge_tiles_and_touched() -> None:
    h = tl.TiledHeader(width=600, height=400, tile=256, channels=3, bit_depth=8, codec="qoi")
    assert (h.cols, h.rows, h.count) == (3, 2, 6)
    assert h.box(5) == (256, 512, 144, 88)
    assert h.touched(0, 0, 256, 256) == [0]
    assert h.touched(250, 250, 10, 10) == [0, 1, 3, 4]
    assert h.touched(300, 520, 100, 80) == [5]
    with pytest.raises(ValueError, match="not inside"):
        h.touched(300, 520, 101, 80)
    assert tl.tile_side([2, 4]) == 256 and tl.tile_side([2, 3, 4]) == 264 and tl.tile_side([3]) == 258


def test_only_touched_tiles_are_read() -> None:
    """A corrupt tile outside the region does not matter; inside it is an error naming the tile."""
    img = photos()[2]
    member = bytearray(encode_tiled(img, 128, Codec.QOI))
    h, index = read_layout(member)
    bad = h.cols  # row 1, col 0: pixels y 128..255, x 0..127
    off = int(index["offset"][bad])
    member[off + 30 : off + 60] = b"\xff" * 30  # inside its data: the header still reads
    np.testing.assert_array_equal(decode_region(member, 0, 128, 100, 100), img[:100, 128:228])
    with pytest.raises(tl.TileFormatError, match=f"tile {bad}: xxh3_64"):
        decode_region(member, 130, 10, 20, 20, verify=True)


def _member(tile: int = 64) -> bytes:
    return encode_tiled(photos()[1][:200, :300], tile, Codec.QOI)


def _with_header(member: bytes, **fields: int) -> bytes:
    names = ["magic", "version", "codec", "channels", "depth", "width", "height", "tile", "count"]
    values = dict(zip(names, struct.unpack("<8sHBBB3xIIII", member[:32]), strict=True))
    values.update(fields)
    return struct.pack("<8sHBBB3xIIII", *values.values()) + member[32:]


def _with_index(member: bytes, edit) -> bytes:
    h = tl.parse_header(member)
    index = np.frombuffer(member[32 : h.data_start], dtype=tl.INDEX_DTYPE).copy()
    edit(index)
    return member[:32] + index.tobytes() + member[h.data_start :]


HOSTILE = {
    "magic": (lambda m: b"NOTTILED" + m[8:], "no WDSRTILE magic"),
    "version": (lambda m: _with_header(m, version=2), "version 2"),
    "codec": (lambda m: _with_header(m, codec=7), "codec 7"),
    "qoi grey": (lambda m: _with_header(m, channels=1), "QOI tiles are 8-bit RGB"),
    "zero side": (lambda m: _with_header(m, width=0), "sides must be"),
    "tile side": (lambda m: _with_header(m, tile=3), "tile side 3"),
    "count lies": (lambda m: _with_header(m, count=5), "tile count 5"),
    "count too large": (lambda m: _with_header(m, width=1 << 20, height=1 << 14, tile=8, count=1 << 28), "over 1048576"),
    "index past the end": (lambda m: _with_header(m, width=1 << 20, height=1 << 14, tile=512, count=2048 * 32), "too short"),
    "truncated": (lambda m: m[:-1], "the member at"),
    "trailing bytes": (lambda m: m + b"\0", "the member at"),
    "overlapping": (lambda m: _with_index(m, lambda ix: ix["offset"].__setitem__(3, ix["offset"][2])), "tile 3: offset"),
    "offset past 2^63": (lambda m: _with_index(m, lambda ix: ix["offset"].__setitem__(1, 1 << 63)), "tile 1: offset past"),
    "zero length": (
        lambda m: _with_index(m, lambda ix: (ix["length"].__setitem__(0, 0), ix["offset"].__setitem__(1, ix["offset"][0]))),
        "offset|length 0",
    ),
    "reserved": (lambda m: _with_index(m, lambda ix: ix["zero"].__setitem__(2, 1)), "tile 2: .*reserved"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_layouts(case: str) -> None:
    edit, message = HOSTILE[case]
    member = edit(_member())
    with pytest.raises(tl.TileFormatError, match=message):
        decode_region(member, 0, 0, 10, 10)


def test_a_tile_whose_header_lies() -> None:
    """A tile replaced by a valid image of another size (or a bomb's header) is refused before its
    decode, by its own header against the grid's box."""
    img = photos()[1][:200, :300]
    h = tl.TiledHeader(300, 200, 64, 3, 8, "qoi")
    parts = [encode(np.ascontiguousarray(img[y : y + th, x : x + tw]), Codec.QOI) for y, x, th, tw in map(h.box, range(h.count))]
    bomb = bytearray(parts[0])
    bomb[4:12] = struct.pack(">II", 60000, 60000)  # 10.8 GB of pixels, declared in 8 bytes
    for i, tile in ((1, encode(np.zeros((64, 65, 3), np.uint8), Codec.QOI)), (0, bytes(bomb))):
        forged = list(parts)
        forged[i] = tile
        with pytest.raises(tl.TileFormatError, match=f"tile {i}: its header says"):
            decode_region(tl.pack(h, forged), 0, 0, 64, 128)


def test_length_bound_is_checked_before_any_read() -> None:
    """A length over what any encoding of the tile can take is refused from the index alone."""
    h = tl.TiledHeader(300, 200, 64, 3, 8, "qoi")
    parts = [b"x" * 10] * h.count
    parts[7] = b"x" * (tl.max_tile_bytes(h, 64, 64) + 1)
    member = tl.pack(h, parts)
    with pytest.raises(tl.TileFormatError, match="tile 7: length"):
        read_layout(member)


def test_pack_records_digests() -> None:
    member = _member()
    h, index = read_layout(member)
    for i in range(h.count):
        view = tl.tile_view(member, h, index, i)
        assert xxhash.xxh3_64_intdigest(view) == int(index["xxh3"][i])


_VALID = _member(64)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.tuples(st.integers(0, len(_VALID) - 1), st.integers(0, 255)), min_size=1, max_size=6),
    truncate=st.integers(0, len(_VALID)),
    region=st.tuples(st.integers(0, 199), st.integers(0, 299), st.integers(1, 200), st.integers(1, 300)),
)
def test_fuzzed_members_end_in_our_error(cuts: list[tuple[int, int]], truncate: int, region: tuple[int, ...]) -> None:
    """Byte flips anywhere (header, index, tiles) and truncations: a region of the right size, or
    TileFormatError; nothing else, and never more memory than the grid's tiles."""
    member = bytearray(_VALID)
    for at, value in cuts:
        member[at] = value
    y, x, hh, ww = region
    try:
        out = decode_region(bytes(member[:truncate]), y, x, min(hh, 200 - y), min(ww, 300 - x))
    except (tl.TileFormatError, ValueError) as e:
        assert isinstance(e, tl.TileFormatError) or "not inside" in str(e)
    else:
        assert out.shape[:2] == (min(hh, 200 - y), min(ww, 300 - x))


# ---- TiledImage: the lazily decoded image the stream cuts patches from -------------------------


def test_tiled_image_slices_decode_each_tile_once() -> None:
    img = photos()[2]
    t = TiledImage(encode_tiled(img, 64, Codec.QOI), shape_hw=(399, 597))
    assert t.shape == (399, 597, 3) and t.dtype == np.uint8 and t.ndim == 3
    np.testing.assert_array_equal(t[10:70, 60:130], img[10:70, 60:130])
    assert t.tiles_decoded == 6  # 64-pixel tiles: y 10..69 -> 2 rows, x 60..129 -> 3 columns
    np.testing.assert_array_equal(t[10:70, 60:130, :], img[10:70, 60:130])
    assert t.tiles_decoded == 6  # the same slice again decodes nothing new
    np.testing.assert_array_equal(np.asarray(t), img[:399, :597])
    with pytest.raises(TypeError):
        t[0:10:2, 0:10]
    with pytest.raises(ValueError, match="not inside"):
        t.region(390, 0, 10, 10)


@pytest.mark.parametrize("k,tile,scale", [(4, 64, 2), (16, 96, 4), (33, 48, 3)])
@pytest.mark.parametrize("kind", ["rgb8", "grey16"])
def test_patches_from_tiles_equal_patches_from_arrays(k: int, tile: int, scale: int, kind: str) -> None:
    """The patch draws are a function of (seed, epoch, key, j) and the pixels: cut from a tiled
    pair they are byte-identical to the ones cut from the decoded arrays."""
    img = photos()[2]
    if kind == "grey16":
        img = img[..., 0].astype(np.uint16) * 257 + 3
    lh, lw = img.shape[0] // scale, img.shape[1] // scale
    hr = np.ascontiguousarray(img[: lh * scale, : lw * scale])
    lr = downscale(hr, scale)
    codec = Codec.QOI if kind == "rgb8" else Codec.PNG
    tiled_hr = TiledImage(encode_tiled(img, tile, codec), shape_hw=(lh * scale, lw * scale))
    tiled_lr = TiledImage(encode_tiled(lr, tile // scale, codec))
    for std in (None, 20.0):
        spec = PatchConfig(scale=scale, patch_size=24 * scale, min_patch_std=std)
        plain = DecodedPair("s.tar", "k", 0, hr, lr, 0, 0)
        tiled = DecodedPair("s.tar", "k", 0, tiled_hr, tiled_lr, 0, 0)  # type: ignore[arg-type]
        a, ra = cut_patches(plain, spec, 7, 1, 0, k)
        b, rb = cut_patches(tiled, spec, 7, 1, 0, k)
        assert ra == rb
        for pa, pb in zip(a, b, strict=True):
            assert (pa.t, pa.j) == (pb.t, pb.j)
            np.testing.assert_array_equal(pa.lr, pb.lr)
            np.testing.assert_array_equal(pa.hr, pb.hr)
    assert tiled_hr.tiles_decoded < tiled_hr.header.count
