"""The node-wide decoded-pair cache (``decoded_cache=``): real files on disk and on tmpfs, real
DataLoader workers, spawned fillers, a writer killed with SIGKILL, a full tmpfs, two ranks."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import wdsr
from shardmaker import format as mf
from tests.helpers import ROOT, build_shards, run_epochs, same_batches, torchrun, wait_until
from wdsr.store import decoded
from wdsr.tools.cli import main as wdsr_main


def _run(url: str, epochs: int = 2, workers: int = 2, **kw) -> tuple[list, dict]:
    return run_epochs(url, epochs, workers, **kw)


def _files(root: Path, pattern: str = "*.pair") -> list[Path]:
    return sorted((root / decoded.SUBDIR).glob(f"*/{pattern}"))


def test_cached_batches_are_byte_identical_and_later_epochs_read_nothing(photo_shards, tmp_path):
    plain, _ = _run(str(photo_shards))
    root = tmp_path / "dc"
    first, st1 = _run(str(photo_shards), decoded_cache=str(root))
    assert same_batches(first, plain)
    assert st1["decoded_stores"] == 10 and len(_files(root)) == 10  # epoch 0 filled it, once per image
    assert st1["decoded_hits"] >= 10  # epoch 1 cut every patch from it
    again, st2 = _run(str(photo_shards), decoded_cache=str(root))
    assert same_batches(again, plain)
    assert st2["decoded_stores"] == 0 and st2["decoded_hits"] == st2["samples"] > 0 and st2["bytes_read"] == 0
    val_plain = [(v.lr, v.hr, v.key) for v in wdsr.make_loader(wdsr.SRDataset(str(photo_shards), scale=4, split="val"))]
    ds = wdsr.SRDataset(str(photo_shards), scale=4, split="val", decoded_cache=str(root))
    val_cached = [(v.lr, v.hr, v.key) for v in wdsr.make_loader(ds, num_workers=2)]
    assert same_batches(sorted(val_cached, key=lambda v: v[2]), sorted(val_plain, key=lambda v: v[2]))
    assert ds.stats.totals()["decoded_hits"] == 10


def test_a_limit_caches_the_same_subset_in_every_process(photo_shards, tmp_path):
    m = mf.load(str(photo_shards), compact=True)
    total = sum(decoded.pair_bytes(wh, 4, 3) + 4096 for sh in m.shards for wh in sh.hr_sizes)
    root = tmp_path / "dc"
    plain, _ = _run(str(photo_shards))
    got, st = _run(str(photo_shards), decoded_cache=str(root), decoded_cache_limit=total // 2)
    assert same_batches(got, plain)
    written = {json.loads(p.read_bytes()[12:4096].rstrip(b"\0"))["key"] for p in _files(root)}
    assert 0 < len(written) < 10 and sum(p.stat().st_size for p in _files(root)) <= total // 2
    c = decoded.DecodedCache(str(root), m.digest, 4, total // 2, m.shards)
    assert {k for sh in m.shards for k in sh.keys if c.admits(k, 3)} == written  # the subset, computed anew
    _, st2 = _run(str(photo_shards), decoded_cache=str(root), decoded_cache_limit=total // 2)
    assert st2["decoded_stores"] == 0 and 0 < st2["decoded_hits"] < st2["samples"]  # no churn: nothing new written


def _store(args: tuple) -> bool:
    root, identity, key, hr, lr, barrier = args
    c = decoded.DecodedCache(root, identity, 4, None, [])
    barrier.wait()
    return c.store(key, hr, lr)


def test_concurrent_fills_give_one_complete_file(tmp_path):
    rng = np.random.default_rng(0)
    hr = rng.integers(0, 255, (1200, 1600, 3), dtype=np.uint8)  # ~6 MB: the writes overlap
    lr = rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)
    identity = hashlib.sha256(b"a dataset").hexdigest()
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            won = pool.map(_store, [(str(tmp_path), identity, "frames/a.v1", hr, lr, barrier)] * 4)
    assert sum(won) <= 1 and len(_files(tmp_path)) == 1 and not _files(tmp_path, "*.tmp.*")
    got = decoded.DecodedCache(str(tmp_path), identity, 4, None, []).lookup("frames/a.v1")
    assert got is not None and np.array_equal(got[0], hr.transpose(2, 0, 1)) and np.array_equal(got[1], lr.transpose(2, 0, 1))


_SLOW_WRITER = textwrap.dedent("""
    import builtins, sys, threading, numpy as np
    from wdsr.store import decoded

    class Stuck:  # a writer that stops after its second write until it is killed (as a hung disk would)
        def __init__(self, f): self.f, self.n = f, 0
        def __enter__(self): return self
        def __exit__(self, *a): self.f.close()
        def write(self, b):
            self.f.write(b); self.f.flush(); self.n += 1
            if self.n == 2: threading.Event().wait()

    decoded.open = lambda p, mode: Stuck(builtins.open(p, mode))
    c = decoded.DecodedCache(sys.argv[1], "ab" * 32, 4, None, [])
    c.store("k", np.ones((400, 400, 3), np.uint8), np.ones((100, 100, 3), np.uint8))
