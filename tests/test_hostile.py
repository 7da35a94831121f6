"""Hostile and unlucky inputs, each class built here from real shards: the reader ends in bounded
time with a SampleError/ManifestError naming shard/key/field, reads nothing outside the dataset,
touches nothing outside its cache; the builder never loses or corrupts a dataset."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import qoi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsr
from shardmaker.cli import main as sm_main
from shardmaker.format import ManifestError, TarFormatError, iter_members, parse, tario
from shardmaker.format import manifest as mf
from shardmaker.format.loading import load
from shardmaker.verify import verify
from tests.helpers import ROOT, build_shards, photos, save
from tests.s3server import ACCESS_KEY, SECRET_KEY
from wdsr.pipeline.read import _members
from wdsr.tools.cli import main as wdsr_main

pytestmark = pytest.mark.timeout(120)  # every case must end, not hang


# ---- helpers: real shards, then surgery on them ----------------------------------------------------
def small_src(root: Path, n: int = 4, size: int = 64) -> Path:
    for i in range(n):
        save(root / f"p{i}.png", np.ascontiguousarray(photos()[i % 4][7 * i : 7 * i + size, 5 * i : 5 * i + size]))
    return root


@pytest.fixture()
def ds(tmp_path) -> Path:
    """4 samples, 2 per shard, scales 2 and 4, PNG."""
    return build_shards(small_src(tmp_path / "src"), tmp_path / "ds", "--scale", "2,4", "--max-samples", "2")


def manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def members(shard: Path) -> list[tuple[str, int, bytes]]:
    data = shard.read_bytes()
    return list(iter_members(io.BytesIO(data), limit=len(data)))


def rewrite_shard(d: Path, index: int, edit) -> None:
    """Rewrite shard ``index`` from ``edit(list of (name, data))`` and fix its manifest entry (bytes,
    offsets, sha256, probe), as a crafted but self-consistent dataset would be."""
    m = manifest(d)
    info = m["shards"][index]
    path = d / info["name"]
    items = edit([(n, bytes(p)) for n, _, p in members(path)])
    out, offsets, key = bytearray(), [], None
    for name, payload in items:
        k = tario.split_name(name)[0]
        if k != key:
            offsets.append(len(out))
            key = k
        out += tario.member_bytes(name, payload)
    out += tario.END_OF_ARCHIVE
    path.write_bytes(bytes(out))
    info.update(
        bytes=len(out),
        offsets=offsets,
        sha256=hashlib.sha256(out).hexdigest(),
        probe=mf.probe_of(bytes(out[: mf.PROBE_BYTES]), bytes(out[-mf.PROBE_BYTES :])),
    )
    m["bytes"] = sum(s["bytes"] for s in m["shards"])
    (d / "manifest.json").write_text(json.dumps(m))


def patch_header(path: Path, header_at: int, field: slice, value: bytes, fix_checksum: bool = True) -> None:
    data = bytearray(path.read_bytes())
    data[header_at + field.start : header_at + field.stop] = value.ljust(field.stop - field.start, b"\0")
    if fix_checksum:
        hdr = data[header_at : header_at + 512]
        total = sum(hdr[:148]) + 8 * 32 + sum(hdr[156:])
        data[header_at + 148 : header_at + 156] = b"%06o\0 " % total
    path.write_bytes(bytes(data))


def stream(url: str, **kw) -> tuple[list, dict]:
    d = wdsr.SRDataset(url, scale=4, patch_size=32, patches_per_image=2, batch_size=2, shuffle_buffer=4, **kw)
    return list(d), d.stats.totals()


# ---- 1. tar headers: negative, huge, non-octal sizes and checksums, non-UTF-8 names ---------------
SIZE, CHKSUM, NAME = slice(124, 136), slice(148, 156), slice(0, 100)


@pytest.mark.parametrize(
    "what, field, value, fix",
    [
        ("negative size", SIZE, b"-0001000", True),
        ("base-256 size of 2^62", SIZE, b"\x80" + (1 << 62).to_bytes(11, "big"), True),
        ("size past the end", SIZE, b"%011o" % (1 << 30), True),
        ("non-octal checksum", CHKSUM, b"12x4567", False),
        ("non-UTF-8 name", NAME, b"k\xff\xfe.lr_x2.png", True),
    ],
)
def test_bad_tar_headers_are_sample_errors_that_skip_skips(ds, what, field, value, fix, capsys):
    info = manifest(ds)["shards"][0]
    shard = ds / info["name"]
    skipped_member = next(off for name, off, _ in members(shard) if name.endswith(".lr_x2.png"))  # read x4: x2 is skipped
    patch_header(shard, skipped_member, field, value, fix)
    with pytest.raises(wdsr.SampleError) as exc:
        stream(str(ds))
    assert info["name"] in str(exc.value)
    batches, stats = stream(str(ds), on_error="skip")
    assert batches and stats["skipped"] >= 1
    problems = verify(str(ds), progress=False)
    assert problems and all(p.startswith(info["name"]) for p in problems)
    assert wdsr_main(["preview", str(ds), "-o", str(ds.parent / "p.png"), "--patch-size", "32", "-n", "2"]) == 2
    assert info["name"] in capsys.readouterr().err


# ---- 2. shard names that point outside the dataset ------------------------------------------------
@pytest.mark.parametrize(
    "name", ["../other/x.tar", "/abs/path.tar", "/dev/zero", "sub/x.tar", "..tar", ".hidden.tar", "x.tar\n", 7, None]
)
def test_shard_names_outside_the_dataset_are_refused(ds, name, capsys):
    m = manifest(ds)
    m["shards"][1]["name"] = name
    (ds / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError) as exc:
        wdsr.SRDataset(str(ds), scale=4, patch_size=32)
    assert exc.value.field == "shards[1].name"
    assert sm_main(["-q", "verify", str(ds)]) == 2
    assert "shards[1].name" in capsys.readouterr().err


def test_an_s3_manifest_cannot_reach_another_bucket(s3, tmp_path, capsys):
    fs = s3fs_for(s3)
    fs.mkdir("wdsr-private")
    fs.pipe("wdsr-private/secret.tar", b"\0" * 4096)
    src = small_src(tmp_path / "src")
    url = "s3://wdsr-test/hostile-names"
    build_shards(src, url, "--scale", "4")
    m = json.loads(fs.cat(f"{url}/manifest.json"))
    m["shards"][0]["name"] = "/wdsr-private/secret.tar"
    fs.pipe(f"{url}/manifest.json", json.dumps(m).encode())
    type(fs).clear_instance_cache()  # the builder's s3fs still holds the old manifest's ETag
    with pytest.raises(ManifestError):
        wdsr.SRDataset(url, scale=4, patch_size=32)
    assert sm_main(["-q", "verify", url]) == 2
    assert "shards[0].name" in capsys.readouterr().err


def s3fs_for(server):
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=server.endpoint, key=ACCESS_KEY, secret=SECRET_KEY)


# ---- 3. the shard cache keeps to its own files ----------------------------------------------------
def test_cache_touches_only_its_own_files_and_trusts_only_checked_fills(s3, tmp_path):
    src = small_src(tmp_path / "src", n=6)
    local = build_shards(src, tmp_path / "local", "--scale", "4", "--max-samples", "2")
    url = "s3://wdsr-test/hostile-cache"
    build_shards(src, url, "--scale", "4", "--max-samples", "2")
    cache = tmp_path / "cache"
    mine = {cache / "checkpoint.pt": b"weights" * 1000, cache / "shard-000000.tar": b"not the cache's" * 100}
    for p, data in mine.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    m = load(url)
    # a file planted at the very name the cache would use, of the right size, is not a hit
    planted = cache / "wdsr-shard-cache" / f"{m.shards[0].sha256[:16]}-{m.shards[0].name}"
    planted.parent.mkdir(parents=True)
    (planted.parent / ".wdsr-shard-cache").write_text("")
    planted.write_bytes(b"\1" * m.shards[0].bytes)
    want, _ = stream(str(local))
    room = 2 * max(s.bytes for s in m.shards) + 1  # two of the three shards: evicts as it goes
    got, stats = stream(url, cache_dir=str(cache), cache_limit=room)
    assert [(a.tolist(), b.tolist()) for a, b in got] == [(a.tolist(), b.tolist()) for a, b in want]
    for p, data in mine.items():
        assert p.read_bytes() == data  # the user's files, untouched
    assert stats["cache_misses"] >= len(m.shards)
    # a sha256 in the manifest that would steer the cache's paths is refused with the manifest
    fs = s3fs_for(s3)
    doc = json.loads(fs.cat(f"{url}/manifest.json"))
    doc["shards"][0]["sha256"] = "../../../../tmp/evil" + "0" * 44
    fs.pipe(f"{url}/manifest.json", json.dumps(doc).encode())
    type(fs).clear_instance_cache()
    with pytest.raises(ManifestError) as exc:
        wdsr.SRDataset(url, scale=4, patch_size=32, cache_dir=str(cache))
    assert exc.value.field.endswith(".sha256")


# ---- 4. decompression bombs, and Pillow's own guard left alone ------------------------------------
def grey_png(w: int, h: int) -> bytes:
    """A w x h all-zero grey PNG, compressed row by row (never held decoded)."""
    z = zlib.compressobj(9)
    row = b"\0" * (w + 1)
    body = b"".join(z.compress(row) for _ in range(h)) + z.flush()

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    return mf_sig() + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def mf_sig() -> bytes:
    return b"\x89PNG\r\n\x1a\n"


BOMB_CODE = """
import sys
def peak_kb():  # VmHWM: ru_maxrss keeps the forking parent's peak across exec
    return int(next(x.split()[1] for x in open('/proc/self/status') if x.startswith('VmHWM:')))
