"""``shardmaker index``: shards that another tool wrote (``wds.ShardWriter``, Python's tarfile)
indexed in place, then streamed by ``SRDataset`` with its guarantees (real tar files, real images,
real DataLoader workers)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

import wdsr
from shardmaker.cli import main as sm_main
from shardmaker import format as mf
from shardmaker.imaging.resize import ResizeMethod, downscale
from shardmaker.verify import info_text, verify
from tests.helpers import S3_BUCKET, load_rgb, photos

SET5 = ("baby", "bird", "butterfly", "head", "woman")


def _png(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, "PNG", compress_level=1)
    return b.getvalue()


def _jpeg(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=97)
    return b.getvalue()


def _set5(refdata: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Set5 HR (mod-cropped to x4) and the MATLAB-made x4 LR, by name."""
    out = {}
    for n in SET5:
        lr = load_rgb(refdata / "set5" / "LR_bicubic" / "X4" / f"{n}x4.png")
        hr = load_rgb(refdata / "set5" / "HR" / f"{n}.png")[: 4 * lr.shape[0], : 4 * lr.shape[1]]
        out[n] = (np.ascontiguousarray(hr), lr)
    return out


def _foreign_png(tmp_path: Path, refdata: Path) -> tuple[Path, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Set5 written by wds.ShardWriter as {key}.png + {key}.x4.png: keys with dots, LR before HR in
    some samples, another tool's members in between, one sample without its LR (``woman.v1``)."""
    folder = tmp_path / "foreign"
    folder.mkdir()
    pairs = _set5(refdata)
    expect = {}
    with wds.ShardWriter(str(folder / "part-%04d.tar"), maxcount=3, verbose=0) as sink:
        for i, (name, (hr, lr)) in enumerate(pairs.items()):
            key = f"set5/{name}.v1"
            members: dict = {"__key__": key}
            if i % 2:  # LR first, then a caption, then HR
                members.update({"x4.png": _png(lr), "txt": b"a caption", "png": _png(hr)})
            else:
                members.update({"png": _png(hr), "cls": b"3", "x4.png": _png(lr)})
            if name == "woman":
                del members["x4.png"]
            else:
                expect[key] = (hr, lr)
            sink.write(members)
    return folder, expect


def _index(*args: str) -> int:
    return sm_main(["-q", "index", *args])


def _val_images(url: str, workers: int = 2, **kw) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every image of the dataset, whole, through DataLoader workers: key -> (hr, lr) HWC."""
    ds = wdsr.SRDataset(url, split="val", scale=4, **kw)
    out = {}
    for item in wdsr.make_loader(ds, num_workers=workers):
        out[item.key] = (item.hr[0].permute(1, 2, 0).numpy(), item.lr[0].permute(1, 2, 0).numpy())
    return out


def test_index_wds_shardwriter_png_then_stream_every_image_exactly(tmp_path, refdata, capsys):
    folder, expect = _foreign_png(tmp_path, refdata)
    assert _index(str(folder / "part-{0000..0001}.tar"), "--hr", "png", "--lr", "4:x4.png") == 2
    err = capsys.readouterr().err
    assert "part-0001.tar" in err and "'set5/woman.v1'" in err and "has no x4.png member" in err
    assert not (folder / "manifest.json").exists()  # nothing written when it fails

    assert _index(str(folder / "part-{0000..0001}.tar"), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip") == 0
    m = json.loads((folder / "manifest.json").read_text())
    assert m["members"] == {"hr": "png", "lr": {"4": "x4.png"}} and m["codec"] == "png" and m["samples"] == 4
    assert [(s["shard"], s["key"]) for s in m["build"]["skipped"]] == [("part-0001.tar", "set5/woman.v1")]
    assert sorted(k for sh in m["shards"] for k in sh["keys"]) == sorted(expect)

    got = _val_images(str(folder))  # the pixels, member for member, as they were written
    assert sorted(got) == sorted(expect)
    for key, (hr, lr) in expect.items():
        assert np.array_equal(got[key][0], hr) and np.array_equal(got[key][1], lr), key
    assert verify(str(folder), deep=True, progress=False) == []
    text = info_text(str(folder))
    assert "png + x4: x4.png" in text and "1 samples or shards" in text


@pytest.mark.filterwarnings("ignore:String specifications for transformations:UserWarning")
def test_wids_shard_list_opens_the_same_shards(tmp_path, refdata):
    wids = pytest.importorskip("wids")
    folder, expect = _foreign_png(tmp_path, refdata)
    assert _index(str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip", "--wids") == 0
    ds = wids.ShardListDataset(str(folder / "manifest.wids.json"), cache_dir=str(tmp_path / "wids-cache"))
    tars = sorted(folder.glob("*.tar"))
    assert len(ds) == sum(wids.wids.compute_num_samples(str(t)) for t in tars) == 5  # woman.v1 too: wids reads every sample
    # WebDataset's key stops at the first dot: wids sees set5/baby with members .v1.png, .v1.x4.png
    assert sorted(ds[i]["__key__"] for i in range(len(ds))) == sorted(f"set5/{n}" for n in SET5)
    assert ".v1.x4.png" in ds[0]


def test_indexed_train_stream_is_aligned_deterministic_and_equal_across_ranks(tmp_path, refdata):
    folder, expect = _foreign_png(tmp_path, refdata)
    assert _index(str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip") == 0

    def run(rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor, list[str]]]:
        ds = wdsr.SRDataset(
            str(folder),
            scale=4,
            patch_size=64,
            patches_per_image=4,
            batch_size=4,
            shuffle_buffer=8,
            seed=3,
            return_keys=True,
            augment=False,
            world=wdsr.env.World(rank, world),
        )
        return list(wdsr.make_loader(ds, num_workers=2))

    one = run(0, 1)
    again = run(0, 1)
    assert len(one) == len(again) and all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(one, again))
    keys = {k for _, _, ks in one for k in ks}
    assert keys == set(expect)
    errs, shifted = [], []
    for lr, hr, _ in one:
        for a, b in zip(lr, hr):
            ref = downscale(np.ascontiguousarray(b.permute(1, 2, 0).numpy()), 4, ResizeMethod.MATLAB).astype(int)
            got = a.permute(1, 2, 0).numpy().astype(int)
            errs.append(np.abs(got[2:-2, 2:-2] - ref[2:-2, 2:-2]).max())
            shifted.append(np.abs(got[2:-2, 3:-1] - ref[2:-2, 2:-2]).mean())
    assert max(errs) <= 1 and np.mean(shifted) > 3  # MATLAB's own LR: within one level; a shifted crop is far off
    per_rank = [len(run(r, 3)) for r in range(3)]
    assert len(set(per_rank)) == 1 and per_rank[0] > 0


def _handmade_tar(path: Path, pairs: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """A tar that no WebDataset writer makes: every HR first, then every LR (members of a sample far
    apart, LR of later samples before HR of earlier ones), PAX headers for non-ASCII and long names,
    a directory entry."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        d = tarfile.TarInfo("imgs")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        keys = list(pairs)
        for k in keys:
            add(f"{k}.hr.png", _png(pairs[k][0]))
        for k in reversed(keys):
            add(f"{k}.lr.png", _png(pairs[k][1]))


def test_members_far_apart_in_any_order_with_pax_names(tmp_path, refdata, caplog):
    set5 = _set5(refdata)
    pairs = {
        "imgs/bébé.2024.frame": set5["baby"],
        "imgs/" + "long_" * 30 + "bird.v2": set5["bird"],
        "imgs/head": set5["head"],
    }
    folder = tmp_path / "mixed"
    folder.mkdir()
    _handmade_tar(folder / "all.tar", pairs)
    assert _index(str(folder / "all.tar"), "--hr", "hr.png", "--lr", "4:lr.png", "-o", str(folder / "sr.json"), "--wids") == 0
    got = _val_images(str(folder), manifest=str(folder / "sr.json"))
    assert sorted(got) == sorted(pairs)
    for key, (hr, lr) in pairs.items():
        assert np.array_equal(got[key][0], hr) and np.array_equal(got[key][1], lr), key
    assert verify(str(folder / "sr.json"), deep=True, progress=False) == []

    assert "PAX or GNU long-name headers" in caplog.text  # --wids: wids's own tar reader does not read them


def test_foreign_jpeg_index_streams_aligned_patches(tmp_path):
    folder = tmp_path / "jpeg"
    folder.mkdir()
    keys = []
    with wds.ShardWriter(str(folder / "train-%06d.tar"), maxcount=2, verbose=0) as sink:
        for i, img in enumerate(photos()):
            hr = np.ascontiguousarray(img[: img.shape[0] // 4 * 4, : img.shape[1] // 4 * 4])
            lr = downscale(hr, 4, ResizeMethod.MATLAB)
            sink.write({"__key__": f"photo.{i}", "x4.jpg": _jpeg(lr), "jpg": _jpeg(hr)})
            keys.append(f"photo.{i}")
    assert _index(str(folder / "train-{000000..000001}.tar"), "--hr", "jpg", "--lr", "4:x4.jpg") == 0
    m = mf.load(str(folder))
    sizes = [[p.shape[1] // 4 * 4, p.shape[0] // 4 * 4] for p in photos()]
    assert m.codec == "jpg" and [list(wh) for s in m.shards for wh in s.hr_sizes] == sizes  # from the JPEG headers
    ds = wdsr.SRDataset(
        str(folder),
        scale=4,
        patch_size=64,
        patches_per_image=4,
        batch_size=4,
        shuffle_buffer=0,
        seed=1,
        return_keys=True,
        augment=False,
    )
    aligned, shifted, seen = [], [], set()
    for lr, hr, batch_keys in wdsr.make_loader(ds, num_workers=2):
        seen.update(batch_keys)
        for a, b in zip(lr, hr):
            ref = downscale(np.ascontiguousarray(b.permute(1, 2, 0).numpy()), 4, ResizeMethod.MATLAB).astype(int)
            got = a.permute(1, 2, 0).numpy().astype(int)
            aligned.append(np.abs(got[2:-2, 2:-2] - ref[2:-2, 2:-2]).mean())
            shifted.append(np.abs(got[2:-2, 3:-1] - ref[2:-2, 2:-2]).mean())
    assert seen == set(keys)
    assert np.mean(aligned) < 3.0 < np.mean(shifted)
    with pytest.raises(ValueError, match="verify='sha256' needs sha256"):
        wdsr.SRDataset(str(folder), scale=4, verify="sha256")


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_member_changed_after_indexing_is_named_and_skipped(tmp_path, refdata, caplog):
    folder, expect = _foreign_png(tmp_path, refdata)
    assert _index(str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip") == 0
    info = mf.load(str(folder)).shards[0]
    key = info.keys[1]
    cols = info.members["png"]
    _flip(folder / info.name, int(cols.offsets[1]) + int(cols.bytes[1]) // 2)  # inside the HR data of the second sample
    problems = verify(str(folder), progress=False)
    assert any("sha256 does not match" in p for p in problems)
    assert any(repr(key) in p and "png does not match its xxh3_64" in p for p in problems)
    with pytest.raises(wdsr.SampleError, match=rf"{info.name}.*not the one the manifest lists"):
        _val_images(str(folder), workers=0)  # a local shard: its probe (first and last MiB) tells first
    import fsspec

    mem = fsspec.filesystem("memory")  # a remote store: no probe read; the member's digest tells
    for p in folder.iterdir():
        mem.pipe(f"/flipped/{p.name}", p.read_bytes())
    try:
        with pytest.raises(wdsr.SampleError, match=rf"{info.name}.*{key}.*png does not match its xxh3_64 in the index"):
            _val_images("memory://flipped", workers=0)
        ds = wdsr.SRDataset("memory://flipped", split="val", scale=4, on_error="skip")
        got = [item.key for item in wdsr.make_loader(ds, num_workers=2)]
        assert sorted(got) == sorted(set(expect) - {key}) and ds.stats.totals()["skipped"] == 1
    finally:
        mem.rm("/flipped", recursive=True)


def test_members_moved_after_indexing_are_not_taken_for_others(tmp_path, refdata):
    """The same members rewritten in another order: a local shard fails its size or probe check; on
    a remote store (no probe read there; here fsspec's memory filesystem) with the same size, each
    member is looked for where the index puts it, under its name, and the sample is refused."""
    import fsspec

    folder, expect = _foreign_png(tmp_path, refdata)
    assert _index(str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip") == 0
    info = mf.load(str(folder)).shards[0]
    original = (folder / info.name).read_bytes()
    with tarfile.open(folder / info.name) as t:
        members = [(m.name, t.extractfile(m).read()) for m in t.getmembers() if m.isfile()]
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, data in reversed(members):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    moved = b.getvalue()
    assert len(moved) <= len(original)
    moved += bytes(len(original) - len(moved))  # the same size: only the places differ
    (folder / info.name).write_bytes(moved)
    with pytest.raises(wdsr.SampleError, match=rf"{info.name}.*not the one the manifest lists"):
        _val_images(str(folder), workers=0)

    mem = fsspec.filesystem("memory")
    for p in folder.iterdir():
        mem.pipe(f"/moved/{p.name}", p.read_bytes())
    try:
        with pytest.raises(wdsr.SampleError, match=rf"{info.name}.*'{info.keys[0]}'.*(no member|is at byte|bad tar data)"):
            _val_images("memory://moved", workers=0)
        mem.pipe(f"/moved/{info.name}", original)
        assert sorted(_val_images("memory://moved", workers=0)) == sorted(expect)
    finally:
        mem.rm("/moved", recursive=True)


def _index_json(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda m: m["shards"][0]["members"]["png"]["offsets"].__setitem__(0, 100), "members.png[0]"),
        (lambda m: m["shards"][0]["members"]["png"]["bytes"].__setitem__(0, 1 << 40), "bytes"),
        (lambda m: m["shards"][0]["members"]["x4.png"]["xxh3_64"].__setitem__(0, "zz"), "xxh3_64"),
        (lambda m: m["shards"][0]["keys"].__setitem__(0, "a/../b"), "keys[0]"),
        (lambda m: m["shards"][0].pop("members"), "shards[0]"),
        (lambda m: m["shards"][0]["members"].pop("x4.png"), "members"),
        (lambda m: m["shards"][0]["offsets"].__setitem__(0, m["shards"][0]["offsets"][0] + 512), "offsets"),
        (lambda m: m.__setitem__("members", {"hr": "png", "lr": {"4": "x4.pth"}}), "members"),
        (lambda m: m.__setitem__("members", {"hr": "png", "lr": {"4": "png"}}), "members"),
        (lambda m: m.__setitem__("codec", "qoi"), "codec"),
        (lambda m: m.__setitem__("lr_method", "matlab"), "members"),
        (lambda m: m["shards"][0]["members"]["png"].__setitem__("extra", []), "members"),
    ],
)
def test_a_crafted_index_is_refused_naming_the_field(tmp_path, refdata, edit, field):
    folder, _ = _foreign_png(tmp_path, refdata)
    assert _index(str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip") == 0
    m = _index_json(folder)
    edit(m)
    raw = json.dumps(m).encode()
    for compact in (False, True):
        with pytest.raises(mf.ManifestError) as e:
            mf.parse(raw, "idx.json", compact=compact)
        assert field in str(e.value)


def test_index_refuses_what_it_cannot_index(tmp_path, refdata, capsys):
    folder, _ = _foreign_png(tmp_path, refdata)
    assert _index(str(folder / "part-{0000..0002}.tar"), "--hr", "png", "--lr", "4:x4.png") == 2
    assert "part-0002.tar: no such shard" in capsys.readouterr().err
    assert _index(str(folder), "--hr", "png", "--lr", "4:x4.png", "-o", str(tmp_path / "elsewhere.json")) == 2
    assert "must be in the shards' folder" in capsys.readouterr().err
    assert _index(str(folder), "--hr", "png", "--lr", "4:x4.pickle") == 2
    assert "not a member name" in capsys.readouterr().err
    (folder / "manifest.json").write_text("{}")
    assert _index(str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip") == 2
    assert "exists; give --overwrite" in capsys.readouterr().err
    assert (folder / "manifest.json").read_text() == "{}"  # left as it was
    (folder / "part-0001.tar").write_bytes(b"\x01" * 4096)  # not a tar at all
    assert _index(str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip", "--overwrite") == 0
    m = _index_json(folder)
    assert [s["name"] for s in m["shards"]] == ["part-0000.tar"]
    assert any(s["shard"] == "part-0001.tar" and "bad tar data" in s["reason"] for s in m["build"]["skipped"])


def test_member_names_that_match_nothing_are_listed_beside_those_asked_for(tmp_path, refdata, capsys):
    folder, _ = _foreign_png(tmp_path, refdata)
    assert _index(str(folder), "--hr", "hr.png", "--lr", "4:lr.png") == 2
    err = capsys.readouterr().err.strip()
    assert "no member matches the names asked for (hr.png, 4:lr.png); its members are named" in err, err
    assert all(n in err for n in ("png", "x4.png", "cls")) and len(err.splitlines()) == 1, err


def test_index_on_s3_then_stream_from_s3(tmp_path, refdata, s3):
    folder, expect = _foreign_png(tmp_path, refdata)
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.clear_instance_cache()
    for p in folder.glob("*.tar"):
        fs.put(str(p), f"{S3_BUCKET}/foreign/{p.name}")
    url = f"s3://{S3_BUCKET}/foreign"
    assert _index(f"{url}/part-{{0000..0001}}.tar", "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip") == 0
    got = _val_images(url)
    assert sorted(got) == sorted(expect)
    for key, (hr, lr) in expect.items():
        assert np.array_equal(got[key][0], hr) and np.array_equal(got[key][1], lr), key
