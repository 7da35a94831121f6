"""The streaming pipeline on real shards with real DataLoader worker processes."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import wdsr
from shardmaker.imaging.resize import ResizeMethod, downscale
from tests.helpers import FakeClock, build_shards, photos, rewrite, save
from wdsr.env import World


def run(ds: wdsr.SRDataset, workers: int = 2) -> list[tuple]:
    return list(wdsr.make_loader(ds, num_workers=workers, persistent_workers=False))


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.numpy().tobytes()).hexdigest()


def test_alignment_lr_patch_is_bicubic_of_hr_patch(photo_shards):
    """Every LR patch equals the MATLAB bicubic of its HR patch away from the patch border."""
    for scale, augment in ((4, False), (4, True), (2, True)):
        ds = wdsr.SRDataset(
            str(photo_shards),
            scale=scale,
            patch_size=64,
            patches_per_image=6,
            batch_size=6,
            shuffle_buffer=16,
            augment=augment,
            seed=1,
        )
        m = 3  # LR pixels near the patch border also depend on HR pixels outside the patch
        exact = total = 0
        for lr, hr in run(ds):
            for a, b in zip(lr, hr):
                ref = downscale(np.ascontiguousarray(b.permute(1, 2, 0).numpy()), scale, ResizeMethod.MATLAB)
                got = a.permute(1, 2, 0).numpy()[m:-m, m:-m].astype(int)
                want = ref[m:-m, m:-m].astype(int)
                diff = np.abs(got - want)
                assert diff.max() <= (0 if not augment else 1)  # flips only reorder float sums
                exact += int((diff == 0).sum())
                total += diff.size
        assert exact / total > 0.999


def test_shapes_dtypes_and_len_is_exact(photo_shards):
    for workers in (0, 1, 2, 3):
        ds = wdsr.SRDataset(str(photo_shards), scale=4, patch_size=48, patches_per_image=5, batch_size=4)
        loader = wdsr.make_loader(ds, num_workers=workers, persistent_workers=False)
        batches = list(loader)
        assert len(batches) == len(loader) == max(1, workers) * ds.batches_per_worker(workers)
        lr, hr = batches[0]
        assert lr.dtype == hr.dtype == torch.uint8
        assert lr.shape == (4, 3, 12, 12) and hr.shape == (4, 3, 48, 48)
        assert lr.is_contiguous() and hr.is_contiguous()
    assert wdsr.to_float(lr).max() <= 1.0 and wdsr.to_float(lr).dtype == torch.float32


def test_patch_size_must_be_multiple_of_scale(photo_shards):
    with pytest.raises(ValueError, match="multiple of scale 4"):
        wdsr.SRDataset(str(photo_shards), scale=4, patch_size=50)
    with pytest.raises(ValueError, match="no x3 LR"):
        wdsr.SRDataset(str(photo_shards), scale=3, patch_size=48)


def test_determinism_epochs_and_persistent_workers(photo_shards):
    def make():
        return wdsr.SRDataset(
            str(photo_shards), scale=2, patch_size=32, patches_per_image=4, batch_size=4, shuffle_buffer=32, seed=5
        )

    a = [digest(lr) + digest(hr) for lr, hr in run(make())]
    b = [digest(lr) + digest(hr) for lr, hr in run(make())]
    assert a == b
    ds = make()
    ds.set_epoch(3)
    c = [digest(lr) for lr, _ in run(ds)]
    assert c != [x[:40] for x in a]
    # persistent workers: set_epoch in the trainer reaches them; a pass without set_epoch advances
    ds = make()
    loader = wdsr.make_loader(ds, num_workers=2, persistent_workers=True)
    e0 = [digest(lr) for lr, _ in loader]
    ds.set_epoch(3)
    e3 = [digest(lr) for lr, _ in loader]
    e4 = [digest(lr) for lr, _ in loader]  # no set_epoch: next epoch
    assert e0 == [x[:40] for x in a] and e3 == c
    ref = make()
    ref.set_epoch(4)
    assert e4 == [digest(lr) for lr, _ in run(ref)] and loader.epoch == 4  # the loader owns the epoch counter


def test_patches_do_not_depend_on_world_size_or_workers(photo_shards):
    def patches(world: World, workers: int) -> Counter:
        ds = wdsr.SRDataset(
            str(photo_shards),
            scale=4,
            patch_size=48,
            patches_per_image=3,
            batch_size=1,
            shuffle_buffer=0,
            seed=2,
            world=world,
            return_keys=True,
        )
        return Counter((keys[0], digest(lr), digest(hr)) for lr, hr, keys in run(ds, workers))

    one = patches(World(0, 1), 1)
    many = sum((patches(World(r, 3), 2) for r in range(3)), Counter())
    assert sum(one.values()) == len(one) == 10 * 3
    assert set(one) <= set(many)  # the same coordinates and transforms whatever the world
    # 3 ranks x 2 workers x ceil(10/6) = 12 slots for 10 samples: 2 padding samples, 3 new patches each
    assert len(set(many) - set(one)) == 2 * 3


def test_shuffle_buffer_mixes_images_in_a_batch(photo_shards):
    def distinct_per_batch(buffer: int) -> float:
        ds = wdsr.SRDataset(
            str(photo_shards),
            scale=2,
            patch_size=32,
            patches_per_image=8,
            batch_size=8,
            shuffle_buffer=buffer,
            seed=0,
            return_keys=True,
        )
        counts = [len(set(keys)) for _, _, keys in run(ds, 1)]
        return float(np.mean(counts))

    unmixed, mixed = distinct_per_batch(0), distinct_per_batch(64)
    assert unmixed == 1.0  # k = batch: each batch is one image
    # buffer 64 holds ~8 images' patches: expect ~8 * (1 - (7/8)^8) = 5.3 distinct in 8 draws
    assert mixed >= 3.5, mixed


def test_min_patch_std_rejects_flat_patches(tmp_path):
    img = photos()[0][:128, :128].copy()
    img[:, :96] = 0  # a black border over three quarters of the frame (endoscope style)
    save(tmp_path / "src/e.png", img)
    shards = build_shards(tmp_path / "src", tmp_path / "ds", "--scale", "4")
    kw = dict(scale=4, patch_size=32, patches_per_image=32, batch_size=32, shuffle_buffer=0, augment=False)
    plain = wdsr.SRDataset(str(shards), **kw)
    picky = wdsr.SRDataset(str(shards), min_patch_std=5.0, max_tries=20, **kw)
    flat = lambda ds: sum(float(h.float().std()) < 1.0 for lr, hr in run(ds, 0) for h in hr)  # noqa: E731
    assert flat(plain) >= 10 and flat(picky) == 0
    assert picky.stats.totals()["rejected"] > 0


def test_val_every_image_once_in_order_whole_and_tiled(photo_shards):
    from shardmaker.format import load

    order = [k for s in load(str(photo_shards)).shards for k in s.keys]
    seen = []
    for rank in range(3):
        ds = wdsr.SRDataset(str(photo_shards), scale=4, split="val", world=World(rank, 3))
        items = run(ds, 2)
        assert len(items) == len(ds)
        seen += [it.key for it in items]
        for it in items:
            assert it.lr.shape[0] == 1 and it.hr.shape[-1] == 4 * it.lr.shape[-1]
    assert seen == order
    tiled = wdsr.SRDataset(str(photo_shards), scale=4, split="val", tile=24, tile_overlap=6)
    whole = {it.key: it.hr[0] for it in run(wdsr.SRDataset(str(photo_shards), scale=4, split="val"), 0)}
    for it in run(tiled, 2):
        assert it.lr.shape[0] > 1 and it.lr.shape[-1] == 24
        w, h = it.lr_size  # (w, h), as every size in wdsr
        assert (4 * h, 4 * w) == tuple(whole[it.key].shape[-2:])
        back = wdsr.stitch(it.hr, [tuple(b) for b in it.boxes], 4, tuple(it.lr_size))
        assert torch.equal(back.round().to(torch.uint8), whole[it.key])
        if w != h:  # an (h, w) size is refused, not stitched into the wrong shape
            with pytest.raises(ValueError, match="lr_size"):
                wdsr.stitch(it.hr, [tuple(b) for b in it.boxes], 4, (h, w))


# ---- bad input ---------------------------------------------------------------------------------


@pytest.fixture()
def shards_copy(photo_shards, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(photo_shards, tmp_path / "copy"))


def first_key(ds: Path, shard_index: int = 1) -> tuple[str, str]:
    doc = json.loads((ds / "manifest.json").read_text())
    return doc["shards"][shard_index]["name"], doc["shards"][shard_index]["keys"][0]


def check_fail_then_skip(ds: Path, shard: str, key: str | None, reason: str, **kw) -> None:
    args = dict(scale=4, patch_size=48, patches_per_image=3, batch_size=4, **kw)
    with pytest.raises(Exception) as exc:
        run(wdsr.SRDataset(str(ds), **args), 2)
    msg = str(exc.value)
    assert shard in msg and reason in msg and (key is None or repr(key) in msg), msg
    sk = wdsr.SRDataset(str(ds), on_error="skip", **args)
    loader = wdsr.make_loader(sk, num_workers=2, persistent_workers=False)
    assert len(list(loader)) == len(loader)  # the batch count per rank stays what it promised
    assert sk.stats.totals()["skipped"] >= 1


def test_corrupt_png_inside_a_shard(shards_copy):
    shard, key = first_key(shards_copy)

    def edit(name, data):
        if name == f"{key}.hr.png":
            data = data[:200] + bytes(b ^ 0x5A for b in data[200:260]) + data[260:]
        return name, data

    rewrite(shards_copy, 1, edit)
    check_fail_then_skip(shards_copy, shard, key, "does not match its xxh3_64")
    check_fail_then_skip(shards_copy, shard, key, "does not match its sha256", verify="sha256")
    check_fail_then_skip(shards_copy, shard, key, "hr.png: corrupt", verify="none")  # libspng's own CRC check


def test_missing_lr_member(shards_copy):
    shard, key = first_key(shards_copy)
    rewrite(shards_copy, 1, lambda n, d: None if n == f"{key}.lr_x4.png" else (n, d))
    check_fail_then_skip(shards_copy, shard, key, "no lr_x4.png member")


def test_wrong_scale_lr(shards_copy):
    shard, key = first_key(shards_copy)
    members = {}

    def grab(name, data):
        members[name] = data
        return name, data

    rewrite(shards_copy, 1, grab)
    rewrite(shards_copy, 1, lambda n, d: (n, members[f"{key}.lr_x2.png"]) if n == f"{key}.lr_x4.png" else (n, d))
    check_fail_then_skip(shards_copy, shard, key, "is not 4 x LR", verify="none")


def test_truncated_shard_and_manifest_bytes_mismatch(shards_copy):
    shard, _ = first_key(shards_copy, 2)
    path = shards_copy / shard
    path.write_bytes(path.read_bytes()[:-3000])
    check_fail_then_skip(shards_copy, shard, None, "the manifest says")


def test_skip_logs_once_and_counts(shards_copy, caplog):
    shard, key = first_key(shards_copy)
    rewrite(shards_copy, 1, lambda n, d: None if n == f"{key}.lr_x4.png" else (n, d))
    ds = wdsr.SRDataset(str(shards_copy), scale=4, patch_size=48, patches_per_image=3, batch_size=4, on_error="skip")
    with caplog.at_level("WARNING", logger="wdsr"):
        n = len(run(ds, 0))
        ds.set_epoch(1)
        n2 = len(run(ds, 0))
    assert n == n2 == len(ds)
    lines = [r for r in caplog.records if key in r.getMessage()]
    assert len(lines) == 1 and shard in lines[0].getMessage()
    assert ds.stats.totals()["skipped"] == 2  # once per epoch, counted each time


def test_16bit_grey_streams_as_uint16(tmp_path):
    grey = photos()[1][:120, :160, 1].astype(np.uint16) * 257 + 7
    save(tmp_path / "src/g16.png", grey)
    shards = build_shards(tmp_path / "src", tmp_path / "ds", "--scale", "2")
    ds = wdsr.SRDataset(str(shards), scale=2, patch_size=32, patches_per_image=4, batch_size=4, augment=False, return_keys=True)
    ((lr, hr, keys),) = run(ds, 1)
    assert lr.dtype == hr.dtype == torch.uint16 and hr.shape == (4, 1, 32, 32)
    assert int(hr.to(torch.int32).max()) > 255  # 16 bits kept end to end (torch.uint16 has few ops: convert)
    assert float(wdsr.to_float(hr).max()) <= 1.0


def test_too_few_patches_for_one_batch_is_refused(photo_shards):
    ds = wdsr.SRDataset(str(photo_shards), scale=4, patch_size=48, patches_per_image=2, batch_size=16)
    with pytest.raises(ValueError, match="< batch_size 16"):
        wdsr.make_loader(ds, num_workers=4)


def test_shared_slot_handoff_gives_the_same_batches(photo_shards):
    def batches(pool: bool) -> list[str]:
        ds = wdsr.SRDataset(
            str(photo_shards), scale=2, patch_size=32, patches_per_image=8, batch_size=4, shuffle_buffer=16, seed=9
        )
        loader = wdsr.make_loader(ds, num_workers=2, persistent_workers=False, prefetch_factor=2, shared_slots=pool)
        assert (loader._pool is not None and loader._pool.slots == 5) if pool else loader._pool is None
        out = []
        for lr, hr in loader:
            assert lr.is_shared() != pool  # slots are lent as plain views; torch's path sends shared tensors
            out.append(digest(lr) + digest(hr))
        assert len(out) == len(loader) > 2 * 5  # more batches than both workers' slots: slots were recycled
        return out

    assert batches(True) == batches(False)


def test_batches_the_trainer_holds_are_never_overwritten(photo_shards):
    """Unpinned batches are lent slots: a slot comes back only when the batch and every view of it
    are gone. A trainer that keeps every batch of an epoch (more than all the slots) still sees
    each one as it arrived; the workers send the rest torch's way."""
    import gc

    ds = wdsr.SRDataset(str(photo_shards), scale=2, patch_size=32, patches_per_image=8, batch_size=4, shuffle_buffer=16, seed=9)
    loader = wdsr.make_loader(ds, num_workers=2, prefetch_factor=2, pin_memory=False)
    pool = loader._pool
    held, seen = [], []
    for lr, hr in loader:
        part = hr[1:, :, 3:]  # a view: the slot must stay lent through it alone
        seen.append(digest(lr) + digest(part))
        held.append((lr, part))
        del hr
    lent = int(pool._busy.sum())
    assert 0 < lent <= pool.workers * pool.slots < len(held)  # every slot held, the rest came torch's way
    assert [digest(lr) + digest(part) for lr, part in held] == seen
    ds.set_epoch(0)
    again = [digest(lr) + digest(hr[1:, :, 3:]) for lr, hr in loader]
    assert again == seen
    held.clear()
    del lr, part
    gc.collect()
    assert int(pool._busy.sum()) == 0  # all slots back once nothing holds them


