"""shardmaker build/merge/verify/info on real photos and real tar shards."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import fsspec
import numpy as np
import pytest

from shardmaker.format import tario
from shardmaker.format import load as load_manifest
from shardmaker.imaging import codecs
from tests.helpers import load_rgb, needs_refdata, photos, save, shard_hashes, sm


def samples(out: Path) -> dict[str, dict[str, bytes]]:
    """key -> {member suffix: bytes}, read with our tar reader through every shard."""
    found: dict[str, dict[str, bytes]] = {}
    for p in sorted(out.glob("shard-*.tar")):
        with open(p, "rb") as f:
            for name, _, data in tario.iter_members(f):
                key, ext = tario.split_name(name)
                found.setdefault(key, {})[ext] = data
    return found


@needs_refdata
def test_set5_with_provided_lr_folders_pairs_and_mod_crops(capsys, tmp_path, refdata):
    out = tmp_path / "set5"
    lr = refdata / "set5/LR_bicubic"
    rc, so, se = sm(capsys, "build", refdata / "set5/HR", out, "--lr", lr / "X2", "--lr", lr / "X3", "--lr", lr / "X4")
    assert rc == 0, se
    m = load_manifest(str(out))
    assert m.samples == 5 and m.scales == [2, 3, 4] and m.lr_method == "provided"
    got = samples(out)
    assert sorted(got) == ["baby", "bird", "butterfly", "head", "woman"]
    for key, members in got.items():
        meta = json.loads(members["json"])
        hr = codecs.decode(members["hr.png"], "png")
        assert np.array_equal(hr, load_rgb(refdata / f"set5/HR/{key}.png"))  # stored once, uncropped
        for s in (2, 3, 4):
            lr_img = codecs.decode(members[f"lr_x{s}.png"], "png")
            assert np.array_equal(lr_img, load_rgb(lr / f"X{s}/{key}x{s}.png"))
            lw, lh = meta["lr_sizes"][str(s)]
            assert meta["hr_crop"][str(s)] == [s * lw, s * lh]
            assert meta["lr_sources"][str(s)] == f"{key}x{s}.png"
        assert meta["sha256"]["hr.png"] == hashlib.sha256(members["hr.png"]).hexdigest()
    # head is 280x280: not a multiple of 3, so its x3 pair is mod-cropped
    head = json.loads(got["head"]["json"])
    assert head["hr_size"] == [280, 280] and head["hr_crop"]["3"] == [279, 279]
    rc, so, se = sm(capsys, "verify", out, "--deep")
    assert rc == 0 and "OK (deep)" in so


@needs_refdata
@pytest.mark.parametrize("method", ["matlab-uint8", "matlab"])
def test_generated_lr_is_bit_exact_through_the_shards(capsys, tmp_path, refdata, method):
    out = tmp_path / method
    rc, _, se = sm(capsys, "build", refdata / "set5/HR", out, "--scale", "2,3,4", "--lr-method", method, "--codec", "qoi")
    assert rc == 0, se
    got = samples(out)
    for key, members in got.items():
        for s in (2, 3, 4):
            lr_img = codecs.decode(members[f"lr_x{s}.qoi"], "qoi")
            ref = load_rgb(refdata / f"set5/LR_bicubic/X{s}/{key}x{s}.png")
            # Set5's LR files were made by the uint8 path: equal there, and not on the double path
            assert np.array_equal(lr_img, ref) == (method == "matlab-uint8")


def test_build_is_deterministic_whatever_the_worker_count(capsys, tmp_path, hr_tree):
    common = ["--scale", "2,4", "--max-samples", "2", "--seed", "3"]
    for name, workers in (("w1", 1), ("w1b", 1), ("w2", 2)):
        rc, _, se = sm(capsys, "build", hr_tree, tmp_path / name, "--workers", workers, *common)
        assert rc == 0, se
    h1 = shard_hashes(tmp_path / "w1")
    assert len(h1) == 3
    assert h1 == shard_hashes(tmp_path / "w1b") == shard_hashes(tmp_path / "w2")
    assert (tmp_path / "w1/manifest.json").read_bytes() == (tmp_path / "w2/manifest.json").read_bytes()
    rc, _, _ = sm(capsys, "build", hr_tree, tmp_path / "other_seed", "--scale", "2,4", "--max-samples", "2", "--seed", "4")
    keys = lambda d: [k for s in load_manifest(str(d)).shards for k in s.keys]  # noqa: E731
    assert sorted(keys(tmp_path / "w1")) == sorted(keys(tmp_path / "other_seed"))
    assert keys(tmp_path / "w1") != keys(tmp_path / "other_seed")


def test_shard_size_rollover_offsets_and_manifest(capsys, tmp_path, hr_tree):
    out = tmp_path / "o"
    rc, _, se = sm(capsys, "build", hr_tree, out, "--shard-size", "60kB")
    assert rc == 0, se
    m = load_manifest(str(out))
    assert m.samples == 6 and len(m.shards) >= 3
    assert not list(out.rglob("*.partial")) and not (out / "_build").exists()
    for info in m.shards:
        data = (out / info.name).read_bytes()
        assert len(data) == info.bytes and hashlib.sha256(data).hexdigest() == info.sha256
        assert info.samples == 1 or info.bytes <= 60_000
        for key, offset, size in zip(info.keys, info.offsets, info.hr_sizes):
            # a reader that seeks to the offset reads exactly that sample first
            with tarfile.open(fileobj=io.BytesIO(data[offset:]), mode="r|") as tf:
                first = [next(iter(tf)).name for _ in range(1)]
            assert first == [f"{key}.json"]
            names = [n for n, _, _ in tario.iter_members(io.BytesIO(data[offset:]))][:3]
            assert names == [f"{key}.json", f"{key}.hr.png", f"{key}.lr_x4.png"]
            meta = json.loads(next(tario.iter_members(io.BytesIO(data[offset:])))[2])
            assert meta["hr_size"] == size and meta["key"] == key
    rc, so, _ = sm(capsys, "info", out)
    assert rc == 0
    for word in ("samples    6", f"shards     {len(m.shards)}", "x4", "png", "matlab", "HR size"):
        assert word in so


def test_stock_webdataset_and_gnu_tar_read_our_shards(capsys, tmp_path, hr_tree):
    import shutil
    import subprocess

    import webdataset as wds

    out = tmp_path / "o"
    assert sm(capsys, "build", hr_tree, out, "--scale", "2,4")[0] == 0
    shard = out / "shard-000000.tar"
    seen = {}
    for sample in wds.WebDataset(str(shard), shardshuffle=False):
        seen[sample["__key__"]] = sorted(k for k in sample if not k.startswith("__"))
    assert len(seen) == 6
    assert set(map(tuple, seen.values())) == {("hr.png", "json", "lr_x2.png", "lr_x4.png")}
    assert "b/c/img3" in seen
    if shutil.which("tar"):
        listing = subprocess.run(["tar", "tvf", str(shard)], capture_output=True, text=True, check=True).stdout
        assert "b/c/img3.lr_x4.png" in listing and "0/0" in listing


def test_memory_url_output_and_16bit_grey(capsys, tmp_path):
    src = tmp_path / "g"
    grey16 = (photos()[1][:64, :96, 0].astype(np.uint16) * 257) | 3
    save(src / "g.png", grey16)
    url = "memory://wdsr-test/g16"
    assert sm(capsys, "build", src, url, "--scale", "2")[0] == 0
    fs = fsspec.filesystem("memory")
    assert fs.exists("/wdsr-test/g16/manifest.json")
    rc, so, _ = sm(capsys, "verify", url, "--deep")
    assert rc == 0
    with fs.open("/wdsr-test/g16/shard-000000.tar", "rb") as f:
        members = {tario.split_name(n)[1]: d for n, _, d in tario.iter_members(f)}
    hr = codecs.decode(members["hr.png"], "png")
    assert hr.dtype == np.uint16 and np.array_equal(hr, grey16)
    assert json.loads(members["json"])["bit_depth"] == 16
    fs.rm("/wdsr-test", recursive=True)


def test_parts_and_merge(capsys, tmp_path, hr_tree):
    out = tmp_path / "parts"
    rc, _, se = sm(capsys, "merge", out)
    assert rc == 2 and "no such folder" in se
    for i in range(3):
        assert sm(capsys, "build", hr_tree, out, "--part", f"{i}/3")[0] == 0
        if i == 1:
            rc, _, se = sm(capsys, "merge", out)
            assert rc == 2 and "parts [2] of 3 are not finished" in se
            assert not (out / "manifest.json").exists()
    rc, so, se = sm(capsys, "merge", out)
    assert rc == 0, se
    m = load_manifest(str(out))
    assert m.samples == 6 and len(m.shards) == 3
    assert sorted(k for s in m.shards for k in s.keys) == sorted(samples(out))
    assert sm(capsys, "verify", out, "--deep")[0] == 0
    # a part rerun after the merge has nothing to do
    assert sm(capsys, "build", hr_tree, out, "--part", "1/3")[0] == 0
    # more parts than images: the empty parts are fine
    many = tmp_path / "many"
    for i in range(8):
        assert sm(capsys, "build", hr_tree, many, "--part", f"{i}/8")[0] == 0
    assert sm(capsys, "merge", many)[0] == 0
    assert load_manifest(str(many)).samples == 6 and sm(capsys, "verify", many)[0] == 0


def test_rerun_is_a_no_op_and_a_different_dataset_is_refused(capsys, tmp_path, hr_tree):
    out = tmp_path / "o"
    assert sm(capsys, "build", hr_tree, out, "--max-samples", "2")[0] == 0
    before = shard_hashes(out)
    rc, so, _ = sm(capsys, "build", hr_tree, out, "--max-samples", "2")
    assert rc == 0 and shard_hashes(out) == before
    rc, _, se = sm(capsys, "build", hr_tree, out, "--scale", "3")
    assert rc == 2 and "different dataset" in se and "--overwrite" in se
    assert shard_hashes(out) == before and load_manifest(str(out)).scales == [4]
    rc, _, se = sm(capsys, "build", hr_tree, out, "--scale", "3", "--overwrite")
    assert rc == 0, se
    assert load_manifest(str(out)).scales == [3] and len(shard_hashes(out)) == 1


def test_an_out_inside_the_sources_is_refused(capsys, tmp_path, hr_tree):
    """A later scan of HR_SRC would walk the build's own output: refused before anything is written."""
    rc, _, se = sm(capsys, "build", hr_tree, Path(hr_tree) / "shards")
    assert rc == 2 and "OUT is inside the source folder" in se and len(se.strip().splitlines()) == 1, se
    assert not (Path(hr_tree) / "shards").exists()
    assert sm(capsys, "build", hr_tree, tmp_path / "beside", "--max-samples", "2")[0] == 0  # beside it is fine


