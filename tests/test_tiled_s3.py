"""Remote tiled samples (S3 on 127.0.0.1) read by the tiles their patches touch: the same batches as
local disk and untiled, a fraction of the bytes, retries on tile reads, and a corrupt tile under
``on_error``."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import wdsr
from shardmaker import format as fmt
from tests.faultproxy import FaultProxy
from tests.helpers import S3_BUCKET, build_shards, mosaic, rewrite, save
from tests.s3server import s3fs_for

AMPLE = wdsr.Retry(attempts=30, backoff_s=0.05, max_backoff_s=0.5, timeout_s=2.0)


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> dict[str, Path]:
    """Three ~6 MB samples of real photos (over the 4 MiB above which a remote tiled sample is read
    by range), stored tiled (96 px) and whole."""
    root = tmp_path_factory.mktemp("tiled-s3")
    for i in range(3):
        m = mosaic(1700 + 40 * i, 1800 - 30 * i)
        save(root / "src" / f"m{i}.png", np.ascontiguousarray(m if i % 2 == 0 else m[::-1]))
    flags = ("--scale", "2,4", "--codec", "qoi")
    out = {"tiled": root / "tiled", "whole": root / "whole"}
    build_shards(root / "src", out["tiled"], *flags, "--tiles", "96")
    build_shards(root / "src", out["whole"], *flags)
    return out


@pytest.fixture()
def proxy(s3):
    p = FaultProxy(s3.port)
    yield p
    p.close()


def _upload(s3, local: Path, prefix: str) -> str:
    fs = s3fs_for(s3.endpoint)
    fs.put(str(local) + "/", f"{S3_BUCKET}/{prefix}/", recursive=True)
    return f"s3://{S3_BUCKET}/{prefix}"


def _dataset(url: str, **kw) -> wdsr.SRDataset:
    args = dict(scale=4, patch_size=96, patches_per_image=4, batch_size=4, shuffle_buffer=8, seed=3, return_keys=True)
    return wdsr.SRDataset(url, **{**args, **kw})


def _run(ds: wdsr.SRDataset, workers: int = 2, loader=None) -> list[tuple]:
    return [(lr.clone(), hr.clone(), keys) for lr, hr, keys in loader or wdsr.make_loader(ds, num_workers=workers)]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) > 0 and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2] == y[2] for x, y in zip(a, b, strict=True)
    )


def _body(proxy: FaultProxy, since: int = 0) -> int:
    return sum(e.body for e in proxy.exchanges[since:])


def test_remote_tiled_samples_read_only_the_tiles_their_patches_touch(s3, big, proxy):
    url = _upload(s3, big["tiled"], "tiled-ranges")
    for workers, kw in ((2, {}), (0, {"read_ahead": 0})):
        want = _run(_dataset(str(big["tiled"])), workers)
        assert _same(want, _run(_dataset(str(big["whole"])), workers))  # tiled = untiled, byte for byte
        ds = _dataset(url, storage_options={"endpoint_url": proxy.endpoint}, **kw)
        start = len(proxy.exchanges)
        loader = wdsr.make_loader(ds, num_workers=workers)
        n0 = len(proxy.exchanges)  # the loader's peek at a sample's json: headers only (not counted in stats)
        assert _same(_run(ds, loader=loader), want)
        fetched, size = _body(proxy, n0), fmt.load(str(big["tiled"])).bytes
        assert fetched < 0.4 * size, (fetched, size)  # 4 patches of 96 px in 6 MB images
        if proxy.server_errors == 0:  # every byte that came is counted, once
            assert ds.stats.totals()["bytes_read"] == fetched
        assert _body(proxy, start) - fetched < 3 * 70_000  # the peek: three tar headers' reads of 64 KiB
        # all the patches' tiles at once, merged: ~11 requests a sample here (3 of them tar headers); one
        # batch per patch would be ~13, one request per tile ~30
        assert len(proxy.exchanges) - n0 <= 12 * ds.stats.totals()["samples"] + proxy.server_errors
    # a whole image (val) too: its tiles in a few requests of up to 8 MiB, not one each (~700 here)
    n0 = len(proxy.exchanges)
    val = list(wdsr.SRDataset(url, scale=4, split="val", storage_options={"endpoint_url": proxy.endpoint}))
    local = list(wdsr.SRDataset(str(big["whole"]), scale=4, split="val"))
    assert len(val) == len(local) == 3
    assert all(a.key == b.key and torch.equal(a.lr, b.lr) and torch.equal(a.hr, b.hr) for a, b in zip(val, local, strict=True))
    assert len(proxy.exchanges) - n0 <= 16 * len(val) + proxy.server_errors
    # reading the members whole (the rule switched off) brings every byte; the same batches
    ds = _dataset(url, storage_options={"endpoint_url": proxy.endpoint})
    ds.reader.options = dataclasses.replace(ds.reader.options, ranged_tiles_over=None)
    n0 = len(proxy.exchanges)
    assert _same(_run(ds, workers=0), want)
    assert _body(proxy, n0) > 0.9 * size


def test_tile_reads_that_are_cut_resume_and_lose_nothing(s3, big, proxy):
    """Responses cut after 70 kB: never a tar header's read (64 KiB), only merged tile reads."""
    want = _run(_dataset(str(big["tiled"])), workers=0)
    url = _upload(s3, big["tiled"], "tiled-faults")
    ds = _dataset(url, retry=AMPLE, storage_options={"endpoint_url": proxy.endpoint})
    loader = wdsr.make_loader(ds, num_workers=0)
    proxy.cut_after(70_000, times=12)
    assert _same(_run(ds, loader=loader), want)
    cut = [e for e in proxy.exchanges if e.fault == "cut" and not e.done]
    assert cut and ds.stats.totals()["retries"] >= len(cut), (len(cut), ds.stats.totals()["retries"])


