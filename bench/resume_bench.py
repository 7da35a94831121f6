"""How fast does a resumed loader give its first batch? Side by side in one run.

    .venv/bin/python -m bench.resume_bench [--frames 128] [--repeats 3] [--out bench/out]

On the stream bench's 4K PNG shards (HR patch 192, x4, batch 16, k=16, shuffle buffer 1024,
2 workers): the time from ``make_loader`` to the first batch of

* a fresh epoch (every worker fills its shuffle buffer first),
* a loader given ``load_state_dict`` of a state ``batches`` into the epoch (the buffer is
  recomputed from positions; only images that still owe patches are decoded, when asked for),
* a "replay": a fresh loader iterated past the same ``batches`` (what a pipeline without an
  exact state has to do to reach the same point),

and the images each one decoded (workers' counters) before that first batch.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import wdsr
from bench.common import machine_line, md_table, parser, report, shards

KW = dict(scale=4, patch_size=192, patches_per_image=16, batch_size=16, shuffle_buffer=1024, seed=0)


def first_batch(url: str, state: dict | None = None, skip: int = 0) -> tuple[float, int]:
    ds = wdsr.SRDataset(url, **KW)
    t0 = time.perf_counter()
    loader = wdsr.make_loader(ds, num_workers=2, persistent_workers=False)
    if state is not None:
        loader.load_state_dict(state)
    it = iter(loader)
    for _ in range(skip + 1):
        next(it)
    dt = time.perf_counter() - t0
    samples = ds.stats.totals()["samples"]
    it.close()
    return dt, samples


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    head = machine_line()
    url = shards(Path(args.out), args.frames)["png"]
    os.sync()
    probe = wdsr.make_loader(wdsr.SRDataset(url, **KW), num_workers=2)
    n = len(probe)
    base = probe.state_dict()
    rows: dict[str, list[tuple[float, int]]] = {}
    first_batch(url)  # unmeasured: the first loader of a process runs slow
    for _ in range(args.repeats):
        for at in (n // 4, n // 2, 3 * n // 4):
            rows.setdefault("fresh epoch", []).append(first_batch(url))
            rows.setdefault(f"resume at batch {at} of {n}", []).append(first_batch(url, {**base, "batches": at}))
        rows.setdefault(f"replay to batch {n // 2} of {n}", []).append(first_batch(url, skip=n // 2))
    fresh = statistics.median(t for t, _ in rows["fresh epoch"])
    table = []
    for name, vals in rows.items():
        t = statistics.median(v for v, _ in vals)
        table.append((name, f"{t:.2f} s", f"**{t / fresh:.2f}x**", f"{statistics.median(s for _, s in vals):.0f}"))
    text = (
        f"{head}; {args.frames} 4K PNG frames, HR patch 192, x4, batch 16, k=16, shuffle buffer 1024, 2 workers; "
        f"medians over {args.repeats} rounds (each round: 3 fresh epochs, each resume point, 1 replay):\n\n"
        + md_table(["start", "time to first batch", "/ fresh epoch", "images decoded before it"], table)
    )
    report(Path(args.out), "resume_bench", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