def test_files_that_are_not_images_are_listed_in_the_summary(capsys, tmp_path, hr_tree):
    """notes.txt and a README beside the photos are left out of the dataset and named in the summary,
    never silently (hidden files, .DS_Store and the like, are not listed); the manifest is unchanged."""
    clean = tmp_path / "clean"
    assert sm(capsys, "build", hr_tree, clean)[0] == 0
    (Path(hr_tree) / "notes.txt").write_text("where these came from")
    (Path(hr_tree) / "b" / "README").write_text("x")
    (Path(hr_tree) / "a" / ".DS_Store").write_bytes(b"\0")
    rc, so, _ = sm(capsys, "build", hr_tree, tmp_path / "o")
    assert rc == 0
    assert "ignored 2 file(s) that are not images (1 (no extension), 1 .txt):" in so, so
    assert str(Path(hr_tree) / "notes.txt") in so and str(Path(hr_tree) / "b" / "README") in so
    assert ".DS_Store" not in so
    assert (tmp_path / "o" / "manifest.json").read_bytes() == (clean / "manifest.json").read_bytes()


def test_verify_names_shard_and_key(capsys, tmp_path, hr_tree):
    out = tmp_path / "o"
    assert sm(capsys, "build", hr_tree, out, "--max-samples", "3")[0] == 0
    m = load_manifest(str(out))
    info = m.shards[1]
    path = out / info.name
    data = bytearray(path.read_bytes())
    # corrupt one byte inside the second sample's HR member: sha256 of the shard changes
    key = info.keys[1]
    members = list(tario.iter_members(io.BytesIO(bytes(data))))
    hr_at = next(o for n, o, _ in members if n == f"{key}.hr.png")
    data[hr_at + 512 + 100] ^= 0x55  # a byte of the PNG data, past the member's header
    path.write_bytes(bytes(data))
    rc, _, se = sm(capsys, "verify", out)
    assert rc == 1 and f"{info.name}: sha256 does not match" in se
    # make the manifest agree with the corrupted bytes: only --deep can tell now
    doc = json.loads((out / "manifest.json").read_text())
    doc["shards"][1]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    (out / "manifest.json").write_text(json.dumps(doc))
    assert sm(capsys, "verify", out)[0] == 0
    rc, _, se = sm(capsys, "verify", out, "--deep")
    assert rc == 1 and f"{info.name} key '{key}'" in se and "hr.png" in se
    (out / m.shards[0].name).unlink()
    rc, _, se = sm(capsys, "verify", out)
    assert rc == 1 and f"{m.shards[0].name}: missing" in se


