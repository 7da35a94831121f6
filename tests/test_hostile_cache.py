"""Hostile and unlucky things in the decoded cache, at shard paths and among build sources (issue 24,
High 1-2 and the cache/clear race): entries that are poisoned, truncated, of another shape or kind,
FIFOs where files should be, linked or unsafe cache folders, and a worker losing a race with
``wdsr cache clear``. Real shards from our builder, real files, real DataLoader workers; anything that
could hang runs in a child process under a timeout that only guards against the hang."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import xxhash

import wdsr
from shardmaker import format as mf
from tests.helpers import ROOT, run_epochs, same_batches, save
from wdsr.store import decoded
from wdsr.tools.cli import main as wdsr_main

HANG_GUARD_S = 60  # only ever reached by a hang


def _run(url: str, epochs: int = 1, workers: int = 0, **kw) -> tuple[list, dict]:
    return run_epochs(url, epochs, workers, **kw)


def _entries(root: Path) -> list[Path]:
    return sorted((root / decoded.SUBDIR).glob("*/*.pair"))


def _cache_of(url: Path, root: Path) -> tuple[decoded.DecodedCache, list[str]]:
    m = mf.load(str(url), compact=True)
    return decoded.DecodedCache(str(root), m.digest, 4, None, m.shards), [k for s in m.shards for k in s.keys]


def _with_kind(shards: Path, out: Path) -> Path:
    """A copy of ``shards`` whose manifest records channels and bit depth (3, 8)."""
    shutil.copytree(shards, out)
    doc = json.loads((out / "manifest.json").read_text())
    doc.update(channels=3, bit_depth=8)
    (out / "manifest.json").write_text(json.dumps(doc))
    return out


def _write_entry(path: Path, key: str, hr: np.ndarray, lr: np.ndarray) -> None:
    """An entry in the cache's file format (as a writer of any version might leave it), planar, with
    the right digest of whatever pixels it is given."""
    hr, lr = (np.ascontiguousarray(a[None] if a.ndim == 2 else a.transpose(2, 0, 1)) for a in (hr, lr))
    head = json.dumps(
        {
            "key": key,
            "scale": 4,
            "layout": "chw",
            "xxh3_64": xxhash.xxh3_64_hexdigest(hr.tobytes() + lr.tobytes()),
            "hr": {"shape": list(hr.shape), "dtype": hr.dtype.name},
            "lr": {"shape": list(lr.shape), "dtype": lr.dtype.name},
        }
    ).encode()
    path.write_bytes(decoded.MAGIC + struct.pack("<I", len(head)) + head.ljust(4096 - 12, b"\0") + hr.tobytes() + lr.tobytes())


@pytest.fixture(scope="module")
def plain(photo_shards) -> dict[int, list]:
    """Uncached batches of ``photo_shards`` (two epochs), by worker count."""
    return {w: _run(str(photo_shards), epochs=2, workers=w)[0] for w in (0, 2)}


# ---- entries ------------------------------------------------------------------------------------
def test_a_poisoned_entry_is_not_served_and_is_replaced(photo_shards, plain, tmp_path):
    root = tmp_path / "dc"
    _run(str(photo_shards), workers=2, decoded_cache=str(root))
    victim = _entries(root)[3]
    good = victim.read_bytes()
    poisoned = bytearray(good)
    poisoned[4096 : 4096 + 30000] = bytes(255 - b for b in poisoned[4096 : 4096 + 30000])  # other pixels, same name/shape
    victim.write_bytes(bytes(poisoned))
    got, st = _run(str(photo_shards), epochs=2, workers=2, decoded_cache=str(root))
    assert same_batches(got, plain[2])  # the batches of an uncached run: the poisoned pixels never reached one
    assert st["decoded_rejected"] == 1 and st["decoded_stores"] == 1 and st["decoded_hits"] == st["samples"] - 1
    assert victim.read_bytes() == good  # replaced by the decoded pair


@pytest.mark.parametrize("on_error", ["skip", "fail"])
@pytest.mark.parametrize("variant", ["larger HR", "grey", "16-bit", "LR of another kind"])
def test_an_entry_of_another_shape_or_kind_is_never_served(photo_shards, plain, tmp_path, variant, on_error):
    url = photo_shards if variant in ("larger HR", "LR of another kind") else _with_kind(photo_shards, tmp_path / "ds")
    want = plain[0] if url is photo_shards else _run(str(url), epochs=2)[0]  # another manifest: its own plan
    root = tmp_path / "dc"
    _run(str(url), decoded_cache=str(root))
    cache, keys = _cache_of(url, root)
    key = keys[4]
    hr, lr = cache.lookup(key)
    hr, lr = hr.transpose(1, 2, 0).copy(), lr.transpose(1, 2, 0).copy()
    if variant == "larger HR":  # a consistent pair, 8 px wider than the manifest says
        hr, lr = np.concatenate([hr, hr[:, :8]], axis=1), np.concatenate([lr, lr[:, :2]], axis=1)
    elif variant == "grey":
        hr, lr = hr[..., 0].copy(), lr[..., 0].copy()
    elif variant == "16-bit":
        hr, lr = hr.astype(np.uint16) * 257, lr.astype(np.uint16) * 257
    else:
        lr = lr[..., 0].copy()
    _write_entry(cache.path(key), key, hr, lr)  # a well-formed entry, digest and all, of the wrong pair
    got, st = _run(str(url), epochs=2, decoded_cache=str(root), on_error=on_error)
    assert same_batches(got, want)
    assert st["decoded_rejected"] == 1 and st["skipped"] == 0 and st["decoded_stores"] == 1
    fresh, _ = _cache_of(url, root)
    w, h = mf.load(str(url)).shards[1].hr_sizes[1]
    assert fresh.lookup(key, (int(w), int(h)), 3, 8) is not None  # replaced by the right pair


def test_a_truncated_entry_is_replaced_and_the_next_epoch_is_a_hit(photo_shards, plain, tmp_path):
    root = tmp_path / "dc"
    _run(str(photo_shards), workers=2, decoded_cache=str(root))
    victim = _entries(root)[5]
    size = victim.stat().st_size
    os.truncate(victim, size // 2)
    got, st = _run(str(photo_shards), epochs=2, workers=2, decoded_cache=str(root))
    assert same_batches(got, plain[2])
    assert st["decoded_rejected"] == 1 and st["decoded_stores"] == 1
    assert st["decoded_hits"] == st["samples"] - 1  # decoded once (epoch 0), a hit in epoch 1
    assert victim.stat().st_size == size


_FIFO_ENTRY = textwrap.dedent("""
    import hashlib, json, sys
    import wdsr
    ds = wdsr.SRDataset(sys.argv[1], scale=4, patch_size=48, patches_per_image=3, batch_size=4, shuffle_buffer=8,
                        seed=2, return_keys=True, decoded_cache=sys.argv[2])
    loader = wdsr.make_loader(ds, num_workers=2)
    out = []
    for e in range(2):
        loader.set_epoch(e)
        out += [hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes()).hexdigest() for lr, hr, _ in loader]
    print(json.dumps({"digests": out, "stats": ds.stats.totals()}))
