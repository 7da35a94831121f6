"""Images in place: ``shardmaker index DIR (--lr DIR | --hr-only) -o IDX`` then ``SRDataset(IDX)`` streams
the files themselves, with the batches the same images built into shards give (real photos, real
files, symbolic links, the S3 test server)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import wdsr
from shardmaker.cli import main as sm_main
from shardmaker.format import load as mf_load
from shardmaker.indexfiles import FileIndexConfig, index_files
from tests.faultproxy import FaultProxy
from tests.helpers import S3_BUCKET, build_shards, photos, save, shard_hashes, sm
from wdsr.errors import SampleError
from wdsr.tools.cli import main as wdsr_main

KW = dict(scale=4, patch_size=32, patches_per_image=4, batch_size=4, shuffle_buffer=8, seed=5, return_keys=True)


def _batches(url, workers: int = 0, **kw) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
    ds = wdsr.SRDataset(url if isinstance(url, list) else str(url), **{**KW, **kw})
    return [(lr.clone(), hr.clone(), list(keys)) for lr, hr, keys in wdsr.make_loader(ds, num_workers=workers)]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) > 0 and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2] == y[2] for x, y in zip(a, b, strict=True)
    )


def _to_s3(files: list[Path], prefix: str, folder: str = "hr") -> Any:
    """Each file put under ``s3://BUCKET/prefix/{folder}/`` (``folder=""``: under its own folder's name);
    the S3 filesystem, fresh, is returned for the test's own changes."""
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.clear_instance_cache()
    for f in files:
        fs.put(str(f), f"{S3_BUCKET}/{prefix}/{folder or f.parent.name}/{f.name}")
    return fs


def _copy(src: Path, dst: Path, names: list[str]) -> Path:
    dst.mkdir(parents=True)
    for n in names:
        shutil.copyfile(src / n, dst / n)
    return dst


@pytest.fixture(scope="module")
def hr_idx(tmp_path_factory, photo_src) -> Path:
    out = tmp_path_factory.mktemp("inplace") / "photos"
    assert sm_quiet("index", photo_src, "--hr-only", "-o", out) == 0
    return out


def sm_quiet(*args) -> int:
    return sm_main(["-q", *map(str, args)])


def test_pairs_stream_as_the_same_pairs_built_into_shards(tmp_path, refdata, capsys):
    hr, lr = refdata / "set5/HR", refdata / "set5/LR_bicubic"
    lrs = ["--lr", lr / "X2", "--lr", lr / "X3", "--lr", lr / "X4"]
    rc, out, err = sm(capsys, "index", hr, *lrs, "-o", tmp_path / "idx")
    assert rc == 0 and "5 samples" in out, err
    build_shards(hr, tmp_path / "shards", *map(str, lrs))
    m = json.loads((tmp_path / "idx/manifest.json").read_text())
    assert m["files"]["lr"]["3"] == str(lr / "X3") and m["shards"][0]["files"]["lr_x3.png"]["paths"][0].endswith("x3.png")
    for scale in (3, 4):
        got = _batches(tmp_path / "idx", scale=scale, patch_size=8 * scale)
        assert _same(got, _batches(tmp_path / "shards", scale=scale, patch_size=8 * scale))
    assert {k for _, _, ks in got for k in ks} == {"baby", "bird", "butterfly", "head", "woman"}
    val = [list(x)[:3] for x in wdsr.SRDataset(str(tmp_path / "idx"), scale=4, split="val")]
    want = [list(x)[:3] for x in wdsr.SRDataset(str(tmp_path / "shards"), scale=4, split="val")]
    assert len(val) == 5 and all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2] for a, b in zip(val, want, strict=True)
    )


def test_hr_only_with_bicubic_is_byte_identical_to_shards_of_the_same_photos(tmp_path, photo_src, hr_idx):
    build_shards(photo_src, tmp_path / "hr_only", "--hr-only")
    got = _batches(hr_idx, lr="bicubic")
    assert _same(got, _batches(tmp_path / "hr_only", lr="bicubic"))
    build_shards(photo_src, tmp_path / "stored", "--scale", "4")  # MATLAB LR made at build time, stored
    assert _same(got, _batches(tmp_path / "stored"))
    with pytest.raises(ValueError, match="HR-only dataset"):
        wdsr.SRDataset(str(hr_idx), **KW)


