"""``shardmaker ls`` and ``shardmaker cat``: real shards built from real photos, a foreign set
written by ``wds.ShardWriter`` and indexed, and shards tampered with after the build."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import webdataset as wds
from PIL import Image

from shardmaker import imaging
from tests.helpers import build_shards, load_rgb, photos, rewrite, save, sm


def _manifest(ds: Path) -> dict:
    return json.loads((ds / "manifest.json").read_text())


def _tar_members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_ls_lists_every_shard_and_with_keys_every_sample(capsys, photo_shards, photo_src):
    m = _manifest(photo_shards)
    rc, out, err = sm(capsys, "ls", photo_shards)
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].split() == ["shard", "samples", "bytes"]
    rows = [line.split() for line in lines[1:-1]]
    assert rows == [[s["name"], str(s["samples"]), str(s["bytes"])] for s in m["shards"]]
    assert [int(r[2]) for r in rows] == [(photo_shards / r[0]).stat().st_size for r in rows]
    assert lines[-1].split() == [str(len(m["shards"])), "shards", str(m["samples"]), str(m["bytes"])]

    rc, out, _ = sm(capsys, "ls", photo_shards, "--keys")
    assert rc == 0
    want = [[s["name"], k, f"{w}x{h}"] for s in m["shards"] for k, (w, h) in zip(s["keys"], s["hr_sizes"], strict=True)]
    assert [line.split() for line in out.splitlines()] == want
    sizes = {k: "{}x{}".format(*Image.open(photo_src / f"{k}.png").size) for _, k, _ in want}
    assert [wh for _, _, wh in want] == [sizes[k] for _, k, _ in want]  # those of the source photos
    assert len(want) == 10


def test_cat_writes_the_members_of_a_sample_as_in_the_shard(capsys, photo_shards, tmp_path):
    m = _manifest(photo_shards)
    for shard, i in ((m["shards"][1], 0), (m["shards"][1], 2), (m["shards"][3], 0)):  # first, last of a shard, last of the set
        key = shard["keys"][i]
        out = tmp_path / key
        rc, stdout, err = sm(capsys, "cat", photo_shards, key, "-o", out)
        assert rc == 0 and err == ""
        names = [f"{key}.json", f"{key}.hr.png", f"{key}.lr_x2.png", f"{key}.lr_x4.png"]
        assert stdout.splitlines() == [str(out / n) for n in names]
        in_tar = _tar_members(photo_shards / shard["name"])
        assert sorted(p.name for p in out.iterdir()) == sorted(names)
        for n in names:
            assert (out / n).read_bytes() == in_tar[n], n
        meta = json.loads((out / f"{key}.json").read_text())
        assert meta["key"] == key and list(Image.open(out / f"{key}.hr.png").size) == meta["hr_size"]


def _pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path))


def test_cat_assembles_a_tiled_sample_into_images(capsys, tmp_path):
    """A tiled sample's members are tiles: cat writes each as one PNG of the whole image, assembled."""
    hr = np.ascontiguousarray(photos()[1][:150, :200])
    save(tmp_path / "src" / "a.png", hr)
    ds = build_shards(tmp_path / "src", tmp_path / "ds", "--scale", "2,4", "--tiles", "64")
    capsys.readouterr()
    rc, stdout, err = sm(capsys, "cat", ds, "a", "-o", tmp_path / "out")
    assert rc == 0 and err == "", err
    out = tmp_path / "out"
    assert stdout.splitlines() == [
        str(out / "a.json"),
        f"{out / 'a.hr.png'}  (assembled from 12 tiles of 64 px)",
        f"{out / 'a.lr_x2.png'}  (assembled from 12 tiles of 32 px)",
        f"{out / 'a.lr_x4.png'}  (assembled from 12 tiles of 16 px)",
    ]
    assert np.array_equal(_pixels(out / "a.hr.png"), hr)  # PNG tiles: lossless
    for s in (2, 4):
        assert np.array_equal(_pixels(out / f"a.lr_x{s}.png"), imaging.downscale(hr[: 150 // s * s], s))


def test_cat_writes_a_clips_frames_hr_and_lr(capsys, tmp_path):
    """A clip segment: one file per frame, HR and LR; stored as tiles (--tiles), each frame assembled."""
    frames = [np.ascontiguousarray(photos()[0][t : t + 40, 2 * t : 2 * t + 64]) for t in range(3)]
    for t, f in enumerate(frames):
        save(tmp_path / "src" / "clip0" / f"{t:04d}.png", f)
    for tiles in ("off", "32"):
        ds = build_shards(tmp_path / "src", tmp_path / f"ds{tiles}", "--clips", "--scale", "4", "--tiles", tiles)
        key = _manifest(ds)["shards"][0]["keys"][0]
        out = tmp_path / f"out{tiles}"
        capsys.readouterr()
        rc, stdout, err = sm(capsys, "cat", ds, key, "-o", out)
        assert rc == 0 and err == "", err
        names = [f"{key}.json"] + [f"{key}.{side}_f{t:04d}.png" for t in range(3) for side in ("hr", "lr_x4")]
        assert [line.split("  (")[0] for line in stdout.splitlines()] == [str(out / n) for n in names]
        assert ("assembled from 4 tiles of 32 px" in stdout) == (tiles == "32")
        for t, f in enumerate(frames):
            assert np.array_equal(_pixels(out / f"{key}.hr_f{t:04d}.png"), f)
            assert np.array_equal(_pixels(out / f"{key}.lr_x4_f{t:04d}.png"), imaging.downscale(f, 4))


def test_cat_turns_slashes_in_keys_into_folders(capsys, hr_tree, tmp_path):
    ds = build_shards(hr_tree, tmp_path / "ds", "--scale", "4")
    rc, _, _ = sm(capsys, "cat", ds, "b/c/img3", "-o", tmp_path / "out")
    assert rc == 0
    got = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert got == ["b/c/img3.hr.png", "b/c/img3.json", "b/c/img3.lr_x4.png"]
    assert np.array_equal(load_rgb(tmp_path / "out/b/c/img3.hr.png"), load_rgb(hr_tree / "b/c/img3.png"))


def test_cat_of_a_missing_key_is_one_line_exit_2(capsys, photo_shards, tmp_path):
    rc, out, err = sm(capsys, "cat", photo_shards, "p0", "-o", tmp_path / "out")
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "'p0'" in err and f"shardmaker ls {photo_shards} --keys" in err and "close: p0" in err
    assert not (tmp_path / "out").exists()


def test_cat_checks_the_bytes_before_writing(capsys, photo_shards, tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    for p in photo_shards.iterdir():
        (ds / p.name).write_bytes(p.read_bytes())
    key = _manifest(ds)["shards"][0]["keys"][1]

    def flip_a_pixel(name: str, data: bytes) -> tuple[str, bytes]:
        if name != f"{key}.lr_x4.png":
            return name, data
        img = load_rgb(io.BytesIO(data)).copy()  # type: ignore[arg-type]
        img[0, 0, 0] ^= 1
        b = io.BytesIO()
        Image.fromarray(img).save(b, "PNG")
        return name, b.getvalue()

    rewrite(ds, 0, flip_a_pixel)  # manifest consistent again; the sample's own sha256 now disagrees
    rc, _, err = sm(capsys, "cat", ds, key, "-o", tmp_path / "out")
    assert rc == 2 and len(err.splitlines()) == 1
    assert "lr_x4.png does not match its sha256" in err and repr(key) in err
    assert not (tmp_path / "out").exists()

    shard = _manifest(ds)["shards"][0]
    cut = shard["offsets"][1]  # the shard cut short right after its first sample
    (ds / shard["name"]).write_bytes((ds / shard["name"]).read_bytes()[:cut])
    rc, _, err = sm(capsys, "cat", ds, shard["keys"][0], "-o", tmp_path / "first")
    assert rc == 0, err  # one range read of the sample's own bytes: the rest of the shard is never read
    rc, _, err = sm(capsys, "cat", ds, key, "-o", tmp_path / "out")
    assert rc == 2 and len(err.splitlines()) == 1 and "the manifest promises" in err


def _png(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, "PNG", compress_level=1)
    return b.getvalue()


def test_ls_and_cat_read_an_indexed_foreign_set(capsys, tmp_path):
    """Keys with dots and folders, LR before HR in one sample, another tool's member in between."""
    folder = tmp_path / "foreign"
    folder.mkdir()
    pics = {f"shots/img.{i}": np.ascontiguousarray(p[:96, :128]) for i, p in enumerate(photos()[:3])}
    with wds.ShardWriter(str(folder / "part-%04d.tar"), maxcount=2, verbose=0) as sink:
        for i, (key, hr) in enumerate(pics.items()):
            lr = np.ascontiguousarray(hr[::4, ::4])
            members = (
                {"x4.png": _png(lr), "txt": b"caption", "png": _png(hr)} if i == 1 else {"png": _png(hr), "x4.png": _png(lr)}
            )
            sink.write({"__key__": key, **members})
    assert sm(capsys, "index", folder, "--hr", "png", "--lr", "4:x4.png")[0] == 0

    rc, out, _ = sm(capsys, "ls", folder, "--keys")
    assert rc == 0 and [line.split() for line in out.splitlines()] == [
        ["part-0000.tar", "shots/img.0", "128x96"],
        ["part-0000.tar", "shots/img.1", "128x96"],
        ["part-0001.tar", "shots/img.2", "128x96"],
    ]
    rc, out, _ = sm(capsys, "cat", str(folder / "manifest.json"), "shots/img.1", "-o", tmp_path / "out")
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "out/shots").iterdir()) == ["img.1.png", "img.1.x4.png"]
    assert np.array_equal(load_rgb(tmp_path / "out/shots/img.1.png"), pics["shots/img.1"])
    assert np.array_equal(load_rgb(tmp_path / "out/shots/img.1.x4.png"), pics["shots/img.1"][::4, ::4])

    rc, _, err = sm(capsys, "cat", folder, "shots/img.9", "-o", tmp_path / "out2")
    assert rc == 2 and "'shots/img.9'" in err and "--keys" in err
