"""The per-patch path alone: what a patch costs once its pair is decoded (or mapped from the cache).

    .venv/bin/python -m bench.patch_bench [--seconds 15] [--frames 128] [--out bench/out] [--against REV]

On the 128 4K frames of ``bench.stream_bench`` (x4, HR patch 192, batch 16):

1. **Per transform**: each of the 8 dihedral transforms, HR 192 x 192 x 3 uint8, as one patch costs
   it: from a decoded H x W x C frame (the crop copy at cut time, then the permuting write into a
   batch row) and from a planar frame in a tmpfs file mapped private (the decoded cache: the write
   alone), us per HR patch, random positions, 16-row batches.
2. **In one process** (``num_workers=0``, so nothing competes for the core): ``ms/patch`` of the
   pipeline, decoded QOI at k=16 and k=120 (one epoch), and the PNG shards from the decoded cache
   (k=16, the third epoch, when the mapped pages are in place), split into the cut
   (``wdsr.pipeline.stream.cut_patches``) and the write into the batch (``wdsr.pipeline.batch.collate``);
   then the time one read of ``/proc/self/smaps_rollup`` takes with the cache mapped (what a
   worker's private-memory sample costs).
3. **The handoff**: ``wdsr bench``'s ``ms/patch`` and patches/s from the decoded cache with 1 and
   2 workers, and the time the trainer process spends taking each batch out of its slot: lent
   (unpinned, as wdsr does) and, with 2 workers, copied out into new tensors; and the trainer
   process's CPU time over each whole run, as a share of a core.

``--against REV`` instead times part 1 for this tree's ``wdsr/pipeline/augment.py`` and the one at
git revision ``REV`` (``wdsr/augment.py`` before the package was split), side by side: six rounds,
alternating which goes first, medians per transform.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from bench.common import machine_line, md_table, parser, report, shards
from wdsr import SRDataset, make_loader
from wdsr.loader import tune_malloc
from wdsr.pipeline import augment, batch, handoff, stream
from wdsr.pipeline.augment import N_DIHEDRAL
from wdsr.pipeline.stats import private_kb
from wdsr.tools.bench import bench_stream, fill_decoded_cache

H, W, P = 2160, 3840, 192


def per_transform(n: int = 4000, kernels: ModuleType = augment, seed: int = 0) -> dict[str, list[float]]:
    patch_source, chw_shape, write_chw = kernels.patch_source, kernels.chw_shape, kernels.write_chw
    rng = np.random.default_rng(seed)
    hwc = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    path = Path("/dev/shm") / f"wdsr-patch-bench-{os.getpid()}"
    np.ascontiguousarray(hwc.transpose(2, 0, 1)).tofile(path)
    try:
        planar = np.memmap(path, np.uint8, "c", shape=(3, H, W))
        planar.sum()  # every page mapped before timing, as a kept mapping is
        rows = np.empty((4, 16, 3, P, P), np.uint8)
        out: dict[str, list[float]] = {}
        for name, src, chw in (("decoded H x W x C: crop + write", hwc, False), ("decoded cache (planar): write", planar, True)):
            total, count, held = np.zeros(N_DIHEDRAL), np.zeros(N_DIHEDRAL), []
            for i in range(n):
                y, x, t = int(rng.integers(0, H - P)), int(rng.integers(0, W - P)), i % N_DIHEDRAL
                view = src[:, y : y + P, x : x + P] if chw else src[y : y + P, x : x + P]
                t0 = time.perf_counter_ns()
                s = patch_source(view, t, chw)
                t1 = time.perf_counter_ns()
                held.append((s, t))  # written later, as the shuffle buffer holds it
                if len(held) > 256:
                    s, t = held.pop(0)
                    row = rows[(i // 16) % 4, i % 16]
                    assert row.shape == chw_shape(s, t, chw)
                    t2 = time.perf_counter_ns()
                    write_chw(s, t, chw, row)
                    total[t] += t1 - t0 + time.perf_counter_ns() - t2
                    count[t] += 1
            out[name] = list(total / np.maximum(count, 1) / 1e3)
        return out
    finally:
        path.unlink()


def in_process(url: str, k: int, cache: str | None, epochs: int) -> tuple[float, float, float, float, tuple[float, float]]:
    """``ms/patch`` and patches/s of the last epoch, and its us per patch in the cut (``cut_patches``:
    the crops copied out of a decoded frame, views of a cached one) and in the write into the
    batch (``collate``), timed around those two calls of the stream; then ``smaps_cost()`` while
    the dataset (and the pairs it keeps mapped) is still alive."""
    ds = SRDataset(url, scale=4, patch_size=P, patches_per_image=k, decoded_cache=cache)
    loader = make_loader(ds, num_workers=0)
    spent = {"cut": 0, "cut_n": 0, "write": 0, "write_n": 0}
    cut, collate = stream.cut_patches, batch.collate

    def timed_cut(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter_ns()
        got = cut(*a, **kw)
        spent["cut"] += time.perf_counter_ns() - t0
        spent["cut_n"] += len(got[0])
        return got

    def timed_collate(patches: Any, return_keys: bool = False) -> Any:
        t0 = time.perf_counter_ns()
        got = collate(patches, return_keys)
        spent["write"] += time.perf_counter_ns() - t0
        spent["write_n"] += len(patches)
        return got

    ms = rate = float("nan")
    stream.cut_patches, batch.collate = timed_cut, timed_collate  # type: ignore[assignment]
    try:
        for e in range(epochs):
            loader.set_epoch(e)
            spent.update(cut=0, cut_n=0, write=0, write_n=0)
            before, t0, n = ds.stats.totals(), time.perf_counter(), 0
            for _ in loader:
                n += 1
            after = ds.stats.totals()
            ms = (after["patch_ns"] - before["patch_ns"]) / max(1, after["patches"] - before["patches"]) / 1e6
            rate = n * 16 / (time.perf_counter() - t0)
    finally:
        stream.cut_patches, batch.collate = cut, collate  # type: ignore[assignment]
    smaps = smaps_cost()
    del loader, ds
    return ms, spent["cut"] / max(1, spent["cut_n"]) / 1e3, spent["write"] / max(1, spent["write_n"]) / 1e3, rate, smaps


def smaps_cost() -> tuple[float, float]:
    """(GB of tmpfs pages this process maps, ms to read /proc/self/smaps_rollup: median of 3), the
    read a worker's private-memory sample makes (``wdsr.pipeline.stats.private_kb``)."""
    shmem_kb = next(int(ln.split()[1]) for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("RssShmem:"))
    took = []
    for _ in range(3):
        t0 = time.perf_counter()
        private_kb()
        took.append((time.perf_counter() - t0) * 1e3)
    return shmem_kb / 1e6, float(np.median(took))