""")


def _child(script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` in a child process (a session of its own); a hang ends it, and everything it
    started, at HANG_GUARD_S."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", script, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"hung: still running after {HANG_GUARD_S} s")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_a_fifo_at_an_entrys_name_never_blocks(photo_shards, plain, tmp_path):
    root = tmp_path / "dc"
    _run(str(photo_shards), decoded_cache=str(root))
    victim = _entries(root)[2]
    victim.unlink()
    os.mkfifo(victim)
    proc = _child(_FIFO_ENTRY, str(photo_shards), str(root))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    want = [hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes()).hexdigest() for lr, hr, _ in plain[2]]
    assert got["digests"] == want  # the decoded pair was served in its place
    assert got["stats"]["decoded_rejected"] == 1 and got["stats"]["decoded_stores"] == 1
    assert stat.S_ISREG(os.lstat(victim).st_mode)  # the FIFO was replaced (renamed over), not opened


def test_a_link_or_folder_at_an_entrys_name_is_refused(photo_shards, tmp_path):
    root = tmp_path / "dc"
    _run(str(photo_shards), decoded_cache=str(root))
    cache, keys = _cache_of(photo_shards, root)
    a, b = cache.path(keys[0]), cache.path(keys[1])
    outside = tmp_path / "elsewhere.pair"
    shutil.copy(a, outside)
    a.unlink()
    a.symlink_to(outside)  # a link to a good entry: still not served (never read through a link)
    b.unlink()
    b.mkdir()
    fresh, _ = _cache_of(photo_shards, root)
    assert fresh.lookup(keys[0]) is None and fresh.lookup(keys[1]) is None and fresh.take_rejected() == 2
    _, st = _run(str(photo_shards), decoded_cache=str(root))
    assert st["decoded_rejected"] == 2 and st["decoded_stores"] == 1  # the link replaced, the folder left alone
    assert not a.is_symlink() and a.is_file() and b.is_dir() and outside.read_bytes() == a.read_bytes()


# ---- folders ------------------------------------------------------------------------------------
def test_the_cache_makes_its_folders_0700(photo_shards, tmp_path):
    root = tmp_path / "a" / "b" / "dc"
    _run(str(photo_shards), decoded_cache=str(root))
    digest = mf.load(str(photo_shards)).digest
    for p in (tmp_path / "a", tmp_path / "a" / "b", root, root / decoded.SUBDIR, root / decoded.SUBDIR / digest):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p


@pytest.mark.parametrize("level", ["root", "subfolder", "dataset"])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_folder_others_can_write_is_refused(photo_shards, tmp_path, level, mode):
    root = tmp_path / "dc"
    _run(str(photo_shards), decoded_cache=str(root))
    folder = {
        "root": root,
        "subfolder": root / decoded.SUBDIR,
        "dataset": root / decoded.SUBDIR / mf.load(str(photo_shards)).digest,
    }[level]
    folder.chmod(mode)
    with pytest.raises(decoded.CacheFolderError, match="can be written by others") as exc:
        wdsr.SRDataset(str(photo_shards), scale=4, patch_size=48, decoded_cache=str(root))
    assert str(folder) in str(exc.value) and len(str(exc.value).splitlines()) == 1
    if level != "dataset":
        before = len(_entries(root))
        assert wdsr_main(["cache", "clear", str(root)]) == 2 and len(_entries(root)) == before


def test_a_folder_owned_by_someone_else_is_refused(tmp_path):
    # Another uid's folder can't be made without root: the check is fed an lstat of our own folder
    # with another owner (the real thing, as root, is the test below).
    st = os.lstat(tmp_path)
    theirs = os.stat_result((stat.S_IFDIR | 0o700, st.st_ino, st.st_dev, 2, os.geteuid() + 1, st.st_gid, 4096, 0, 0, 0))
    why = decoded.folder_problem(theirs, os.geteuid())
    assert why is not None and f"uid {os.geteuid() + 1}" in why
    assert decoded.folder_problem(st, os.geteuid()) is None  # ours, 0700: fine
    assert "symbolic link" in decoded.folder_problem(
        os.stat_result((stat.S_IFLNK | 0o777, 1, 1, 1, os.geteuid(), 0, 1, 0, 0, 0)), os.geteuid()
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user owns needs root")
def test_a_real_folder_owned_by_someone_else_is_refused(photo_shards, tmp_path):
    root = tmp_path / "dc"
    root.mkdir(mode=0o700)
    os.chown(root, 65534, 65534)
    with pytest.raises(decoded.CacheFolderError, match="owned by uid 65534"):
        wdsr.SRDataset(str(photo_shards), scale=4, patch_size=48, decoded_cache=str(root))


@pytest.mark.parametrize("level", ["root", "subfolder"])
def test_a_linked_cache_folder_is_refused_and_clear_deletes_nothing_through_it(photo_shards, tmp_path, level):
    target = tmp_path / "target"
    _run(str(photo_shards), decoded_cache=str(target))
    before = {p: p.read_bytes() for p in _entries(target)}
    assert len(before) == 10
    if level == "root":
        root = tmp_path / "link"
        root.symlink_to(target)
    else:
        root = tmp_path / "dc"
        root.mkdir(mode=0o700)
        (root / decoded.SUBDIR).symlink_to(target / decoded.SUBDIR)
    with pytest.raises(decoded.CacheFolderError, match="symbolic link"):
        wdsr.SRDataset(str(photo_shards), scale=4, patch_size=48, decoded_cache=str(root))
    with pytest.raises(decoded.CacheFolderError, match="symbolic link"):
        decoded.clear(root)
    assert wdsr_main(["cache", "clear", str(root)]) == 2
    assert {p: p.read_bytes() for p in _entries(target)} == before  # nothing deleted or written through it


def test_clear_leaves_a_linked_dataset_folder_and_its_target_alone(photo_shards, tmp_path):
    target = tmp_path / "target"
    _run(str(photo_shards), decoded_cache=str(target))
    digest = mf.load(str(photo_shards)).digest
    root = tmp_path / "dc"
    (root / decoded.SUBDIR).mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    (root / decoded.SUBDIR / ("f" * 64)).symlink_to(target / decoded.SUBDIR / digest)
    assert decoded.clear(root) == 0 and len(_entries(target)) == 10
    assert decoded.usage(root) == []


# ---- special files at shard paths and among build sources ------------------------------------
_FIFO_SHARD = textwrap.dedent("""
    import json, sys
    import wdsr
    out = {}
    for on_error in ("fail", "skip"):
        ds = wdsr.SRDataset(sys.argv[1], scale=4, patch_size=48, patches_per_image=3, batch_size=4, seed=2,
                            on_error=on_error)
        try:
            n = sum(1 for _ in wdsr.make_loader(ds, num_workers=0))
            out[on_error] = {"batches": n, "stats": ds.stats.totals()}
        except wdsr.SampleError as exc:
            out[on_error] = {"error": str(exc)}
    print(json.dumps(out))