""")


def test_a_writer_killed_mid_write_leaves_nothing_readable(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, str(tmp_path)], env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_until(
            lambda: _files(tmp_path, "*.tmp.*") and _files(tmp_path, "*.tmp.*")[0].stat().st_size >= 4096 + 480000,
            "second write of the writer",
            alive=proc,
        )
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    c = decoded.DecodedCache(str(tmp_path), "ab" * 32, 4, None, [])
    assert not c.has("k") and c.lookup("k") is None  # the temp name is never read
    (u,) = decoded.usage(tmp_path)
    assert (u.pairs, u.temps) == (0, 1)
    assert c.store("k", np.ones((400, 400, 3), np.uint8), np.ones((100, 100, 3), np.uint8))  # a later fill works
    assert c.lookup("k") is not None
    assert decoded.clear(tmp_path) == 2 and not (tmp_path / decoded.SUBDIR).exists()


_FULL = textwrap.dedent("""
    import hashlib, json, logging, sys
    import wdsr
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    ds = wdsr.SRDataset(sys.argv[1], scale=4, patch_size=48, patches_per_image=3, batch_size=4, shuffle_buffer=8,
                        seed=2, return_keys=True, decoded_cache=sys.argv[2])
    loader = wdsr.make_loader(ds, num_workers=0)
    out = []
    for e in range(2):
        loader.set_epoch(e)
        out += [hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes()).hexdigest() for lr, hr, _ in loader]
    print(json.dumps({"digests": out, "stats": ds.stats.totals()}))
""")


def _in_tiny_tmpfs(script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` in its own mount namespace with a 128 KiB tmpfs at ``tmp``: our own user namespace
    (unshare -rm), or plain root."""
    mnt = tempfile.mkdtemp()
    inner = f'mount -t tmpfs -o size=128k tmpfs "{mnt}" && exec "$0" -c "$1" "$2" "{mnt}/dc"'
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        for prefix in (["unshare", "-rm"], ["unshare", "-m"]):
            if shutil.which("unshare") is None:
                break
            proc = subprocess.run(
                [*prefix, "sh", "-c", inner, sys.executable, script, *args], capture_output=True, text=True, timeout=300, env=env
            )
            if "mount" not in proc.stderr and "unshare" not in proc.stderr:
                return proc
        pytest.skip("no way to mount a tiny tmpfs here (unshare -rm and -m both refused)")
    finally:
        os.rmdir(mnt)


def test_a_full_filesystem_falls_back_to_decoding_with_one_warning(photo_shards):
    proc = _in_tiny_tmpfs(_FULL, str(photo_shards))
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    plain, _ = _run(str(photo_shards), workers=0)
    want = [hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes()).hexdigest() for lr, hr, _ in plain]
    assert got["digests"] == want  # the same batches, every one of them
    warnings = [line for line in proc.stderr.splitlines() if "decoded cache" in line]
    assert len(warnings) == 1 and "ENOSPC" in warnings[0], proc.stderr[-2000:]
    assert got["stats"]["decoded_stores"] < 10


def test_two_datasets_never_share_entries(photo_src, photo_shards, tmp_path):
    other = build_shards(photo_src, tmp_path / "qoi", "--scale", "2,4", "--max-samples", "3", "--codec", "qoi")
    a, b = mf.load(str(photo_shards)), mf.load(str(other))
    assert [k for s in a.shards for k in s.keys] == [k for s in b.shards for k in s.keys] and a.digest != b.digest
    root = tmp_path / "dc"
    _run(str(photo_shards), epochs=1, decoded_cache=str(root))
    plain_b, _ = _run(str(other), epochs=1)
    got_b, st = _run(str(other), epochs=1, decoded_cache=str(root))
    assert same_batches(got_b, plain_b) and st["decoded_hits"] == 0 and st["decoded_stores"] == 10
    assert sorted(u.dataset for u in decoded.usage(root)) == sorted([a.digest, b.digest])
    assert all(u.pairs == 10 for u in decoded.usage(root))