def test_two_loaders_on_one_dataset_keep_their_own_slots(photo_shards):
    ds = wdsr.SRDataset(str(photo_shards), scale=2, patch_size=32, patches_per_image=4, batch_size=8, seed=3)
    first = wdsr.make_loader(ds, num_workers=2)
    a = [digest(lr) for lr, _ in first]
    second = wdsr.make_loader(ds, num_workers=1)
    ds.set_epoch(0)
    b = [digest(lr) for lr, _ in second]
    ds.set_epoch(0)
    assert [digest(lr) for lr, _ in first] == a  # persistent workers of the first loader, its own slots
    assert len(b) == len(second) == 5 and len(a) == len(first) == 4  # each loader's own len()


def test_default_prefetch_holds_one_images_patches(photo_shards):
    """Each worker may run as far ahead as one image's patches (a decode's burst) plus two batches:
    at least 4, at most 16, and at most 64 MiB of handoff slots; explicit values are kept."""

    def loader(k: int, batch: int = 16, patch: int = 32, split: str = "train", **kw) -> wdsr.SRLoader:
        ds = wdsr.SRDataset(str(photo_shards), scale=2, patch_size=patch, patches_per_image=k, batch_size=batch, split=split)
        return wdsr.make_loader(ds, num_workers=2, **kw)

    for k, want in ((120, 10), (16, 4), (40, 5), (1000, 16)):
        got = loader(k)
        assert got.prefetch_factor == want, k
        assert got._pool is not None and got._pool.slots == want + 3  # the slots follow it
    # 512 x 3 x (32^2 + 64^2) bytes = 7.9 MB a batch: 8 of them fit in 64 MiB (the photos' LR is too
    # small for larger patches, which SRDataset now refuses up front)
    assert loader(10240, batch=512, patch=64).prefetch_factor == 8
    assert loader(40960, batch=2048, patch=64).prefetch_factor == 4  # never under the minimum
    assert loader(120, split="val").prefetch_factor == 4
    assert loader(120, prefetch_factor=2).prefetch_factor == 2
    with pytest.raises(ValueError, match="prefetch_factor must be >= 1"):
        loader(120, prefetch_factor=0)