def handoff_runs(url: str, cache: str, seconds: float) -> list[tuple[str, float, float, float, float]]:
    """``wdsr bench`` from the cache with 1 and 2 workers, the trainer taking lent batches, and
    with 2 workers the trainer copying each batch out of its slot as it did before (a copy into
    new tensors, the slot freed at once), timing the trainer's take."""
    spent = [0, 0]
    take = handoff.BatchPool.take

    def lent(self: handoff.BatchPool, ref: handoff.SlotRef, pin: bool) -> tuple:
        t0 = time.perf_counter_ns()
        out = take(self, ref, pin)
        spent[0] += time.perf_counter_ns() - t0
        spent[1] += 1
        return out

    def copied(self: handoff.BatchPool, ref: handoff.SlotRef, pin: bool) -> tuple:
        t0 = time.perf_counter_ns()
        out = tuple(t.clone() for t in take(self, ref, pin))  # the lent tensors go at once: the slot is free
        spent[0] += time.perf_counter_ns() - t0
        spent[1] += 1
        return out

    rows = []
    try:
        runs = (("1 worker, lent", 1, lent), ("2 workers, lent", 2, lent), ("2 workers, copied out", 2, copied))
        for name, workers, how in runs:
            handoff.BatchPool.take = how  # type: ignore[method-assign]
            spent[:] = [0, 0]
            u0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            r = bench_stream(url, workers=workers, patches_per_image=16, decoded_cache=cache, seconds=seconds)
            u1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            cpu = (u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime) / (w1 - w0)
            rows.append((name, r.patches_per_s, r.patch_ms, spent[0] / max(1, spent[1]) / 1e6, cpu))
        return rows
    finally:
        handoff.BatchPool.take = take  # type: ignore[method-assign]