def test_a_symlinked_file_is_followed_as_build_follows_it(tmp_path, photo_src):
    src = _copy(photo_src, tmp_path / "src", ["p00.png"])
    os.symlink(photo_src / "p01.png", src / "linked.png")
    assert sm_quiet("index", src, "--hr-only", "-o", tmp_path / "idx") == 0
    build_shards(src, tmp_path / "shards", "--hr-only")
    got = _batches(tmp_path / "idx", lr="bicubic")
    assert _same(got, _batches(tmp_path / "shards", lr="bicubic"))
    assert {k for _, _, ks in got for k in ks} == {"p00", "linked"}


def test_a_changed_file_is_a_sample_error_naming_it_and_a_removed_one_is_skipped(tmp_path, photo_src):
    src = _copy(photo_src, tmp_path / "src", ["p00.png", "p01.png", "p02.png"])
    assert sm_quiet("index", src, "--hr-only", "-o", tmp_path / "idx") == 0
    before = _batches(tmp_path / "idx", lr="bicubic")
    data = bytearray((src / "p01.png").read_bytes())
    data[-20] ^= 1  # same size, another byte: only the digest tells
    (src / "p01.png").write_bytes(bytes(data))
    with pytest.raises(SampleError, match=r"key 'p01': .*p01\.png: its xxh3_64 differs from the index's"):
        _batches(tmp_path / "idx", lr="bicubic")
    save(src / "p01.png", np.zeros((64, 64, 3), np.uint8))  # another size
    with pytest.raises(SampleError, match=r"p01\.png: \d+ bytes, the index says \d+"):
        _batches(tmp_path / "idx", lr="bicubic")
    (src / "p01.png").unlink()
    with pytest.raises(SampleError, match=r"p01\.png: missing \(removed since it was indexed\)"):
        _batches(tmp_path / "idx", lr="bicubic")
    got = _batches(tmp_path / "idx", lr="bicubic", on_error="skip")
    keys = [k for _, _, ks in got for k in ks]
    assert set(keys) == {"p00", "p02"} and len(got) == len(before)  # equal batches all the same: the epoch's length holds


