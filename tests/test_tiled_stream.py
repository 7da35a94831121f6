"""Tiled storage end to end (issue 26): `shardmaker build --tiles` writes tiled members, the stream
cuts the same patches from them as from whole images (byte-identical batches), verify and the
hostile cases hold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash

import wdsr
from shardmaker import format as fmt
from shardmaker.imaging import TiledImage, encode_tiled
from shardmaker.verify import verify
from tests.helpers import build_shards, photos, rewrite, save


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """Real photos, some larger than two tiles, sides not multiples of the tile or of 3 or 4."""
    root = tmp_path_factory.mktemp("tiled-src")
    for i, p in enumerate(photos()):
        big = np.concatenate([p, p[:, ::-1]], axis=1)[: 300 + 17 * i, : 700 - 13 * i]
        save(root / f"p{i}.png", np.ascontiguousarray(big))
    return root


def _built(sources: Path, out: Path, *flags: str) -> Path:
    build_shards(sources, out, "--scale", "2,4", "--codec", "qoi", "--max-samples", "64", *flags)
    return out


def _members(ds: Path) -> set[str]:
    names = set()
    for sh in fmt.load(str(ds)).shards:
        with open(ds / sh.name, "rb") as f:
            for _, _, members in fmt.iter_samples(f):
                names |= set(members)
    return names


def _batches(ds: Path, scale: int, k: int, workers: int = 0, **kw) -> list[tuple[torch.Tensor, ...]]:
    d = wdsr.SRDataset(str(ds), scale=scale, patch_size=24 * scale, patches_per_image=k, batch_size=4, shuffle_buffer=16, **kw)
    return list(wdsr.make_loader(d, num_workers=workers))


@pytest.mark.parametrize("tile", ["96", "auto"])
def test_tiled_and_whole_images_give_byte_identical_batches(sources, tmp_path, tile):
    whole = _built(sources, tmp_path / "whole")
    tiled = _built(sources, tmp_path / "tiled", "--tiles", tile)
    if tile == "auto":  # nothing here is over 8 Mpx: auto stores them whole, byte for byte
        assert (tiled / "manifest.json").read_bytes() != b"" and _members(tiled) == _members(whole)
        return
    assert _members(tiled) == {"json", "hr.tiles", "lr_x2.tiles", "lr_x4.tiles"}
    assert verify(str(tiled), progress=False) == [] and verify(str(tiled), deep=True, progress=False) == []
    for scale, k, workers in ((2, 3, 0), (4, 16, 2)):
        a, b = _batches(whole, scale, k, workers), _batches(tiled, scale, k, workers)
        assert len(a) == len(b) > 0
        for x, y in zip(a, b, strict=True):
            assert all(torch.equal(u, v) for u, v in zip(x, y, strict=True))
    val_a = list(wdsr.SRDataset(str(whole), scale=4, split="val"))
    val_b = list(wdsr.SRDataset(str(tiled), scale=4, split="val"))
    assert [s.key for s in val_a] == [s.key for s in val_b]
    assert all(torch.equal(p.hr, q.hr) and torch.equal(p.lr, q.lr) for p, q in zip(val_a, val_b, strict=True))


def test_grey_16_bit_and_x3_tiles(tmp_path):
    src = tmp_path / "src"
    for i, p in enumerate(photos()[:3]):
        save(src / f"g{i}.png", (p[..., 1].astype(np.uint16) * 257 + i)[: 290 + 5 * i, : 410 - 7 * i])
    flags = ("--scale", "2,3,4")
    whole, tiled = tmp_path / "w", tmp_path / "t"
    build_shards(src, whole, *flags)
    build_shards(src, tiled, *flags, "--tiles", "120")
    for scale in (2, 3, 4):
        a, b = _batches(whole, scale, 5), _batches(tiled, scale, 5)
        assert a[0][1].dtype == torch.uint16 if hasattr(torch, "uint16") else True
        assert all(torch.equal(u, v) for x, y in zip(a, b, strict=True) for u, v in zip(x, y, strict=True))


def test_a_tile_side_the_scales_do_not_divide_is_one_line(sources, tmp_path, capsys):
    from shardmaker.cli import main

    assert main(["build", str(sources), str(tmp_path / "o"), "--scale", "3", "--tiles", "256"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tiles must be" in err[0] and "256" in err[0], err
    assert main(["build", str(sources), str(tmp_path / "o"), "--tiles", "big"]) == 2


def _rchar() -> int:
    return int(next(x.split()[1] for x in open("/proc/self/io") if x.startswith("rchar:")))


def _tamper(ds: Path, edit) -> None:
    """Rewrite the first shard with ``edit(name, data) -> data`` applied to its tiled members."""

    rewrite(ds, 0, lambda n, d: (n, edit(n, d) if n.endswith(".tiles") else d))


@pytest.mark.parametrize(
    "case,message",
    [
        ("truncated", "the member at"),
        ("grid of another scale", "do not lie on the HR grid"),
        ("tile header lies", "its header says"),
        ("digest", "xxh3_64"),
    ],
)
def test_hostile_tiled_members_are_sample_errors(sources, tmp_path, case, message):
    ds = _built(sources, tmp_path / "t", "--tiles", "96")
    first_key = fmt.load(str(ds)).shards[0].keys[0]

    def edit(name: str, data: bytes) -> bytes:
        if not name.startswith(first_key + "."):
            return data
        if case == "truncated":
            return data[:-3]
        if case == "grid of another scale" and name.endswith("lr_x4.tiles"):  # a valid member, on a 32-px grid
            return encode_tiled(np.asarray(TiledImage(data)), 32, fmt.tiles.parse_header(data).codec)
        if case in ("tile header lies", "digest") and name.endswith("hr.tiles"):  # every tile: one is touched
            h = fmt.tiles.parse_header(data)
            index = np.frombuffer(data[32 : h.data_start], dtype=fmt.tiles.INDEX_DTYPE).copy()
            buf = bytearray(data)
            for i in range(h.count):
                buf[int(index["offset"][i]) + (4 if case == "tile header lies" else 30)] ^= 0x5A
                if case == "tile header lies":  # a crafted member: its index carries the forged tiles' digests
                    index["xxh3"][i] = xxhash.xxh3_64_intdigest(fmt.tiles.tile_view(bytes(buf), h, index, i))
            return bytes(buf[:32]) + index.tobytes() + bytes(buf[h.data_start :])
        return data

    _tamper(ds, edit)
    d = wdsr.SRDataset(str(ds), scale=4, patch_size=96, patches_per_image=2, batch_size=2, verify="xxh3_64")
    with pytest.raises(wdsr.SampleError, match=message) as exc:
        list(d)
    assert first_key in str(exc.value)
    skip = wdsr.SRDataset(str(ds), scale=4, patch_size=96, patches_per_image=2, batch_size=2, on_error="skip")
    # the digest case fails as the patches are cut (a local member's tiles are checked as they are read): skipped too
    assert len(list(skip)) > 0 and skip.stats.totals()["skipped"] >= 1


def test_a_local_tiled_sample_reads_only_the_tiles_its_patches_touch(sources, tmp_path):
    """Local shards: a tiled member is read by range (header, index, tile headers, then the tiles
    the patches touch), not whole; the batches are the ones reading it whole gives."""
    src = tmp_path / "big"
    for i, p in enumerate(photos()[:3]):  # ~1200 x 1800: the shard is much more than its probe's 2 MiB
        big = np.tile(p[:400, :450], (3, 4, 1))
        save(src / f"b{i}.png", np.ascontiguousarray(big if i % 2 == 0 else big[:, ::-1]))
    ds = _built(src, tmp_path / "t", "--tiles", "96")
    whole = _built(src, tmp_path / "w")
    kw = dict(scale=4, patch_size=96, patches_per_image=2, batch_size=2, shuffle_buffer=0)
    got, batches = {}, {}
    for name, url in (("tiled", ds), ("whole", whole)):
        before = _rchar()  # bytes this process read through system calls (pread included), page cache or not
        batches[name] = list(wdsr.SRDataset(str(url), **kw))
        got[name] = _rchar() - before
    size = fmt.load(str(ds)).bytes
    assert got["whole"] > 0.9 * fmt.load(str(whole)).bytes and got["tiled"] < 0.5 * size, (got, size)
    cached = list(wdsr.SRDataset(str(ds), **kw, cache_dir=str(tmp_path / "cache")))  # through the shard cache
    for a, b, c in zip(batches["tiled"], batches["whole"], cached, strict=True):
        assert all(torch.equal(u, v) and torch.equal(v, w) for u, v, w in zip(a, b, c, strict=True))


def test_a_corrupt_tile_found_while_cutting_skips_its_sample_whole_and_resumes(sources, tmp_path, caplog):
    """A tile that fails its digest as the patches read it (a local member's tiles are checked as
    they are read): under ``fail`` the error names shard, key, member and tile; under ``skip`` the
    sample is skipped whole (none of its patches, counted and logged once), every batch still
    comes, and a resume anywhere gives the rest of the same stream."""
    ds = _built(sources, tmp_path / "t", "--tiles", "96")
    key = fmt.load(str(ds)).shards[0].keys[1]

    def edit(name: str, data: bytes) -> bytes:
        if name != f"{key}.hr.tiles":
            return data
        h = fmt.tiles.parse_header(data)
        buf = bytearray(data)
        for off in np.frombuffer(data[32 : h.data_start], dtype=fmt.tiles.INDEX_DTYPE)["offset"]:
            buf[int(off) + 30] ^= 0x5A  # past the tile's own header: only its digest tells
        return bytes(buf)

    _tamper(ds, edit)
    kw = dict(scale=4, patch_size=96, patches_per_image=3, batch_size=2, shuffle_buffer=4, return_keys=True)
    with pytest.raises(wdsr.SampleError) as exc:
        list(wdsr.SRDataset(str(ds), **kw))
    assert all(w in str(exc.value) for w in ("shard-000000.tar", repr(key), "hr.tiles", "tile ", "xxh3_64")), str(exc.value)
    skip = wdsr.SRDataset(str(ds), on_error="skip", **kw)
    loader = wdsr.make_loader(skip, num_workers=0)
    with caplog.at_level("WARNING", logger="wdsr"):
        full = [(lr.clone(), hr.clone(), keys) for lr, hr, keys in loader]
    assert len(full) == len(loader) > 2 and skip.stats.totals()["skipped"] == 1
    assert all(key not in keys for *_, keys in full)
    assert len([r for r in caplog.records if "skipping" in r.getMessage() and key in r.getMessage()]) == 1
    for n in (1, len(full) // 2):
        again = wdsr.make_loader(skip, num_workers=0)
        again.load_state_dict({**again.state_dict(), "epoch": 0, "batches": n})
        rest = list(again)
        assert len(rest) == len(full) - n
        assert all(
            torch.equal(a, c) and torch.equal(b, d) and k == m for (a, b, k), (c, d, m) in zip(rest, full[n:], strict=True)
        )
    two = wdsr.make_loader(wdsr.SRDataset(str(ds), on_error="skip", **kw), num_workers=2)
    assert len(list(two)) == len(two)
