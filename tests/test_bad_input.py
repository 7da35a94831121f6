"""Each bad input: exit status 2, a message naming the file and the reason, nothing half-written."""

from __future__ import annotations

import errno
from pathlib import Path

import fsspec
import numpy as np
from fsspec.implementations.memory import MemoryFileSystem
from PIL import Image

from shardmaker.format import load as load_manifest
from tests.helpers import photos, save, sm


def assert_nothing_written(out: Path) -> None:
    assert not out.exists() or not any(p for p in out.rglob("*") if p.is_file())


def pair_tree(root: Path, n: int = 3, scale: int = 2) -> tuple[Path, Path]:
    hr, lr = root / "hr", root / "lr"
    for i in range(n):
        img = photos()[i][:64, :64]
        save(hr / f"p{i}.png", img)
        save(lr / f"p{i}x{scale}.png", img[::scale, ::scale])
    return hr, lr


def test_missing_and_empty_sources(capsys, tmp_path):
    rc, _, se = sm(capsys, "build", tmp_path / "nope", tmp_path / "o")
    assert rc == 2 and "nope: HR source folder does not exist" in se
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/readme.txt").write_text("not an image")
    rc, _, se = sm(capsys, "build", tmp_path / "empty", tmp_path / "o")
    assert rc == 2 and "empty: no images found" in se
    assert_nothing_written(tmp_path / "o")
    rc, _, se = sm(capsys, "build", tmp_path / "empty/readme.txt", tmp_path / "o")
    assert rc == 2 and "is a file, not a folder" in se
    save(tmp_path / "hr/x.png", photos()[0][:32, :32])
    rc, _, se = sm(capsys, "build", tmp_path / "hr", tmp_path / "empty/readme.txt")
    assert rc == 2 and "readme.txt: is a file, not a folder for shards" in se


def test_truncated_image_fails_or_is_skipped(capsys, tmp_path, hr_tree):
    bad = hr_tree / "a/img1.png"
    bad.write_bytes(bad.read_bytes()[:300])
    out = tmp_path / "o"
    rc, _, se = sm(capsys, "build", hr_tree, out, "--max-samples", "1")
    assert rc == 2 and str(bad) in se and ("truncated" in se or "corrupt" in se)
    assert not (out / "manifest.json").exists() and not list(out.rglob("*.partial"))
    rc, so, se = sm(capsys, "build", hr_tree, tmp_path / "o2", "--on-error", "skip")
    assert rc == 0, se
    assert "skipped 1 source file" in so and str(bad) in so
    m = load_manifest(str(tmp_path / "o2"))
    assert m.samples == 5 and m.build["skipped"][0]["path"] == str(bad)


def test_non_integer_ratio(capsys, tmp_path):
    hr, lr = pair_tree(tmp_path)
    save(lr / "p1x2.png", photos()[1][:40, :40])  # 64/40 is no integer scale
    rc, _, se = sm(capsys, "build", hr, tmp_path / "o", "--lr", lr)
    assert rc == 2 and "p1x2.png" in se and "not one integer scale" in se
    assert_nothing_written(tmp_path / "o")


def test_lr_without_hr_and_hr_without_lr(capsys, tmp_path):
    hr, lr = pair_tree(tmp_path)
    save(lr / "orphanx2.png", photos()[0][:32, :32])
    rc, _, se = sm(capsys, "build", hr, tmp_path / "o", "--lr", lr)
    assert rc == 2 and "orphanx2.png: LR image has no HR image" in se
    (lr / "orphanx2.png").unlink()
    (lr / "p2x2.png").unlink()
    rc, _, se = sm(capsys, "build", hr, tmp_path / "o", "--lr", lr)
    assert rc == 2 and "p2.png: HR image has no LR image" in se
    assert_nothing_written(tmp_path / "o")
    rc, so, se = sm(capsys, "build", hr, tmp_path / "o", "--lr", lr, "--on-error", "skip")
    assert rc == 0 and "p2.png: HR image has no LR image" in so
    assert load_manifest(str(tmp_path / "o")).samples == 2


def test_two_sources_with_one_key(capsys, tmp_path):
    hr = tmp_path / "hr"
    save(hr / "x.png", photos()[0][:32, :32])
    save(hr / "x.jpg", photos()[1][:32, :32])
    rc, _, se = sm(capsys, "build", hr, tmp_path / "o")
    assert rc == 2 and "x.png: maps to key 'x'" in se and "x.jpg" in se
    save(hr / "y_1.png", photos()[0][:32, :32])
    save(hr / "y.1.png", photos()[0][:32, :32])
    (hr / "x.jpg").unlink()
    rc, _, se = sm(capsys, "build", hr, tmp_path / "o")
    assert rc == 2 and "maps to key 'y_1'" in se
    assert_nothing_written(tmp_path / "o")


