"""How far ahead each worker may run: ``make_loader``'s default against 4 batches in flight.

    .venv/bin/python -m bench.prefetch_bench [--frames 128] [--rounds 4] [--seconds 15] [--out bench/out]

On the 128 4K frames of ``bench.stream_bench`` (x4, HR patch 192, batch 16, 2 workers), QOI and PNG at
k=120: a worker emits an image's 120 patches (7.5 batches) in one burst after each decode, and the
trainer takes batches from the workers in turn. With 4 batches in flight, a worker whose next
batch is not wanted yet waits while the other decodes. The default (``default_prefetch``: one
image's batches plus two, here 10) and 4 alternate, ``--rounds`` times (which of the two runs
first alternates too), each for ``--seconds``, after an unmeasured warm-up run. The share of the
machine's CPU time that was idle during each run comes from ``/proc/stat``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.common import cpu_idle_total as _cpu
from bench.common import machine_line, md_table, parser, report, shards
from wdsr import SRDataset
from wdsr.loader import default_prefetch
from wdsr.tools.bench import bench_stream

K, BATCH = 120, 16


def run(url: str, prefetch: int | None, seconds: float) -> tuple[float, float]:
    """patches/s, and the idle share of all CPU time while it ran (warm-up included)."""
    a = _cpu()
    r = bench_stream(url, workers=2, batch_size=BATCH, patches_per_image=K, seconds=seconds, prefetch_factor=prefetch)
    b = _cpu()
    return r.patches_per_s, (b[0] - a[0]) / max(1, b[1] - a[1])


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    head = machine_line()
    urls = shards(Path(args.out), args.frames)
    default = default_prefetch(SRDataset(urls["qoi"], scale=4, patch_size=192, patches_per_image=K, batch_size=BATCH))
    rows = []
    bench_stream(urls["qoi"], workers=2, patches_per_image=K, seconds=5.0)  # unmeasured: the first loader of a process runs slow
    for codec in ("qoi", "png"):
        ratios = []
        for rnd in range(args.rounds):
            if rnd % 2 == 0:  # the order alternates: neither setting always runs first
                (four, idle4), (dflt, idled) = run(urls[codec], 4, args.seconds), run(urls[codec], None, args.seconds)
            else:
                (dflt, idled), (four, idle4) = run(urls[codec], None, args.seconds), run(urls[codec], 4, args.seconds)
            ratios.append(dflt / four)
            rows.append(
                (codec.upper(), rnd + 1, f"{four:.0f}", f"{dflt:.0f}", f"**{dflt / four:.2f}x**", f"{idle4:.1%}", f"{idled:.1%}")
            )
            print(rows[-1], flush=True)
        rows.append((codec.upper(), "mean", "", "", f"**{sum(ratios) / len(ratios):.2f}x**", "", ""))
    cols = ["codec", "round", "patches/s, 4 in flight", "patches/s, default", "default / 4", "CPU idle, 4", "CPU idle, default"]
    text = (
        f"{head}; {args.frames} 4K frames, x4, HR patch 192, batch {BATCH}, k={K}, 2 workers, {args.seconds:.0f} s per run; "
        f"the default here is {default} batches in flight per worker:\n\n" + md_table(cols, rows)
    )
    report(Path(args.out), "prefetch_bench", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