def test_exact_mid_epoch_resume_over_groups_of_files(tmp_path, photo_src):
    cfg = FileIndexConfig(hr_only=True, group_bytes=150_000, progress=False)
    res = index_files(str(photo_src), str(tmp_path / "idx"), cfg)
    assert len(res.manifest.shards) >= 3
    url, kw = str(tmp_path / "idx"), dict(KW, lr="bicubic", seed=9)

    def run(state=None, stop=None):
        loader = wdsr.make_loader(wdsr.SRDataset(url, **kw), num_workers=2, persistent_workers=False)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for lr, hr, keys in loader:
            out.append((lr.clone(), hr.clone(), list(keys)))
            if stop is not None and len(out) == stop:
                break
        return out, loader.state_dict()

    whole, _ = run()
    first, state = run(stop=len(whole) // 2)
    rest, _ = run(state=state)
    assert _same(first + rest, whole)


def test_mixes_with_a_shard_dataset(photo_shards, hr_idx):
    got = _batches([str(hr_idx), str(photo_shards)], lr="bicubic", weights=[1, 1], epoch_samples=20)
    assert len(got) == 20 * KW["patches_per_image"] // KW["batch_size"]


def test_an_s3_prefix_is_indexed_and_streamed_as_the_local_folder(tmp_path, photo_src, s3):
    names = ["p03.png", "p04.png", "p05.png"]
    fs = _to_s3([photo_src / n for n in names], "inplace")
    local = _copy(photo_src, tmp_path / "local", names)
    assert sm_quiet("index", local, "--hr-only", "-o", tmp_path / "idx") == 0
    assert sm_quiet("index", f"s3://{S3_BUCKET}/inplace/hr/", "--hr-only", "-o", f"s3://{S3_BUCKET}/inplace/idx") == 0
    want = _batches(tmp_path / "idx", lr="bicubic")
    assert _same(_batches(f"s3://{S3_BUCKET}/inplace/idx", lr="bicubic"), want)
    proxy = FaultProxy(s3.port)  # one GET per file, cut or refused: retried, resumed at the byte reached
    try:
        opts = {"endpoint_url": proxy.endpoint}
        retry = wdsr.Retry(attempts=30, backoff_s=0.05, max_backoff_s=0.5, timeout_s=2.0)
        ds = wdsr.SRDataset(f"s3://{S3_BUCKET}/inplace/idx", storage_options=opts, retry=retry, **{**KW, "lr": "bicubic"})
        loader = wdsr.make_loader(ds, num_workers=0)
        proxy.cut_after(40_000, times=2)
        proxy.fail_503(times=2)
        got = [(lr, hr, list(keys)) for lr, hr, keys in loader]
        assert _same(got, want) and proxy.faults == 4 and proxy.pending() == 0
        pngs = [p for p in proxy.paths if p.endswith(b".png")]
        assert sorted(set(pngs)) == [f"/{S3_BUCKET}/inplace/hr/{n}".encode() for n in names]
        assert len(pngs) <= len(names) + proxy.faults + proxy.server_errors  # one GET a file, and one per fault
    finally:
        proxy.close()
    fs.rm(f"{S3_BUCKET}/inplace/hr/p04.png")
    with pytest.raises(SampleError, match=r"p04\.png"):
        _batches(f"s3://{S3_BUCKET}/inplace/idx", lr="bicubic")


def test_index_refuses_bad_requests_in_one_line(tmp_path, photo_src, capsys):
    rc, _, err = sm(capsys, "index", photo_src, "--hr-only", "--lr", tmp_path, "-o", tmp_path / "i")
    assert rc == 2 and "--hr-only" in err and len(err.strip().splitlines()) == 1
    rc, _, err = sm(capsys, "index", photo_src, "--hr-only", "-o", photo_src / "idx")
    assert rc == 2 and "inside the source" in err and not (photo_src / "idx").exists()
    rc, _, err = sm(capsys, "index", photo_src, "--hr-only")
    assert rc == 2 and "-o IDX" in err
    rc, _, err = sm(capsys, "index", photo_src, "--lr", "4:x4.png", "-o", tmp_path / "i")
    assert rc == 2 and "give --hr NAME too" in err


def test_build_from_an_index_writes_the_shards_a_build_from_the_folder_writes(tmp_path, refdata, photo_src, hr_idx, capsys):
    hr, lr = refdata / "set5/HR", refdata / "set5/LR_bicubic"
    lrs = ["--lr", lr / "X2", "--lr", lr / "X4"]
    assert sm_quiet("index", hr, *lrs, "-o", tmp_path / "idx") == 0
    build_shards(hr, tmp_path / "folder", *map(str, lrs))
    assert sm_quiet("build", "--from", tmp_path / "idx", tmp_path / "from", "--workers", "1") == 0
    assert shard_hashes(tmp_path / "from") == shard_hashes(tmp_path / "folder") != {}
    flags = ["--scale", "2,4", "--codec", "qoi", "--max-samples", "4"]
    build_shards(photo_src, tmp_path / "folder2", *flags)
    assert sm_quiet("build", "--from", hr_idx, tmp_path / "from2", "--workers", "1", *flags) == 0
    assert shard_hashes(tmp_path / "from2") == shard_hashes(tmp_path / "folder2") != {}
    src = _copy(photo_src, tmp_path / "src", ["p00.png", "p01.png"])
    assert sm_quiet("index", src, "--hr-only", "-o", tmp_path / "idx3") == 0
    save(src / "p01.png", np.zeros((64, 64, 3), np.uint8))
    rc, _, err = sm(capsys, "build", "--from", tmp_path / "idx3", tmp_path / "from3", "--hr-only")
    assert rc == 2 and "p01.png" in err and "the index says" in err
    rc, out, err = sm(capsys, "build", "--from", tmp_path / "idx3", tmp_path / "from3", "--hr-only", "--on-error", "skip")
    assert rc == 0 and "1 samples" in out and "p01.png" in out, out


def test_verify_info_ls_and_cat_work_on_an_index(tmp_path, refdata, capsys):
    hr, lr = refdata / "set5/HR", refdata / "set5/LR_bicubic"
    src = tmp_path / "hr"
    shutil.copytree(hr, src)
    idx = tmp_path / "idx"
    assert sm_quiet("index", src, "--lr", lr / "X4", "-o", idx) == 0
    rc, out, _ = sm(capsys, "verify", idx, "--deep")
    assert rc == 0 and "OK (deep)" in out
    rc, out, _ = sm(capsys, "info", idx)
    assert rc == 0 and f"image files in place (groups of files, not shards): HR under {src}, x4 LR under {lr / 'X4'}" in out
    rc, out, _ = sm(capsys, "ls", idx, "--keys")
    assert rc == 0 and "files-000000.tar  baby  512x512" in out
    rc, out, _ = sm(capsys, "cat", idx, "bird", "-o", tmp_path / "cat")
    assert rc == 0 and (tmp_path / "cat/bird.hr.png").read_bytes() == (src / "bird.png").read_bytes()
    assert (tmp_path / "cat/bird.lr_x4.png").read_bytes() == (lr / "X4/birdx4.png").read_bytes()
    data = bytearray((src / "head.png").read_bytes())
    data[100] ^= 0xFF
    (src / "head.png").write_bytes(bytes(data))
    (src / "woman.png").unlink()
    rc, _, err = sm(capsys, "verify", idx)
    assert rc == 1 and "key 'head'" in err and "head.png: its xxh3_64 differs" in err, err
    assert "woman.png: missing (removed since it was indexed)" in err and "2 problem(s)" in err


def test_the_column_index_gives_the_json_s_entries_and_verify_compares_them(tmp_path, photo_src, capsys):
    res = index_files(str(photo_src), str(tmp_path / "idx"), FileIndexConfig(hr_only=True, group_bytes=200_000, progress=False))
    assert (tmp_path / "idx/manifest.json.idx").is_file()
    mapped = mf_load(str(tmp_path / "idx"), compact=True)
    parsed = mf_load(str(tmp_path / "idx"), index=False)
    assert (
        [s.to_json() for s in mapped.shards] == [s.to_json() for s in parsed.shards] == [s.to_json() for s in res.manifest.shards]
    )
    assert mapped.files == parsed.files and len(mapped.shards) >= 3
    rc, out, _ = sm(capsys, "info", tmp_path / "idx")
    assert rc == 0 and "manifest.json.idx (the reader maps it" in out
    rc, out, err = sm(capsys, "verify", tmp_path / "idx")
    assert rc == 0 and "OK" in out, err


def test_every_rank_gets_as_many_batches_and_together_every_file(hr_idx):
    runs = [_batches(hr_idx, lr="bicubic", world=wdsr.env.World(r, 3)) for r in range(3)]
    assert len({len(r) for r in runs}) == 1 and len(runs[0]) > 0
    assert {k for run in runs for _, _, ks in run for k in ks} == {f"p{i:02d}" for i in range(10)}


def test_no_digest_checks_sizes_and_mtimes_and_a_crafted_path_cannot_leave_its_root(tmp_path, photo_src, capsys):
    src = _copy(photo_src, tmp_path / "src", ["p00.png", "p01.png"])
    rc, out, _ = sm(capsys, "index", src, "--hr-only", "--no-digest", "-o", tmp_path / "idx")
    assert rc == 0 and "sizes and ETag/mtime (--no-digest)" in out
    m = json.loads((tmp_path / "idx/manifest.json").read_text())
    assert (m["files"]["digest"], m["files"]["version"]) == ("stamp", 3)
    want = _batches(tmp_path / "idx", lr="bicubic")
    assert want
    old = bytearray((src / "p01.png").read_bytes())
    stat = (src / "p01.png").stat()
    data = bytearray(old)
    data[-20] ^= 1  # same size, other pixels (its mtime moved on: set, so no clock tick can hide it)
    (src / "p01.png").write_bytes(bytes(data))
    os.utime(src / "p01.png", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(SampleError, match=r"key 'p01': .*p01\.png: its ETag/mtime differs from the index's"):
        _batches(tmp_path / "idx", lr="bicubic")
    rc, _, err = sm(capsys, "verify", tmp_path / "idx")
    assert rc == 1 and "p01.png: its ETag/mtime differs" in err, err
    (src / "p01.png").write_bytes(bytes(old) + b"\0")  # grown: its size tells
    with pytest.raises(SampleError, match=r"p01\.png: \d+ bytes, the index says"):
        _batches(tmp_path / "idx", lr="bicubic")
    (src / "p01.png").write_bytes(bytes(old))
    os.utime(src / "p01.png", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert _same(_batches(tmp_path / "idx", lr="bicubic"), want)
    (tmp_path / "idx/manifest.json").write_text(json.dumps({**m, "files": {**m["files"], "version": 2}}))  # before mixed sides
    (tmp_path / "idx/manifest.json.idx").unlink()
    assert _same(_batches(tmp_path / "idx", lr="bicubic"), want)
    v1 = {**m, "files": {**m["files"], "version": 1, "digest": "none"}}  # written before stamps: sizes alone
    for c in v1["shards"][0]["files"].values():
        c["xxh3_64"] = ["0" * 16] * len(c["xxh3_64"])
    (tmp_path / "idx/manifest.json").write_text(json.dumps(v1))
    os.utime(src / "p01.png", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert _same(_batches(tmp_path / "idx", lr="bicubic"), want)
    m["shards"][0]["files"]["hr.png"]["paths"][0] = "../src/p00.png"
    (tmp_path / "idx/manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=r"files\.hr\.png\.paths\[0\]: a file path has a '\.' or '\.\.' segment"):
        wdsr.SRDataset(str(tmp_path / "idx"), **{**KW, "lr": "bicubic"})


def test_the_decoded_cache_serves_an_index_with_the_same_batches(tmp_path, refdata):
    assert sm_quiet("index", refdata / "set5/HR", "--lr", refdata / "set5/LR_bicubic/X2", "-o", tmp_path / "idx") == 0
    cache = tmp_path / "decoded"
    cache.mkdir(mode=0o700)
    kw = dict(scale=2, patch_size=32)
    want = _batches(tmp_path / "idx", **kw)
    assert _same(_batches(tmp_path / "idx", decoded_cache=str(cache), **kw), want)
    assert any(cache.rglob("*")) and _same(_batches(tmp_path / "idx", decoded_cache=str(cache), **kw), want)


def test_degrade_draws_the_hr_patches_and_parameters_shards_of_the_same_photos_give(tmp_path, photo_src, hr_idx):
    build_shards(photo_src, tmp_path / "hr_only", "--hr-only")

    def run(url) -> list:
        kw = dict(scale=4, patch_size=256, patches_per_image=2, batch_size=2, seed=3, on_error="skip")
        ds = wdsr.SRDataset(str(url), degrade=wdsr.RealESRGANConfig(), **kw)
        return [(hr.clone(), {k: v.clone() for k, v in params.items()}) for hr, params in wdsr.make_loader(ds, num_workers=0)]

    got, want = run(hr_idx), run(tmp_path / "hr_only")
    assert len(got) == len(want) > 0
    for (a, pa), (b, pb) in zip(got, want, strict=True):
        assert torch.equal(a, b) and pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def test_wdsr_train_takes_an_index_as_its_data(tmp_path, refdata):
    assert sm_quiet("index", refdata / "set5/HR", "--lr", refdata / "set5/LR_bicubic/X4", "-o", tmp_path / "idx") == 0
    small = ["--patch-size", "32", "-k", "2", "--batch-size", "4", "--workers", "0", "--val-every", "0", "--log-every", "1"]
    argv = ["train", "--data", str(tmp_path / "idx"), "--out", str(tmp_path / "run"), "--model", "espcn", *small, "--steps", "2"]
    assert wdsr_main(argv) == 0
    lines = [json.loads(x) for x in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "loss" in x] == [1, 2]


def test_images_over_max_pixels_are_refused_from_their_headers(tmp_path, photo_src, capsys):
    rc, _, err = sm(capsys, "index", photo_src, "--hr-only", "--max-pixels", "60000", "-o", tmp_path / "idx")
    assert rc == 2 and "is over max_pixels=60000" in err and len(err.strip().splitlines()) == 1
    rc, out, _ = sm(
        capsys, "index", photo_src, "--hr-only", "--max-pixels", "60000", "-o", tmp_path / "idx", "--on-error", "skip"
    )
    m = json.loads((tmp_path / "idx/manifest.json").read_text())
    assert rc == 0 and 0 < m["build"]["skipped_count"] < 10 and m["samples"] == 10 - m["build"]["skipped_count"]
    assert all("max_pixels=60000" in s["reason"] for s in m["build"]["skipped"]), m["build"]["skipped"]


def test_the_node_cache_keeps_remote_files_whole_for_later_epochs(tmp_path, photo_src, s3):
    fs = _to_s3([photo_src / n for n in ("p06.png", "p07.png")], "inplace-cache")
    url = f"s3://{S3_BUCKET}/inplace-cache/idx"
    assert sm_quiet("index", f"s3://{S3_BUCKET}/inplace-cache/hr", "--hr-only", "-o", url) == 0
    ds = wdsr.SRDataset(url, cache_dir=str(tmp_path / "cache"), **{**KW, "lr": "bicubic"})
    loader = wdsr.make_loader(ds, num_workers=0)
    first = [(lr.clone(), hr.clone(), list(k)) for lr, hr, k in loader]
    got = ds.stats.totals()
    assert (got["cache_misses"], got["cache_hits"]) == (2, 0)
    kept = sorted(p.name for p in (tmp_path / "cache").rglob("*-file-*.tar"))
    assert len(kept) == 2
    fs.rm(f"{S3_BUCKET}/inplace-cache/hr/p07.png")  # later epochs read the node's copies, not the store
    ds.set_epoch(0)
    again = [(lr.clone(), hr.clone(), list(k)) for lr, hr, k in loader]
    assert _same(again, first) and ds.stats.totals()["cache_hits"] == 2


def test_indexing_an_s3_prefix_reads_each_file_with_one_get(tmp_path, refdata, s3):
    hr, lr = refdata / "set5/HR", refdata / "set5/LR_bicubic/X4"
    _to_s3([*hr.glob("*.png"), *lr.glob("*.png")], "inplace-gets", folder="")
    proxy = FaultProxy(s3.port)
    try:
        cfg = FileIndexConfig(lr=(f"s3://{S3_BUCKET}/inplace-gets/X4",), progress=False)
        cfg = dataclasses.replace(cfg, storage_options={"endpoint_url": proxy.endpoint})
        res = index_files(f"s3://{S3_BUCKET}/inplace-gets/HR", str(tmp_path / "idx"), cfg)
        pngs = {p: n for p, n in proxy.paths.items() if p.endswith(b".png")}
    finally:
        proxy.close()
    assert res.manifest.samples == 5 and len(pngs) == 10 and set(pngs.values()) == {1}, pngs
    want = index_files(str(hr), str(tmp_path / "local"), FileIndexConfig(lr=(str(lr),), progress=False)).manifest
    assert [s.files["lr_x4.png"].xxh3_64.tolist() for s in res.manifest.shards] == [
        s.files["lr_x4.png"].xxh3_64.tolist() for s in want.shards
    ]


def test_no_digest_on_s3_catches_an_object_replaced_by_one_of_the_same_size(tmp_path, photo_src, s3):
    fs = _to_s3([photo_src / n for n in ("p08.png", "p09.png")], "inplace-stamp")
    url = f"s3://{S3_BUCKET}/inplace-stamp/idx"
    assert sm_quiet("index", f"s3://{S3_BUCKET}/inplace-stamp/hr", "--hr-only", "--no-digest", "-o", url) == 0
    assert _batches(url, lr="bicubic")
    data = bytearray((photo_src / "p09.png").read_bytes())
    data[-20] ^= 1
    fs.pipe(f"{S3_BUCKET}/inplace-stamp/hr/p09.png", bytes(data))
    with pytest.raises(SampleError, match=r"key 'p09': .*p09\.png: its ETag/mtime differs from the index's"):
        _batches(url, lr="bicubic")


def test_indexing_holds_less_than_1_6_kb_a_file_at_its_peak(tmp_path):
    import tracemalloc

    from bench.index_scale import local_model

    src = local_model(tmp_path, 8000)  # one tiny PNG under 8,000 names
    tracemalloc.start()
    try:
        index_files(src, str(tmp_path / "idx"), FileIndexConfig(hr_only=True, progress=False))
        per_file = tracemalloc.get_traced_memory()[1] / 8000
    finally:
        tracemalloc.stop()
    assert per_file < 1600, f"{per_file:.0f} bytes a file"  # was 4.3 KB: the listing, pairs and 8 MiB reads at once


def test_elastic_resume_from_world_2_to_world_3_hands_out_every_patch_once(tmp_path, refdata):
    from collections import Counter

    from tests.test_loader_state import _make, _patches

    idx = tmp_path / "idx"
    assert sm_quiet("index", refdata / "set5/HR", "--lr", refdata / "set5/LR_bicubic/X4", "-o", idx) == 0
    url, kw = str(idx), dict(scale=4, patch_size=32, patches_per_image=6, batch_size=1, shuffle_buffer=8, seed=4)
    every = Counter(p for r in range(2) for p in _patches(_make(url, wdsr.env.World(r, 2), **{**kw, "shuffle_buffer": 0}), 0)[0])
    stop = len(wdsr.make_loader(_make(url, wdsr.env.World(0, 2), **kw), num_workers=0)) // 2
    consumed, state = Counter(), None
    for r in range(2):  # a mid-epoch checkpoint of world 2 (the same state on both ranks)
        got, state, _ = _patches(_make(url, wdsr.env.World(r, 2), **kw), 0, stop=stop)
        consumed.update(got)
    resumed, counts, reports = Counter(), [], []
    for r in range(3):  # ... resumed by world 3
        got, after, loader = _patches(_make(url, wdsr.env.World(r, 3), **kw), 0, state=state)
        resumed.update(got)
        counts.append(len(got))
        reports.append(loader.elastic_report)
        assert (after["epoch"], after["batches"]) == (1, 0)
    assert len(set(counts)) == 1 and reports[0] is not None and all(x == reports[0] for x in reports)
    assert max((consumed + resumed).values()) == 1 and set(consumed + resumed) <= set(every)  # nothing twice, nothing made up
    missing = set(every) - set(consumed + resumed)
    assert len(missing) == reports[0]["dropped"] and reports[0]["patches"] == len(every) - len(consumed)


def test_a_folder_mixing_png_jpeg_and_webp_streams_each_file_as_its_format(tmp_path, capsys):
    pics = photos()
    src, lr = tmp_path / "src", tmp_path / "lr"
    for name, i in (("a.png", 0), ("b.jpg", 1), ("c.webp", 2)):
        save(src / name, np.ascontiguousarray(pics[i][:96, :112]), **({"quality": 90} if name != "a.png" else {}))
    for name, i in (("ax2.png", 0), ("bx2.jpg", 1)):  # provided LR, mixed too (c has none: HR-only case alone)
        save(lr / name, np.ascontiguousarray(pics[i][:96:2, :112:2]))
    assert sm_quiet("index", src, "--hr-only", "-o", tmp_path / "idx") == 0
    m = json.loads((tmp_path / "idx/manifest.json").read_text())
    assert m["members"]["hr"] == "hr.img" and m["files"]["version"] == 3
    (tmp_path / "v2").mkdir()  # an older version cannot name a mixed side
    (tmp_path / "v2/manifest.json").write_text(json.dumps({**m, "files": {**m["files"], "version": 2}}))
    with pytest.raises(
        ValueError, match=r"members: 'hr.img': a side of mixed formats is only in an index of files \(version 3\)"
    ):
        wdsr.SRDataset(str(tmp_path / "v2"), **{**KW, "lr": "bicubic"})
    build_shards(src, tmp_path / "shards", "--hr-only")
    got = _batches(tmp_path / "idx", lr="bicubic")
    assert _same(got, _batches(tmp_path / "shards", lr="bicubic"))
    assert {k for _, _, ks in got for k in ks} == {"a", "b", "c"}
    assert sm_quiet("build", "--from", tmp_path / "idx", tmp_path / "from", "--workers", "1", "--scale", "4") == 0
    build_shards(src, tmp_path / "folder", "--scale", "4")
    assert shard_hashes(tmp_path / "from") == shard_hashes(tmp_path / "folder") != {}
    (src / "c.webp").unlink()
    assert sm_quiet("index", src, "--lr", lr, "-o", tmp_path / "pidx") == 0
    build_shards(src, tmp_path / "pshards", "--lr", str(lr))
    assert _same(_batches(tmp_path / "pidx", scale=2, patch_size=16), _batches(tmp_path / "pshards", scale=2, patch_size=16))
    rc, out, err = sm(capsys, "verify", tmp_path / "pidx", "--deep")
    assert rc == 0 and "OK (deep)" in out, err
    rc, out, _ = sm(capsys, "info", tmp_path / "pidx")
    assert rc == 0 and "hr.img" in out
    assert sm_quiet("cat", tmp_path / "pidx", "b", "-o", tmp_path / "cat") == 0
    assert (tmp_path / "cat/b.hr.jpg").read_bytes() == (src / "b.jpg").read_bytes()
    assert (tmp_path / "cat/b.lr_x2.jpg").read_bytes() == (lr / "bx2.jpg").read_bytes()