def _corrupt_hr_tiles(ds: Path, key: str) -> None:
    """Flip a byte past the header of every HR tile of ``key`` (its xxh3_64 in the index no longer
    matches; the tiles' headers still do), keeping the manifest's record of tiled samples."""
    doc = json.loads((ds / "manifest.json").read_text())

    def edit(name: str, data: bytes) -> tuple[str, bytes]:
        if name != f"{key}.hr.tiles":
            return name, data
        h = fmt.tiles.parse_header(data)
        index = np.frombuffer(data[32 : h.data_start], dtype=fmt.tiles.INDEX_DTYPE)
        buf = bytearray(data)
        for off in index["offset"]:
            buf[int(off) + 30] ^= 0x5A
        return name, bytes(buf)

    rewrite(ds, 0, edit)
    new = json.loads((ds / "manifest.json").read_text())
    new["shards"][0]["tiles"] = doc["shards"][0]["tiles"]  # rewrite() leaves it out
    (ds / "manifest.json").write_text(json.dumps(new))


def test_a_corrupt_tile_of_a_remote_sample_skips_it_whole_or_fails(s3, big, tmp_path, caplog):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in big["tiled"].iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    key = fmt.load(str(bad)).shards[0].keys[1]
    _corrupt_hr_tiles(bad, key)
    url = _upload(s3, bad, "tiled-corrupt")
    assert fmt.load(url).shards[0].tiled(1) == 96
    with pytest.raises(wdsr.SampleError) as exc:
        _run(_dataset(url), workers=0)
    assert all(w in str(exc.value) for w in ("shard-000000.tar", key, "hr.tiles", "tile ", "xxh3_64")), str(exc.value)
    good = _run(_dataset(str(big["tiled"]), on_error="skip"), workers=0)
    ds = _dataset(url, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="wdsr"):
        got = _run(ds, workers=0)
    assert len(got) == len(good) and ds.stats.totals()["skipped"] == 1  # every batch still comes
    assert all(key not in keys for _, _, keys in got)  # none of its patches: stand-ins from the others
    assert len([r for r in caplog.records if "skipping" in r.getMessage() and key in r.getMessage()]) == 1  # logged once


def test_remote_tiled_hr_for_degrade_and_bicubic_reads_the_patches_tiles(s3, big, proxy):
    """degrade= and lr="bicubic" of remote tiled samples: HR alone (its stored LR never read), the tiles
    the patches touch fetched together; the batches of local whole images."""
    url = _upload(s3, big["tiled"], "tiled-hr-only")
    size = fmt.load(str(big["tiled"])).bytes
    cfg = wdsr.RealESRGANConfig(gt_size=96)
    remote = {"storage_options": {"endpoint_url": proxy.endpoint}, "retry": AMPLE}
    for kw in ({"degrade": cfg}, {"lr": "bicubic"}):
        want = list(wdsr.make_loader(_dataset(str(big["whole"]), **kw), num_workers=2))
        ds = _dataset(url, **remote, **kw)
        loader = wdsr.make_loader(ds, num_workers=2)
        n0 = len(proxy.exchanges)
        got = list(loader)
        assert len(got) == len(want) > 2
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a[0], b[0]) and a[2] == b[2]
            assert all(torch.equal(a[1][k], b[1][k]) for k in a[1]) if "degrade" in kw else torch.equal(a[1], b[1])
        assert _body(proxy, n0) < 0.3 * size  # HR tiles of 4 patches; no LR member