def test_rgba_needs_drop_alpha(capsys, tmp_path):
    hr = tmp_path / "hr"
    rgba = np.dstack([photos()[0][:48, :48], np.full((48, 48), 255, np.uint8)])
    save(hr / "alpha.png", rgba)
    rc, _, se = sm(capsys, "build", hr, tmp_path / "o")
    assert rc == 2 and "alpha.png: has an alpha channel" in se and "--drop-alpha" in se
    assert_nothing_written(tmp_path / "o")
    assert sm(capsys, "build", hr, tmp_path / "o", "--drop-alpha")[0] == 0


def test_decompression_bomb_limit(capsys, tmp_path):
    hr = tmp_path / "hr"
    save(hr / "big.png", photos()[0][:100, :120])
    rc, _, se = sm(capsys, "build", hr, tmp_path / "o", "--max-pixels", "10000")
    assert rc == 2 and "big.png: 120x100 = 12000 pixels is over the limit of 10000" in se
    assert_nothing_written(tmp_path / "o")


def test_unreadable_file(capsys, tmp_path):
    hr = tmp_path / "hr"
    save(hr / "ok.png", photos()[0][:32, :32])
    (hr / "junk.png").write_bytes(b"this is not a png at all")
    rc, _, se = sm(capsys, "build", hr, tmp_path / "o")
    assert rc == 2 and "junk.png" in se and "not a readable image" in se


class FailingFS(MemoryFileSystem):
    """An in-memory filesystem whose disk "fills up" after ``budget`` bytes."""

    protocol = "failmem"
    store: dict = {}
    pseudo_dirs = [""]
    budget = 0

    def _open(self, path, mode="rb", **kwargs):
        f = super()._open(path, mode, **kwargs)
        if "w" in mode:
            real_write = f.write

            def write(data):
                if FailingFS.budget < len(data):
                    raise OSError(errno.ENOSPC, "No space left on device")
                FailingFS.budget -= len(data)
                return real_write(data)

            f.write = write
        return f


def test_write_error_mid_build_leaves_no_manifest_and_no_partial_shard(capsys, tmp_path, hr_tree):
    fsspec.register_implementation("failmem", FailingFS, clobber=True)
    FailingFS.store.clear()
    FailingFS.budget = 60_000  # enough for a shard or two, not for all six samples
    rc, _, se = sm(capsys, "build", hr_tree, "failmem://out", "--max-samples", "1")
    assert rc == 2 and "No space left on device" in se and "shard-" in se
    names = sorted(FailingFS.store)
    assert names, "some complete shards were written before the disk filled"
    assert not any(n.endswith("manifest.json") for n in names)
    assert not any(n.endswith(".partial") for n in names)
    fs = FailingFS()
    for n in names:
        if n.endswith(".tar"):  # every shard that is there is complete: it ends with the tar end blocks
            assert fs.cat(n).endswith(b"\0" * 1024)
    # with room again, the rerun keeps those shards and finishes
    FailingFS.budget = 10**9
    rc, so, se = sm(capsys, "build", hr_tree, "failmem://out", "--max-samples", "1")
    assert rc == 0, se
    kept = int(so.split("(")[1].split(" shards kept")[0])
    assert kept >= 1
    assert sm(capsys, "verify", "failmem://out", "--deep")[0] == 0


def test_bad_flags_are_usage_errors(capsys, tmp_path, hr_tree):
    rc, _, se = sm(capsys, "build", hr_tree, tmp_path / "o", "--shard-size", "lots")
    assert rc == 2 and "not a size: 'lots'" in se and len(se.strip().splitlines()) == 1  # one line, no usage dump
    rc, _, se = sm(capsys, "build", hr_tree, tmp_path / "o", "--part", "3/3")
    assert rc == 2 and "--part" in se
    rc, _, se = sm(capsys, "build", hr_tree, tmp_path / "o", "--lr", hr_tree, "--scale", "3")
    assert rc == 2


def test_grey_image_with_qoi_names_the_file(capsys, tmp_path):
    hr = tmp_path / "hr"
    save(hr / "grey.png", photos()[0][:32, :32, 0].copy())
    rc, _, se = sm(capsys, "build", hr, tmp_path / "o", "--codec", "qoi")
    assert rc == 2 and "grey.png" in se and "QOI stores 8-bit RGB only" in se
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_palette_source_builds(capsys, tmp_path):
    hr = tmp_path / "hr"
    hr.mkdir()
    Image.fromarray(photos()[2][:40, :40]).convert("P").save(hr / "pal.png")
    assert sm(capsys, "build", hr, tmp_path / "o", "--scale", "2")[0] == 0