def test_wdsr_cache_info_and_clear_touch_only_their_files(photo_shards, tmp_path, capsys):
    root = tmp_path / "dc"
    _run(str(photo_shards), epochs=1, decoded_cache=str(root))
    (root / "mine.txt").write_text("keep")
    (root / decoded.SUBDIR / "notes.txt").write_text("keep too")
    digest = mf.load(str(photo_shards)).digest
    assert wdsr_main(["cache", "info", str(root)]) == 0
    out = capsys.readouterr().out
    assert digest[:16] in out and " 10 " in out
    assert wdsr_main(["cache", "clear", str(root), "--dataset", "0" * 8]) == 0  # no such dataset: nothing removed
    assert "removed 0 file(s)" in capsys.readouterr().out and len(_files(root)) == 10
    assert wdsr_main(["cache", "clear", str(root)]) == 0
    assert "removed 10 file(s)" in capsys.readouterr().out
    assert not _files(root) and (root / "mine.txt").exists() and (root / decoded.SUBDIR / "notes.txt").exists()


@pytest.mark.slow
def test_two_ranks_and_their_workers_share_one_copy(photo_shards, tmp_path):
    root = Path(tempfile.mkdtemp(prefix="wdsr-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        plain = torchrun(2, str(photo_shards), tmp_path / "plain", workers=2)
        cached = torchrun(2, str(photo_shards), tmp_path / "cached", workers=2, env={"WDSR_DECODED_CACHE": str(root)})
        for p, c in zip(plain, cached):
            assert [e["digests"] for e in p["epochs"]] == [e["digests"] for e in c["epochs"]]
        assert sum(r["epochs"][0]["stats"]["decoded_stores"] for r in cached) == len(_files(root)) == 10  # one copy a node
        for r in cached:  # epoch 1: every sample from the cache, also those the other rank decoded
            e1 = r["epochs"][1]["stats"]
            assert e1["decoded_hits"] == e1["samples"] > 0 and e1["bytes_read"] == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_process_keeps_a_bounded_number_of_pairs_mapped(photo_shards, tmp_path, monkeypatch):
    root = tmp_path / "dc"
    _run(str(photo_shards), epochs=1, workers=0, decoded_cache=str(root))
    m = mf.load(str(photo_shards), compact=True)
    c = decoded.DecodedCache(str(root), m.digest, 4, None, m.shards)
    keys = [k for s in m.shards for k in s.keys]
    monkeypatch.setattr(decoded, "MAX_MAPPED", 3)
    first = c.lookup(keys[0])
    assert c.lookup(keys[0]) is first  # kept: the same arrays, no new mapping
    for k in keys[1:]:
        assert c.lookup(k) is not None
    assert list(c._mapped) == keys[-3:] and c._mapped_bytes == sum(a.nbytes + b.nbytes for a, b in c._mapped.values())
    assert c.lookup(keys[0]) is not first  # dropped, mapped again
    (root / decoded.SUBDIR / m.digest / decoded._name(keys[-1], 4)).unlink()  # wdsr cache clear, one file
    got, st = _run(str(photo_shards), epochs=1, workers=0, decoded_cache=str(root))
    assert st["decoded_stores"] == 1 and st["decoded_hits"] == st["samples"] - 1
    import pickle

    assert not pickle.loads(pickle.dumps(c))._mapped  # mappings never travel to another process


def test_a_pair_removed_while_kept_mapped_is_decoded_and_written_again(photo_shards, tmp_path):
    root = tmp_path / "dc"
    ds = wdsr.SRDataset(
        str(photo_shards),
        scale=4,
        patch_size=48,
        patches_per_image=3,
        batch_size=4,
        shuffle_buffer=8,
        seed=2,
        decoded_cache=str(root),
    )
    loader = wdsr.make_loader(ds, num_workers=0)  # one process: its kept mappings live across epochs
    for e in range(2):
        loader.set_epoch(e)
        list(loader)
    cache = ds._source.cache
    assert len(cache._mapped) == 10
    files = _files(root)
    key = json.loads(files[0].read_bytes()[12:4096].rstrip(b"\0"))["key"]
    stale = cache._mapped[key]
    files[0].unlink()  # wdsr cache clear, for one pair
    before = ds.stats.totals()
    loader.set_epoch(2)
    list(loader)
    after = ds.stats.totals()
    assert after["decoded_stores"] - before["decoded_stores"] == 1 and files[0].exists()
    assert after["decoded_hits"] - before["decoded_hits"] == after["samples"] - before["samples"] - 1
    assert key not in cache._mapped and all(v is not stale for v in cache._mapped.values())  # the stale mapping let go