def test_memory_sampling_backs_off_when_reading_proc_is_slow(monkeypatch):
    """A worker's private-memory sample walks every page it maps (tens of ms with a decoded cache
    mapped): it takes at most ``max_share`` of the worker's time, however long one read takes.
    On a clock of our own (the stats module's ``time``): exact counts, whatever the machine's load."""
    from wdsr.pipeline import stats as stats_mod

    clock = FakeClock()
    monkeypatch.setattr(stats_mod, "time", clock)
    reads = []

    def slow_private_kb() -> int:  # what smaps_rollup costs with gigabytes of pairs mapped
        clock.advance(0.05)
        reads.append(1)
        return 1234

    monkeypatch.setattr(stats_mod, "private_kb", slow_private_kb)
    st = stats_mod.SharedStats(slots=2)
    t0 = clock.monotonic()
    while clock.monotonic() - t0 < 0.5:
        st.mark_rss(0, every_s=0.01, max_share=0.05)  # a 50 ms read: the next one >= 1 s later
        clock.advance(0.001)
    assert len(reads) == 1
    assert st.totals()["peak_private_kb_per_worker"] == 1234
    assert st.totals()["peak_rss_kb_per_worker"] > 0
    fast = stats_mod.SharedStats(slots=2)
    monkeypatch.setattr(stats_mod, "private_kb", lambda: reads.append(1) or 99)
    t0 = clock.monotonic()
    while clock.monotonic() - t0 < 0.2:
        fast.mark_rss(1, every_s=0.05)
        clock.advance(0.001)
    assert 3 <= len(reads) - 1 <= 6  # a cheap read: every every_s (4 here: at 0, 50, 100 and 150 ms)
    assert fast.totals()["peak_private_kb_per_worker"] == 99