import wdsr
ds = wdsr.SRDataset(sys.argv[1], scale=4, patch_size=32, patches_per_image=2, batch_size=2, on_error="skip",
                    verify="none")  # no digest check either: only the header check stands between the bomb and a decode
n = sum(1 for _ in ds)
print(n, ds.stats.totals()["skipped"], peak_kb() // 1024)
"""


@pytest.mark.parametrize("manifest_agrees", [False, True])
def test_a_png_bomb_is_refused_from_its_header_before_decoding(ds, manifest_agrees):
    bomb = grey_png(30000, 30000)
    assert len(bomb) < 1 << 20
    lr = grey_png(7500, 7500)

    def edit(items):
        out = []
        for name, data in items:
            if name.startswith("p0.") and name.endswith((".json",)):
                meta = json.loads(data)
                meta["sha256"], meta["xxh3_64"] = {}, {}
                data = json.dumps(meta).encode()
            if name == "p0.hr.png":
                data = bomb
            if name == "p0.lr_x4.png" and manifest_agrees:
                data = lr
            out.append((name, data))
        return out

    m = manifest(ds)
    shard = next(i for i, s in enumerate(m["shards"]) if "p0" in s["keys"])
    rewrite_shard(ds, shard, edit)
    if manifest_agrees:  # the manifest says 30000x30000 too: max_pixels stops it
        m = manifest(ds)
        m["shards"][shard]["hr_sizes"][m["shards"][shard]["keys"].index("p0")] = [30000, 30000]
        (ds / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(wdsr.SampleError) as exc:
        stream(str(ds), verify="none")
    assert "'p0'" in str(exc.value)
    assert ("max_pixels" if manifest_agrees else "the manifest says") in str(exc.value)
    proc = subprocess.run(
        [sys.executable, "-c", BOMB_CODE, str(ds)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    n, skipped, peak_mb = map(int, proc.stdout.split())
    assert n > 0 and skipped == 1
    assert peak_mb < 900, f"peak RSS {peak_mb} MB: the bomb (900 MB decoded) was decoded"


def test_importing_wdsr_leaves_pillows_bomb_guard_alone():
    code = (
        "import PIL.Image as I; v = I.MAX_IMAGE_PIXELS; import wdsr, shardmaker.builder, shardmaker.imaging.codecs; "
        "assert I.MAX_IMAGE_PIXELS == v and v, I.MAX_IMAGE_PIXELS"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode == 0


# ---- 5. malformed manifests -----------------------------------------------------------------------
def _good() -> dict:
    return {
        "format": "wdsr-shards/1",
        "codec": "png",
        "scales": [2, 4],
        "lr_method": "matlab",
        "samples": 2,
        "bytes": 4096,
        "shards": [
            {
                "name": "shard-000000.tar",
                "samples": 2,
                "bytes": 4096,
                "sha256": "a" * 64,
                "keys": ["a", "b/c"],
                "offsets": [0, 1536],
                "hr_sizes": [[64, 64], [80, 60]],
            }
        ],
    }


def _edit(path: str, value):
    d = _good()
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    node[int(last) if last.isdigit() else last] = value
    return json.dumps(d).encode()


@pytest.mark.parametrize(
    "raw, field",
    [
        (_edit("shards", ["x"]), "shards[0]"),
        (_edit("shards", [None]), "shards[0]"),
        (_edit("shards", []), "shards"),
        (_edit("scales", "24"), "scales"),
        (_edit("scales", [4, 2]), "scales"),
        (_edit("scales", [True]), "scales[0]"),
        (_edit("shards.0.offsets", "0"), "shards[0] (shard-000000.tar).offsets"),
        (_edit("shards.0.offsets", [0, 1536.0]), "shards[0] (shard-000000.tar).offsets[1]"),
        (_edit("shards.0.offsets", [0, 1000]), "shards[0] (shard-000000.tar).offsets[1]"),
        (_edit("shards.0.offsets", [0, 9000]), "shards[0] (shard-000000.tar).offsets[1]"),
        (_edit("shards.0.samples", 2.0), "shards[0] (shard-000000.tar).samples"),
        (_edit("shards.0.bytes", "4096"), "shards[0] (shard-000000.tar).bytes"),
        (_edit("shards.0.sha256", "A" * 64), "shards[0] (shard-000000.tar).sha256"),
        (_edit("shards.0.keys", ["a", "a.png"]), "shards[0] (shard-000000.tar).keys[1]"),
        (_edit("shards.0.keys", ["a", "../up"]), "shards[0] (shard-000000.tar).keys[1]"),
        (_edit("shards.0.hr_sizes", [[64, 64], [0, 60]]), "shards[0] (shard-000000.tar).hr_sizes[1][0]"),
        (_edit("shards.0.hr_sizes", [[64, 64]]), "shards[0] (shard-000000.tar).hr_sizes"),
        (_edit("samples", 3), "samples"),
        (_edit("codec", "pickle"), "codec"),
        (b"[" * 100000 + b"]" * 100000, None),
        (b"login\nsy:x:0:0:root:/root:/bin/bash\n", None),
        (b"\xff\xfe\x00garbage", None),
    ],
)
@pytest.mark.parametrize("compact", [False, True])
def test_malformed_manifests_are_manifest_errors_naming_the_field(raw, field, compact):
    with pytest.raises(ManifestError) as exc:
        parse(raw, "ds/manifest.json", compact=compact)
    assert exc.value.field == field, str(exc.value)
    assert "login" not in str(exc.value) and "garbage" not in str(exc.value)  # never echoes the file


@pytest.mark.parametrize("compact", [False, True])
def test_duplicate_shard_names_and_keys_are_refused(compact):
    d = _good()
    d["shards"].append(dict(d["shards"][0]))
    d["samples"], d["bytes"] = 4, 8192
    with pytest.raises(ManifestError, match="listed twice"):
        parse(json.dumps(d).encode(), "m", compact=compact)
    d["shards"][1]["name"] = "shard-000001.tar"
    with pytest.raises(ManifestError, match="appears twice") as exc:
        parse(json.dumps(d).encode(), "m", compact=compact)
    assert exc.value.field == "shards (shard-000000.tar).keys"


def test_compact_manifests_hold_the_same_data_in_columns(ds):
    raw = (ds / "manifest.json").read_bytes()
    plain, compact = parse(raw, "m"), parse(raw, "m", compact=True)
    assert compact.to_json() == plain.to_json() and compact.identity == hashlib.sha256(raw).hexdigest()
    for a, b in zip(plain.shards, compact.shards):
        assert isinstance(b.keys, mf.KeyColumn) and b.offsets.dtype == np.uint32 and b.hr_sizes.dtype == np.uint16
        assert [b.keys[i] for i in range(b.samples)] == a.keys == b.keys[:] and b.keys == a.keys
        assert [int(o) for o in b.offsets] == a.offsets and b.hr_sizes.tolist() == a.hr_sizes
    # a shard entry where no shard belongs (turned into columns while parsing) is refused, not kept
    d = json.loads(raw)
    d["build"]["extra"] = [d["shards"][0]]
    with pytest.raises(ManifestError, match="shard entry outside the shards list") as exc:
        parse(json.dumps(d).encode(), "m", compact=True)
    assert exc.value.field == "build.extra[0]"


# ---- 6. duplicate members, RGBA QOI ---------------------------------------------------------------
def test_duplicate_members_are_refused(ds):
    def edit(items):
        out = []
        for name, data in items:
            out.append((name, data))
            if name.endswith(".hr.png"):
                out.append((name, data))  # hr.png twice
        return out

    rewrite_shard(ds, 0, edit)
    with pytest.raises(wdsr.SampleError, match="appears twice"):
        stream(str(ds))
    assert any("appears twice" in p for p in verify(str(ds), progress=False))


def test_rgba_qoi_members_are_refused(tmp_path):
    d = build_shards(small_src(tmp_path / "src"), tmp_path / "q", "--scale", "4", "--codec", "qoi")

    def edit(items):
        out = []
        for name, data in items:
            if name == "p1.hr.qoi":
                rgb = qoi.decode(data)
                data = bytes(qoi.encode(np.ascontiguousarray(np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)]))))
            out.append((name, data))
        return out

    rewrite_shard(d, 0, edit)
    with pytest.raises(wdsr.SampleError, match="8-bit RGB only") as exc:
        stream(str(d), verify="none")
    assert "'p1'" in str(exc.value)


# ---- 7-11. the builder ----------------------------------------------------------------------------
def test_a_failed_overwrite_leaves_the_old_dataset_intact(tmp_path, capsys):
    old = build_shards(small_src(tmp_path / "src"), tmp_path / "ds", "--scale", "4")
    before = {p.name: p.read_bytes() for p in old.iterdir() if p.is_file()}
    bad = small_src(tmp_path / "bad", n=5)
    png = (bad / "p4.png").read_bytes()
    (bad / "p4.png").write_bytes(png[: len(png) // 2])  # header fine, data truncated: fails mid-build
    assert sm_main(["-q", "build", str(bad), str(old), "--scale", "2", "--workers", "1", "--overwrite"]) == 2
    assert "p4.png" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in old.iterdir() if p.is_file()} == before
    assert verify(str(old), progress=False) == []
    # the same overwrite with good sources replaces it, and leaves no staging behind
    (bad / "p4.png").write_bytes(png)
    assert sm_main(["-q", "build", str(bad), str(old), "--scale", "2", "--workers", "1", "--overwrite"]) == 0
    assert load(str(old)).scales == [2] and load(str(old)).samples == 5
    assert verify(str(old), progress=False) == [] and not (old / "_staging").exists()


def test_overwrite_deletes_only_what_wdsr_wrote(tmp_path, capsys):
    src = small_src(tmp_path / "src")
    other = tmp_path / "other"
    (other / "_build").mkdir(parents=True)
    files = {
        other / "manifest.json": b'{"name": "another program"}',
        other / "shard-000000.tar": b"theirs",
        other / "_build" / "x.json": b"{}",
        other / "notes.txt": b"mine",
    }
    for p, data in files.items():
        p.write_bytes(data)
    assert sm_main(["-q", "build", str(src), str(other), "--workers", "1", "--overwrite"]) == 2
    assert "not a wdsr manifest" in capsys.readouterr().err
    (other / "manifest.json").unlink()
    files.pop(other / "manifest.json")
    assert sm_main(["-q", "build", str(src), str(other), "--workers", "1", "--overwrite"]) == 2
    assert "no wdsr manifest or build record lists" in capsys.readouterr().err
    assert all(p.read_bytes() == data for p, data in files.items())
    # a real wdsr dataset next to someone's file: overwrite replaces the dataset, keeps the file
    ds = build_shards(src, tmp_path / "ds", "--scale", "4")
    (ds / "notes.txt").write_bytes(b"mine")
    assert sm_main(["-q", "build", str(src), str(ds), "--scale", "2", "--workers", "1", "--overwrite"]) == 0
    assert (ds / "notes.txt").read_bytes() == b"mine" and verify(str(ds), progress=False) == []
    for bad_out in ("/", str(Path.home())):
        assert sm_main(["-q", "build", str(src), bad_out, "--workers", "1", "--overwrite"]) == 2
        assert "refusing to build into" in capsys.readouterr().err


def test_a_source_edited_in_place_is_not_kept_stale(tmp_path, capsys):
    src = small_src(tmp_path / "src")
    ds = build_shards(src, tmp_path / "ds", "--scale", "4")
    first = manifest(ds)
    from PIL import Image

    img = np.asarray(Image.open(src / "p2.png")).copy()
    img[10:20, 10:20] = 255 - img[10:20, 10:20]  # same name, same pixel size, other pixels
    save(src / "p2.png", img)
    assert sm_main(["-q", "build", str(src), str(ds), "--scale", "4", "--workers", "1"]) == 2  # not "already built"
    assert "different dataset" in capsys.readouterr().err
    assert sm_main(["-q", "build", str(src), str(ds), "--scale", "4", "--workers", "1", "--overwrite"]) == 0
    assert manifest(ds)["shards"][0]["sha256"] != first["shards"][0]["sha256"]
    assert verify(str(ds), deep=True, progress=False) == []


def test_strict_resume_sees_a_content_change_that_keeps_size_and_mtime(tmp_path, capsys):
    src = small_src(tmp_path / "src")
    from PIL import Image

    Image.fromarray(photos()[1][:48, :48]).save(src / "b.bmp")  # BMP: same size whatever the pixels
    ds = tmp_path / "ds"
    assert sm_main(["-q", "build", str(src), str(ds), "--workers", "1", "--strict-resume"]) == 0
    assert sm_main(["-q", "build", str(src), str(ds), "--workers", "1", "--strict-resume"]) == 0  # unchanged: done
    st_before = os.stat(src / "b.bmp")
    raw = bytearray((src / "b.bmp").read_bytes())
    raw[-100:] = bytes(255 - b for b in raw[-100:])
    (src / "b.bmp").write_bytes(bytes(raw))
    os.utime(src / "b.bmp", ns=(st_before.st_atime_ns, st_before.st_mtime_ns))
    assert (os.stat(src / "b.bmp").st_size, os.stat(src / "b.bmp").st_mtime_ns) == (st_before.st_size, st_before.st_mtime_ns)
    assert sm_main(["-q", "build", str(src), str(ds), "--workers", "1", "--strict-resume"]) == 2
    assert "different dataset" in capsys.readouterr().err


def test_two_builds_into_one_folder_the_second_is_refused(tmp_path, capsys):
    from shardmaker import storage
    from shardmaker.builder import outdir

    src = small_src(tmp_path / "src")
    out = tmp_path / "ds"
    fs, root = storage.open_dir(str(out))
    with outdir.locked(fs, root, str(out)):
        assert sm_main(["-q", "build", str(src), str(out), "--workers", "1"]) == 2
        err = capsys.readouterr().err
        assert f"pid {os.getpid()}" in err and "being written by another shardmaker" in err
    # two real processes at once: whatever the timing, what is left passes verify
    cmd = [sys.executable, "-m", "shardmaker", "-q", "build", str(src), str(out), "--workers", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    rcs = [p.wait(timeout=120) for p in procs]
    errs = [p.stderr.read() for p in procs]
    for p in procs:
        p.stderr.close()
    assert 0 in rcs and set(rcs) <= {0, 2}, errs
    assert all("being written by another" in e for rc, e in zip(rcs, errs) if rc == 2)
    assert verify(str(out), progress=False) == []


def test_fifos_odd_names_sizes_and_disguised_files(tmp_path, capsys):
    src = small_src(tmp_path / "src")
    os.mkfifo(src / "x.png")
    assert sm_main(["-q", "build", str(src), str(tmp_path / "a"), "--workers", "1"]) == 0  # no hang on the FIFO
    assert load(str(tmp_path / "a")).samples == 4
    bad = os.fsencode(src) + b"/caf\xe9.png"
    with open(bad, "wb") as f:
        f.write((src / "p0.png").read_bytes())
    assert sm_main(["-q", "build", str(src), str(tmp_path / "b"), "--workers", "1"]) == 2
    assert "not valid UTF-8" in capsys.readouterr().err
    assert sm_main(["-q", "build", str(src), str(tmp_path / "b"), "--workers", "1", "--on-error", "skip"]) == 0
    assert load(str(tmp_path / "b")).samples == 4
    os.unlink(bad)
    assert sm_main(["-q", "build", str(src), str(tmp_path / "c"), "--shard-size", "1e999"]) == 2
    err = capsys.readouterr().err.strip()
    assert "1 TiB" in err and len(err.splitlines()) == 1
    from PIL import Image

    Image.fromarray(photos()[0][:64, :64]).save(src / "gif.png", format="GIF")  # a GIF behind a .png name
    assert sm_main(["-q", "build", str(src), str(tmp_path / "d"), "--workers", "1"]) == 2
    assert "gif.png" in capsys.readouterr().err


# ---- fuzz: byte flips and truncations never hang and raise only our error types -------------------
# No per-example deadline (hypothesis's deadline is a wall-clock assertion a busy machine trips, as
# "Flaky"): an example that hangs still fails, on the module's 120 s timeout.
@pytest.fixture(scope="module")
def sample_bytes(tmp_path_factory) -> tuple[bytes, str]:
    d = build_shards(
        small_src(tmp_path_factory.mktemp("fz") / "src", n=1, size=24), tmp_path_factory.mktemp("fz2") / "ds", "--scale", "2,4"
    )
    m = manifest(d)
    return (d / m["shards"][0]["name"]).read_bytes(), m["shards"][0]["keys"][0]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_tar_bytes_raise_only_our_errors(sample_bytes, data):
    raw, key = sample_bytes
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 8))):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    buf = buf[: data.draw(st.integers(0, len(buf)))]
    try:
        list(iter_members(io.BytesIO(bytes(buf)), limit=len(buf)))
    except TarFormatError:
        pass
    try:
        _members(io.BytesIO(bytes(buf)), len(buf), "shard-000000.tar", key, frozenset({"json", "hr.png", "lr_x4.png"}))
    except wdsr.SampleError as exc:
        assert exc.shard == "shard-000000.tar" and exc.key == key


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(
        [
            "format",
            "codec",
            "scales",
            "lr_method",
            "samples",
            "bytes",
            "shards",
            "shards.0",
            "shards.0.name",
            "shards.0.samples",
            "shards.0.bytes",
            "shards.0.sha256",
            "shards.0.keys",
            "shards.0.offsets",
            "shards.0.hr_sizes",
            "shards.0.keys.1",
            "shards.0.offsets.1",
            "shards.0.hr_sizes.0",
        ]
    ),
    value=_json,
    cut=st.integers(0, 400),
)
def test_fuzzed_manifests_raise_only_manifest_errors(path, value, cut):
    for raw in (_edit(path, value), _edit(path, value)[:cut]):
        try:
            parse(raw, "m")
        except ManifestError:
            pass


def test_the_fuzz_tests_can_fail():
    """The fuzz targets above would notice a parser that raises something else."""
    with pytest.raises(TarFormatError):
        list(iter_members(io.BytesIO(b"\x01" * 512), limit=512))
    with pytest.raises(ManifestError):
        parse(b"[" * 50000, "m")