def test_several_hr_sources_and_brace_patterns_of_files(capsys, tmp_path, photo_src):
    import shutil

    import wdsr

    for name, pick in (("DIV2K", range(0, 3)), ("extra/Flickr2K", range(3, 6))):
        (tmp_path / name).mkdir(parents=True)
        for i in pick:
            shutil.copy(photo_src / f"p{i:02d}.png", tmp_path / name / f"{i:04d}.png")
    (tmp_path / "extra/Flickr2K/0000.png").write_bytes((tmp_path / "DIV2K/0000.png").read_bytes())  # same name, other source
    out = tmp_path / "df2k"
    rc, so, se = sm(capsys, "build", tmp_path / "DIV2K", tmp_path / "extra/Flickr2K", out, "--scale", "4")
    assert rc == 0, se
    m = load_manifest(str(out))
    keys = sorted(k for s in m.shards for k in s.keys)
    assert keys == [
        "DIV2K/0000",
        "DIV2K/0001",
        "DIV2K/0002",
        "extra/Flickr2K/0000",
        "extra/Flickr2K/0003",
        "extra/Flickr2K/0004",
        "extra/Flickr2K/0005",
    ]  # prefixed below the common folder: no collision
    rc, so, se = sm(capsys, "build", tmp_path / "DIV2K", tmp_path / "extra/Flickr2K", out, "--scale", "4")
    assert rc == 0 and len(load_manifest(str(out)).shards) == len(m.shards)  # a rerun finds it built
    ds = wdsr.SRDataset(str(out), scale=4, patch_size=48, patches_per_image=2, batch_size=2, return_keys=True)
    assert {k for _, _, ks in wdsr.make_loader(ds, num_workers=0) for k in ks} == set(keys)
    # a brace pattern of files: just those, keys as in a folder of them
    rc, so, se = sm(
        capsys, "build", f"{photo_src}/p0{{0..2}}.png", f"{photo_src}/p0{{7,9}}.png", tmp_path / "picked", "--scale", "4"
    )
    assert rc == 0, se
    assert sorted(k for s in load_manifest(str(tmp_path / "picked")).shards for k in s.keys) == [
        "p00",
        "p01",
        "p02",
        "p07",
        "p09",
    ]
    rc, so, se = sm(
        capsys, "build", f"{photo_src}/p0{{8..9}}.png", f"{photo_src}/p1{{0..1}}.png", tmp_path / "bad", "--scale", "4"
    )
    assert rc == 2 and "p10.png: no such image (named by the HR_SRC pattern)" in se
    rc, so, se = sm(capsys, "build", tmp_path / "DIV2K", tmp_path / "extra/Flickr2K", tmp_path / "x", "--lr", tmp_path / "DIV2K")
    assert rc == 2 and "--lr pairs with one HR folder" in se