def against(rev: str, rounds: int = 6) -> list[str]:
    """Part 1 for this tree's augment.py and the one at ``rev``, alternating, medians per transform."""
    for path in ("wdsr/pipeline/augment.py", "wdsr/augment.py"):  # its home since dd81ea3, and before
        got = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True)
        if got.returncode == 0:
            break
    got.check_returncode()
    old_src = got.stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(old_src)
    try:
        spec = importlib.util.spec_from_file_location("augment_at_rev", f.name)
        assert spec is not None and spec.loader is not None
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    finally:
        os.unlink(f.name)
    got: dict[tuple[str, str], list[list[float]]] = {}
    for r in range(rounds):
        pair = [("this tree", augment), (rev, old)]
        for label, mod in pair if r % 2 == 0 else pair[::-1]:
            for name, us in per_transform(kernels=mod, seed=r).items():
                got.setdefault((name, label), []).append(us)
    lines = [f"us per HR patch (uint8 RGB) by transform, median of {rounds} alternating rounds:", ""]
    lines.append("| source | code | " + " | ".join(f"t={t}" for t in range(N_DIHEDRAL)) + " | mean | round means |")
    lines.append("|---" * (N_DIHEDRAL + 4) + "|")
    for (name, label), runs in got.items():
        med = np.median(np.array(runs), axis=0)
        rm = " / ".join(f"{np.mean(u):.1f}" for u in runs)
        lines.append(f"| {name} | {label} | " + " | ".join(f"{u:.1f}" for u in med) + f" | **{med.mean():.1f}** | {rm} |")
    return lines


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--decoded-cache", default="/dev/shm/wdsr-patch-bench")
    ap.add_argument("--against", metavar="REV", help="time part 1 against wdsr's augment module at git revision REV")
    args = ap.parse_args()
    torch.set_num_threads(1)
    tune_malloc()  # as in a DataLoader worker
    if args.against:
        print("\n".join(against(args.against)))
        return 0
    head = machine_line()
    ours = shards(Path(args.out), args.frames)
    lines = [f"{head}; {args.frames} 4K frames, x4, HR patch {P}, batch 16.", "", "us per HR patch (uint8 RGB) by transform:", ""]
    lines.append(
        md_table(
            ["source", *(f"t={t}" for t in range(N_DIHEDRAL)), "mean"],
            ([name, *(f"{u:.1f}" for u in us), f"**{np.mean(us):.1f}**"] for name, us in per_transform().items()),
        )
    )
    shutil.rmtree(args.decoded_cache, ignore_errors=True)
    try:
        fill_decoded_cache(ours["png"], 4, args.decoded_cache, None, 2)
        rows = []
        for name, url, k, cache, epochs in (
            ("decoded QOI, k=16", ours["qoi"], 16, None, 1),
            ("decoded QOI, k=120", ours["qoi"], 120, None, 1),
            ("decoded cache (PNG shards), k=16, 3rd epoch", ours["png"], 16, args.decoded_cache, 3),
        ):
            ms, cut_us, write_us, rate, (gb, smaps_ms) = in_process(url, k, cache, epochs)
            rows.append((name, f"**{ms:.3f}**", f"{cut_us:.1f}", f"{write_us:.1f}", f"{rate:.0f}"))
        lines += [
            "",
            "In one process (`num_workers=0`), HR + LR, cut and write into the batch:",
            "",
            md_table(["run", "ms/patch", "cut, us", "write, us", "patches/s"], rows),
            "",
            f"Reading `/proc/self/smaps_rollup` in that process, {gb:.2f} GB of cached pairs mapped: {smaps_ms:.1f} ms",
        ]
        rows = [
            (name, f"{rate:.0f}", f"**{ms:.3f}**", f"{take_ms:.3f}", f"{cpu * 100:.0f}%")
            for name, rate, ms, take_ms, cpu in handoff_runs(ours["png"], args.decoded_cache, args.seconds)
        ]
        lines += [
            "",
            f"`wdsr bench` from the decoded cache, k=16, {args.seconds:.0f} s; the trainer's time to take a batch, "
            "and the trainer process's CPU over the whole run:",
            "",
            md_table(["run", "patches/s", "ms/patch", "take a batch, ms", "trainer CPU, of a core"], rows),
        ]
    finally:
        shutil.rmtree(args.decoded_cache, ignore_errors=True)
    report(Path(args.out), "patch_bench", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