_EXIT_SCRIPT = """
import os, signal, sys, wdsr
stops = []
signal.signal(signal.SIGTERM, lambda *a: stops.append(1))  # as `wdsr train` does: checkpoint, then exit
ds = wdsr.SRDataset(sys.argv[1], scale=2, patch_size=32, patches_per_image=4, batch_size=4, shuffle_buffer=8)
loader = wdsr.make_loader(ds, num_workers=2)
it = iter(loader)
batch = next(it)
for w in loader._iterator._workers:  # does the worker catch SIGTERM (torch's handler), or die at once?
    mask = next(ln.split()[1] for ln in open(f"/proc/{w.pid}/status") if ln.startswith("SigCgt:"))
    print("SIGTERM caught" if int(mask, 16) >> (signal.SIGTERM - 1) & 1 else "SIGTERM default", flush=True)
if sys.argv[2].startswith("kill-"):
    if sys.argv[2] == "kill-between":  # the worker dies between two passes
        for batch in it:
            pass
    print("workers", *[w.pid for w in loader._iterator._workers], flush=True)
    pid = int(sys.stdin.readline())  # the test has sent SIGTERM to this worker
    # it is dead before the loader is asked again (what a busy machine made of the test's next line):
    # its SIGCHLD reaches this process while it runs its own code, not the loader's
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    print("the worker is dead", flush=True)
    try:
        for batch in it:
            pass
        loader.set_epoch(1)
        for batch in loader:
            pass
    except RuntimeError as e:
        print("stopped:", type(e).__name__, e, flush=True)
        sys.exit(3)
    print("the loader ran on", flush=True)
print("done", flush=True)  # and exit with persistent workers alive, a batch still lent
"""


