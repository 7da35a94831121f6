"""Hostile and unlucky inputs to ``shardmaker index`` and ``build`` (issue 24): members far larger than
memory should allow, thousands of bad members, keys that look like other keys, and samples of
another kind (grey among RGB, 16-bit among 8-bit). Real tar files, real PNGs, real child processes."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from shardmaker.builder.merge import merge
from shardmaker.errors import BuildError
from shardmaker.format import manifest as mf
from shardmaker.imaging import codecs
from shardmaker.verify import verify
from tests.helpers import build_shards, photos, save, sm


def _png(a: np.ndarray) -> bytes:
    return codecs.encode(np.ascontiguousarray(a), codecs.Codec.PNG, 1)  # 8/16-bit, grey/RGB


def _png_head(w: int, h: int, colour: int = 2, depth: int = 8) -> bytes:
    """A PNG signature and IHDR chunk claiming ``w`` x ``h`` pixels: all a header check reads."""
    ihdr = struct.pack(">IIBBBBB", w, h, depth, colour, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def _tar_with_big_member(path: Path, name: str, head: bytes, size: int, rest: list[tuple[str, bytes]]) -> Path:
    """A tar whose member ``name`` is ``head`` followed by zeros up to ``size`` bytes, written sparse (cheap
    on disk and in time), then the members ``rest``."""
    info = tarfile.TarInfo(name)
    info.size = size
    with open(path, "wb") as f:
        f.write(info.tobuf(format=tarfile.GNU_FORMAT))
        f.write(head)
        end = f.tell() + size - len(head) + (-size) % 512
        f.truncate(end)
        f.seek(end)
        for n, data in rest:
            i = tarfile.TarInfo(n)
            i.size = len(data)
            f.write(i.tobuf(format=tarfile.GNU_FORMAT) + data + b"\0" * ((-len(data)) % 512))
        f.write(b"\0" * 1024)
    return path


def _pair(i: int = 0, grey: bool = False, depth16: bool = False) -> tuple[bytes, bytes]:
    hr = photos()[i % 4][:64, :64]
    if grey:
        hr = np.ascontiguousarray(hr[..., 0])
    if depth16:
        hr = hr.astype(np.uint16) * 257
    lr = np.ascontiguousarray(hr[::4, ::4])
    return _png(np.ascontiguousarray(hr)), _png(lr)


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


# ---- a member larger than memory should allow ---------------------------------------------------
_PEAK = """
import sys
def peak_kb():  # VmHWM: ru_maxrss keeps the forking parent's peak across exec
    return int(next(x.split()[1] for x in open('/proc/self/status') if x.startswith('VmHWM:')))