""")


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_a_special_file_at_a_shard_path_is_a_clear_error(photo_shards, tmp_path, kind):
    ds = tmp_path / "ds"
    shutil.copytree(photo_shards, ds)
    shard = ds / mf.load(str(ds)).shards[1].name
    shard.unlink()
    {"fifo": lambda: os.mkfifo(shard), "folder": shard.mkdir, "device": lambda: shard.symlink_to("/dev/zero")}[kind]()
    proc = _child(_FIFO_SHARD, str(ds))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    what = {"fifo": "is a FIFO", "folder": "is a directory", "device": "is a character device"}[kind]
    err = got["fail"]["error"]
    assert shard.name in err and what in err and len(err.splitlines()) == 1, err
    assert got["skip"]["stats"]["skipped"] == 3 and got["skip"]["batches"] > 0  # the shard's 3 samples, like any unreadable shard


_FIFO_SOURCE = textwrap.dedent("""
    import json, sys
    import fsspec
    from shardmaker.builder import sample, sources
    from shardmaker.errors import InputError
    fifo = sys.argv[1]
    out = {}
    try:
        sources.header_size(fsspec.filesystem("file"), fifo, ".png")
    except InputError as exc:
        out["header"] = str(exc)
    pair = sources.Pair("b", fifo, "b.png", (64, 64))
    try:
        sample.encode_sample(pair, sample.SampleConfig(scales=(2,)))
    except InputError as exc:
        out["encode"] = str(exc)
    out["skip"] = repr(sample.encode_or_skip(pair, sample.SampleConfig(scales=(2,)), sample.OnError.SKIP))
    print(json.dumps(out))