def test_a_script_exits_cleanly_with_workers_alive_and_a_terminated_worker_dies(photo_shards):
    """Exiting with persistent workers alive ends them without an error (multiprocessing terminates
    them, torch's worker handler exits cleanly); a SIGTERM to a worker from anyone but its trainer
    ends it, though the trainer has a SIGTERM handler of its own that the worker inherited. A worker
    dead before the loader is asked again (mid-pass or between passes) is one ``WorkerDied`` from the
    loop, not a traceback from torch's SIGCHLD handler in the script's own code (seen on a busy machine)."""
    import signal
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT, str(photo_shards), "exit"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("done"), done.stderr
    assert done.stdout.count("SIGTERM caught") == 2, done.stdout  # by torch's worker handler, which exits cleanly
    assert "killed by signal" not in done.stderr and "Traceback" not in done.stderr, done.stderr

    for when in ("kill-mid-pass", "kill-between"):
        proc = subprocess.Popen(
            [sys.executable, "-c", _EXIT_SCRIPT, str(photo_shards), when],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            while (line := proc.stdout.readline().split()) and line[0] == "SIGTERM":
                pass
            assert line and line[0] == "workers", proc.stderr.read()
            os.kill(int(line[1]), signal.SIGTERM)
            proc.stdin.write(f"{line[1]}\n")
            proc.stdin.flush()
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        # one message, from the loop, whichever check noticed the death (never a traceback in the script's own code)
        assert proc.returncode == 3, (when, out, err)
        assert f"stopped: WorkerDied DataLoader worker (pid {line[1]}) died: killed by signal SIGTERM" in out, (when, out, err)
        assert "Traceback" not in err, (when, err)


def test_patches_larger_than_the_images_are_refused_up_front(photo_shards, capsys):
    """The manifest has every HR size: SRDataset counts the samples too small for one patch before
    any read (an error under fail, or when none is left; a warning under skip), and so does
    ``wdsr train --check`` (one line, exit 2)."""
    import json

    from wdsr.tools.cli import main as wdsr_main

    sizes = sorted(
        min(w, h) // 2 for sh in json.loads((photo_shards / "manifest.json").read_text())["shards"] for w, h in sh["hr_sizes"]
    )
    p = 2 * (sizes[len(sizes) // 2] + 1)  # an HR patch that half the samples are too small for at x2
    small = sum(s < p // 2 for s in sizes)
    assert 0 < small < len(sizes)
    with pytest.raises(
        ValueError, match=rf"{small} of {len(sizes)} samples have an LR smaller than the LR patch .*on_error='skip'"
    ):
        wdsr.SRDataset(str(photo_shards), scale=2, patch_size=p, patches_per_image=2, batch_size=2)
    ds = wdsr.SRDataset(str(photo_shards), scale=2, patch_size=p, patches_per_image=2, batch_size=2, on_error="skip")
    assert ds.manifest.samples == len(sizes)  # the rest still trains; the small ones are skipped with stand-ins
    with pytest.raises(ValueError, match=rf"{len(sizes)} of {len(sizes)} samples .*; lower patch_size$"):
        wdsr.SRDataset(str(photo_shards), scale=2, patch_size=2048, on_error="skip")
    rc = wdsr_main(
        ["train", "--data", str(photo_shards), "--out", "/nonexistent/run", "--scale", "2", "--patch-size", "1024", "--check"]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "samples have an LR smaller than the LR patch 512x512" in err, err