from shardmaker.index import IndexConfig, index
index(sys.argv[1], None, IndexConfig(hr="png", lr={4: "x4.png"}, progress=False, overwrite=True))
print(peak_kb() * 1024)
"""


def _peak_rss_indexing(folder: Path) -> int:
    """Peak RSS of a child process that indexes ``folder`` (bytes); 60 s only guards against a hang."""
    res = subprocess.run([sys.executable, "-c", _PEAK, str(folder)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    return int(res.stdout.split()[-1])


def test_index_memory_does_not_grow_with_member_size(tmp_path):
    """A 16384x16384 HR member (its header is all a check reads) of 40 MB, then of 240 MB: the digest
    is streamed, so the peak RSS of the indexing process hardly moves (it held the whole member)."""
    peaks = {}
    for mb in (40, 240):
        folder = tmp_path / f"m{mb}"
        folder.mkdir()
        lr = _png_head(4096, 4096) + b"\0" * 64
        _tar_with_big_member(folder / "big.tar", "a.png", _png_head(16384, 16384), mb << 20, [("a.x4.png", lr)])
        peaks[mb] = _peak_rss_indexing(folder)
        m = _manifest(folder)
        assert m["samples"] == 1 and m["shards"][0]["hr_sizes"] == [[16384, 16384]]
        assert m["shards"][0]["members"]["png"]["bytes"][0] > mb << 20
    assert peaks[240] - peaks[40] < 40 << 20, peaks  # 200 MB more member, well under 40 MB more memory


def test_member_larger_than_max_pixels_allows_is_a_bad_member(tmp_path, capsys):
    """A member larger than any image within max_pixels, or than the image its own header describes,
    is a bad member with the reason (fail: shard and key named; skip: left out, counted)."""
    hr, lr = _pair()
    folder = tmp_path / "s"
    folder.mkdir()
    _tar_with_big_member(
        folder / "a.tar", "big.png", _png_head(10, 10), 24 << 20, [("big.x4.png", lr), ("ok.png", hr), ("ok.x4.png", lr)]
    )
    rc, _, err = sm(capsys, "index", str(folder), "--hr", "png", "--lr", "4:x4.png")
    assert rc == 2 and "a.tar: 'big'" in err and "larger than a 10x10 8-bit RGB png can be" in err
    rc, _, err = sm(capsys, "index", str(folder), "--hr", "png", "--lr", "4:x4.png", "--max-pixels", "100000")
    assert rc == 2 and "larger than any png image within max_pixels=100000" in err
    rc, _, _ = sm(capsys, "index", str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip")
    b = _manifest(folder)["build"]
    assert rc == 0 and b["skipped_count"] == 1 and b["skipped"][0]["key"] == "big"
    assert _manifest(folder)["shards"][0]["keys"] == ["ok"]


# ---- thousands of bad members -------------------------------------------------------------------
def test_many_bad_members_skip_bounded_log_and_manifest(tmp_path):
    """2,400 bad samples (1,200 without their LR, 1,200 whose HR is not a PNG): a few warning lines per
    reason and one summary line each, and a bounded build.skipped that still counts them all."""
    hr, lr = _pair()
    members = [("good.png", hr), ("good.x4.png", lr)]
    members += [(f"nolr{i:05d}.png", hr) for i in range(1200)]
    members += [m for i in range(1200) for m in ((f"junk{i:05d}.png", b"not a png at all"), (f"junk{i:05d}.x4.png", lr))]
    folder = tmp_path / "s"
    folder.mkdir()
    _tar(folder / "a.tar", members)
    cmd = [
        sys.executable,
        "-m",
        "shardmaker",
        "-q",
        "index",
        str(folder),
        "--hr",
        "png",
        "--lr",
        "4:x4.png",
        "--on-error",
        "skip",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = (res.stdout + res.stderr).splitlines()
    assert len(lines) < 60, lines[:80]
    assert sum("in all for" in x for x in res.stderr.splitlines()) == 2
    b = _manifest(folder)["build"]
    assert b["skipped_count"] == 2400 and len(b["skipped"]) == mf.SKIP_EXAMPLES
    assert sorted(b["skipped_reasons"].values()) == [1200, 1200]
    assert (folder / "manifest.json").stat().st_size < 64 << 10
    assert _manifest(folder)["samples"] == 1


def test_skips_record_is_bounded_in_reasons_and_merges():
    skips = mf.Skips()
    for i in range(5000):
        skips.add({"path": f"p{i}"}, f"reason number {i} of kind {'x' * (i % 300)}", f"p{i}")
    doc = skips.to_build()
    assert doc["skipped_count"] == 5000 and len(doc["skipped"]) == mf.SKIP_EXAMPLES
    assert len(doc["skipped_reasons"]) <= 65 and sum(doc["skipped_reasons"].values()) == 5000
    merged = mf.Skips()
    merged.extend(doc)
    merged.extend({"skipped": [{"path": "old", "reason": "cannot read 3"}]})  # a part manifest before these fields
    out = merged.to_build()
    assert out["skipped_count"] == 5001 and sum(out["skipped_reasons"].values()) == 5001


# ---- keys ---------------------------------------------------------------------------------------
_BAD_KEYS = {
    "trail /x": "segment 1 starts or ends with white space",
    " lead": "segment 1 starts or ends with white space",
    "a/tail ": "segment 2 starts or ends with white space",
    "back\\slash": "has a backslash",
    "s" * 300: "has a segment longer than 255 characters",
}


def test_index_refuses_keys_with_edge_spaces_backslashes_long_segments(tmp_path, capsys):
    hr, lr = _pair()
    members = [("fine key.png", hr), ("fine key.x4.png", lr)]
    for key in _BAD_KEYS:
        members += [(f"{key}.png", hr), (f"{key}.x4.png", lr)]
    folder = tmp_path / "s"
    folder.mkdir()
    _tar(folder / "a.tar", members)
    rc, _, err = sm(capsys, "index", str(folder), "--hr", "png", "--lr", "4:x4.png")
    assert rc == 2 and "starts or ends with white space" in err and len(err) < 400
    rc, _, _ = sm(capsys, "index", str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip")
    m = _manifest(folder)
    assert rc == 0 and m["shards"][0]["keys"] == ["fine key"]
    got = {s["key"]: s["reason"] for s in m["build"]["skipped"]}
    for key, why in _BAD_KEYS.items():
        assert why in got[key], (key, got[key])


@pytest.mark.parametrize("key", list(_BAD_KEYS))
def test_manifest_refuses_bad_keys_with_the_reason(key):
    for dots in (False, True):
        assert _BAD_KEYS[key] in (mf.key_problem(key, dots=dots) or "")
    doc = {"name": "a.tar", "samples": 1, "bytes": 2048, "sha256": "0" * 64, "keys": [key], "offsets": [0], "hr_sizes": [[4, 4]]}
    with pytest.raises(mf.ManifestError) as e:
        mf.ShardInfo.from_json(doc)
    assert e.value.field == "shard (a.tar).keys[0]" and _BAD_KEYS[key] in e.value.reason


def test_build_refuses_a_source_whose_key_is_refused(tmp_path, capsys):
    src = tmp_path / "src"
    for i, name in enumerate(["ok.png", "trailing .png", "back\\slash.png"]):
        save(src / name, np.ascontiguousarray(photos()[i][:64, :64]))
    rc, _, err = sm(capsys, "build", src, tmp_path / "out", "--workers", "1")
    assert rc == 2 and "back\\slash.png" in err and "has a backslash" in err
    rc, out, _ = sm(capsys, "build", src, tmp_path / "out", "--workers", "1", "--on-error", "skip")
    m = _manifest(tmp_path / "out")
    assert rc == 0 and m["shards"][0]["keys"] == ["ok"] and m["build"]["skipped_count"] == 2
    assert "starts or ends with white space" in out


# ---- one kind per dataset -----------------------------------------------------------------------
def _mixed_shards(folder: Path) -> Path:
    """RGB samples a and c, a grey sample b (HR and LR both grey), a 16-bit RGB sample d."""
    folder.mkdir()
    members = []
    for key, kw in (("a", {}), ("b", {"grey": True}), ("c", {}), ("d", {"depth16": True})):
        hr, lr = _pair(1, **kw)
        members += [(f"{key}.png", hr), (f"{key}.x4.png", lr)]
    _tar(folder / "a.tar", members)
    return folder


def test_index_sample_of_another_kind_is_a_bad_member(tmp_path, capsys):
    folder = _mixed_shards(tmp_path / "s")
    rc, _, err = sm(capsys, "index", str(folder), "--hr", "png", "--lr", "4:x4.png")
    assert rc == 2 and "a.tar: 'b': sample is 8-bit grey, the dataset 8-bit RGB" in err
    rc, _, _ = sm(capsys, "index", str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip")
    m = _manifest(folder)
    assert rc == 0 and m["shards"][0]["keys"] == ["a", "c"] and (m["channels"], m["bit_depth"]) == (3, 8)
    reasons = {s["key"]: s["reason"] for s in m["build"]["skipped"]}
    assert "8-bit grey" in reasons["b"] and "16-bit RGB" in reasons["d"]
    rc, _, _ = sm(
        capsys, "index", folder, "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip", "--overwrite", "--channels", "1"
    )
    m = _manifest(folder)
    assert rc == 0 and m["shards"][0]["keys"] == ["b"] and (m["channels"], m["bit_depth"]) == (1, 8)


def test_verify_checks_the_recorded_kind(tmp_path, capsys):
    folder = _mixed_shards(tmp_path / "s")
    assert sm(capsys, "index", str(folder), "--hr", "png", "--lr", "4:x4.png", "--on-error", "skip")[0] == 0
    assert verify(str(folder), progress=False) == []
    doc = _manifest(folder)
    doc["channels"] = 1
    (folder / "manifest.json").write_text(json.dumps(doc))
    problems = verify(str(folder), progress=False)
    assert len(problems) == 2 and all("png is 8-bit RGB, the manifest says every sample is 8-bit grey" in p for p in problems)


def test_build_records_kind_and_refuses_another(tmp_path, capsys):
    """A build records channels and bit depth; a grey source among RGB ones is a bad input (it used to
    be written as it was, and crashed training mid-epoch); verify checks the record; same bytes twice."""
    src = tmp_path / "src"
    for i in range(3):
        save(src / f"rgb{i}.png", np.ascontiguousarray(photos()[i][:64, :64]))
    save(src / "grey.png", np.ascontiguousarray(photos()[3][:64, :64, 0]))
    rc, _, err = sm(capsys, "build", src, tmp_path / "fail", "--workers", "1")
    assert rc == 2 and "grey.png" in err and "8-bit grey" in err and "8-bit RGB" in err
    for out in ("a", "b"):
        build_shards(src, tmp_path / out, "--on-error", "skip")
    m = _manifest(tmp_path / "a")
    assert (m["channels"], m["bit_depth"]) == (3, 8) and m["samples"] == 3
    assert m["build"]["skipped"][0]["path"].endswith("grey.png")
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (tmp_path / "b" / "manifest.json").read_bytes()
    assert verify(str(tmp_path / "a"), progress=False) == []
    deep = tmp_path / "deep"
    save(deep / "g.png", (np.ascontiguousarray(photos()[0][:64, :64, 1]).astype(np.uint16) * 257))
    build_shards(deep, tmp_path / "g16")
    assert (_manifest(tmp_path / "g16")["channels"], _manifest(tmp_path / "g16")["bit_depth"]) == (1, 16)


def test_merge_refuses_parts_of_different_kinds(tmp_path):
    src = tmp_path / "src"
    save(src / "rgb.png", np.ascontiguousarray(photos()[0][:64, :64]))
    save(src / "grey.png", np.ascontiguousarray(photos()[1][:64, :64, 0]))
    for i in range(2):
        build_shards(src, tmp_path / "out", "--part", f"{i}/2")
    with pytest.raises(BuildError, match="part 0 holds 8-bit .* images, part 1 8-bit .* images; one dataset holds one kind"):
        merge(str(tmp_path / "out"))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_resumed_build_keeps_the_kind_of_its_kept_shards(tmp_path, capsys):
    """A build that stopped at a source of another kind stops there again when rerun: the kind comes
    from the shards it keeps, not from the first sample it encodes this time."""
    src = tmp_path / "src"
    for i in range(4):
        save(src / f"rgb{i}.png", np.ascontiguousarray(photos()[i][:64, :64]))
    save(src / "grey.png", np.ascontiguousarray(photos()[0][64:128, :64, 0]))
    first = sm(capsys, "build", src, tmp_path / "out", "--workers", "1", "--max-samples", "1")
    again = sm(capsys, "build", src, tmp_path / "out", "--workers", "1", "--max-samples", "1")
    assert first[0] == again[0] == 2 and "one dataset holds one kind" in first[2]
    assert again[2] == first[2]
    assert any((tmp_path / "out").glob("shard-*.tar"))  # shards were kept from the first run


@pytest.mark.timeout(60)
def test_verify_and_index_do_not_block_on_a_fifo_at_a_shard_name(tmp_path, capsys):
    """A FIFO where a shard should be: verify reports it, index refuses it, neither waits for a writer."""
    hr, lr = _pair()
    folder = tmp_path / "s"
    folder.mkdir()
    _tar(folder / "a.tar", [("k.png", hr), ("k.x4.png", lr)])
    assert sm(capsys, "index", str(folder), "--hr", "png", "--lr", "4:x4.png")[0] == 0
    (folder / "a.tar").unlink()
    os.mkfifo(folder / "a.tar")
    assert verify(str(folder), progress=False) == ["a.tar: is a FIFO, not a regular file"]
    rc, _, err = sm(capsys, "index", str(folder), "--hr", "png", "--lr", "4:x4.png", "--overwrite")
    assert rc == 2 and "a.tar: is a FIFO, not a regular file" in err


def test_build_skipping_many_sources_logs_and_records_a_bounded_summary(tmp_path, capsys, caplog):
    """Like the index: 60 unreadable sources give a few warnings and one summary line, the CLI lists 20,
    and the manifest lists the first skips with a count of all, by reason."""
    src = tmp_path / "src"
    for i in range(2):
        save(src / f"ok{i}.png", np.ascontiguousarray(photos()[i][:64, :64]))
    for i in range(60):
        (src / f"bad{i:02d}.png").write_bytes(b"not a png" * (i + 1))
    caplog.set_level("WARNING")
    rc, out, _ = sm(capsys, "build", src, tmp_path / "out", "--workers", "1", "--on-error", "skip")
    assert rc == 0
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and r.name.startswith("shardmaker")]
    assert 2 <= len(warnings) <= 12 and any("skipped 60 in all for" in r.getMessage() for r in warnings)
    assert len(out.splitlines()) < 30 and "... and 40 more" in out
    b = _manifest(tmp_path / "out")["build"]
    assert b["skipped_count"] == 60 and sum(b["skipped_reasons"].values()) == 60 and len(b["skipped"]) == 60