""")


def test_a_fifo_among_build_sources_is_a_clear_error_or_skipped(tmp_path):
    src = tmp_path / "src"
    save(src / "a.png", np.zeros((64, 64, 3), np.uint8))
    os.mkfifo(src / "b.png")
    proc = _child(_FIFO_SOURCE, str(src / "b.png"))  # a FIFO swapped in after the scan, read by a build worker
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for step in ("header", "encode"):
        assert got[step] == f"{src / 'b.png'}: is a FIFO, not a regular file"
    assert "is a FIFO" in got["skip"] and "Skipped" in got["skip"]
    proc = _child(
        "import sys; from shardmaker.cli import main; sys.exit(main(sys.argv[1:]))",
        "-q",
        "build",
        str(src),
        str(tmp_path / "out"),
        "--scale",
        "2",
        "--workers",
        "1",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]  # the scan leaves it out as not a regular file
    assert mf.load(str(tmp_path / "out")).samples == 1


# ---- the race with wdsr cache clear ------------------------------------------------------------
class _ClearedWhileWriting(decoded.DecodedCache):
    """A cache whose folder is removed (``decoded.clear``, as ``wdsr cache clear`` would) just before
    each of its next ``races`` temp files is opened: the worst moment for a writer."""

    races = 0

    def open_temp(self, path: Path) -> int:
        if self.races:
            self.races -= 1
            decoded.clear(self.root)
            assert not path.parent.exists()
        return super().open_temp(path)


def test_a_writer_that_loses_a_race_with_clear_retries_once_and_keeps_its_cache(tmp_path):
    rng = np.random.default_rng(1)
    hr, lr = rng.integers(0, 255, (64, 96, 3), dtype=np.uint8), rng.integers(0, 255, (16, 24, 3), dtype=np.uint8)
    c = _ClearedWhileWriting(str(tmp_path / "dc"), "cd" * 32, 4, None, [])
    c.races = 1
    assert c.store("a", hr, lr)  # the folder went once: made again (0700, checked) and written
    assert stat.S_IMODE(c.folder.stat().st_mode) == 0o700 and c.lookup("a") is not None
    c.races = 2
    assert not c.store("b", hr, lr)  # gone again on the retry: this sample is given up...
    assert c.store("c", hr, lr) and c.lookup("c") is not None  # ...but the cache is still in use
    assert not c._disabled and c.lookup("b") is None and c.take_rejected() == 0


def test_clear_between_epochs_of_a_run_with_workers_refills_the_cache(photo_shards, plain, tmp_path):
    root = tmp_path / "dc"
    ds = wdsr.SRDataset(
        str(photo_shards),
        scale=4,
        patch_size=48,
        patches_per_image=3,
        batch_size=4,
        shuffle_buffer=8,
        seed=2,
        return_keys=True,
        decoded_cache=str(root),
    )
    loader = wdsr.make_loader(ds, num_workers=2, persistent_workers=True)
    got = []
    for e in range(2):
        loader.set_epoch(e)
        got += [(lr.clone(), hr.clone(), keys) for lr, hr, keys in loader]
        if e == 0:
            assert decoded.clear(root) == 10
    st = ds.stats.totals()
    assert same_batches(got, plain[2]) and st["decoded_stores"] == 20 and len(_entries(root)) == 10
