"""How far ahead each worker may run: ``make_loader``'s default against 4 batches in flight.

    .venv/bin/python bench/prefetch_bench.py [--rounds 4] [--seconds 15] [--out bench/out]

On the 128 4K frames of ``stream_bench.py`` (x4, HR patch 192, batch 16, 2 workers), QOI and PNG at
k=120: a worker emits an image's 120 patches (7.5 batches) in one burst after each decode, and the
trainer takes batches from the workers in turn. With 4 batches in flight, a worker whose next
batch is not wanted yet waits while the other decodes. The default (``default_prefetch``: one
image's batches plus two, here 10) and 4 alternate, ``--rounds`` times (which of the two runs
first alternates too), each for ``--seconds``, after an unmeasured warm-up run. The share of the
machine's CPU time that was idle during each run comes from ``/proc/stat``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream_bench import shards  # noqa: E402

from wdsr import SRDataset  # noqa: E402
from wdsr.loader import default_prefetch  # noqa: E402
from wdsr.tools.bench import bench_stream  # noqa: E402

K, BATCH = 120, 16


def _cpu() -> tuple[int, int]:
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return v[3] + v[4], sum(v)  # idle + iowait, all


def run(url: str, prefetch: int | None, seconds: float) -> tuple[float, float]:
    """patches/s, and the idle share of all CPU time while it ran (warm-up included)."""
    a = _cpu()
    r = bench_stream(url, workers=2, batch_size=BATCH, patches_per_image=K, seconds=seconds, prefetch_factor=prefetch)
    b = _cpu()
    return r.patches_per_s, (b[0] - a[0]) / max(1, b[1] - a[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    urls = shards(Path(args.out), args.frames)
    default = default_prefetch(SRDataset(urls["qoi"], scale=4, patch_size=192, patches_per_image=K, batch_size=BATCH))
    lines = [f"{args.frames} 4K frames, x4, HR patch 192, batch {BATCH}, k={K}, 2 workers, {args.seconds:.0f} s per run; "
             f"the default here is {default} batches in flight per worker", "",
             "| codec | round | patches/s, 4 in flight | patches/s, default | default / 4 | CPU idle, 4 | CPU idle, default |",
             "|---|---|---|---|---|---|---|"]
    bench_stream(urls["qoi"], workers=2, patches_per_image=K, seconds=5.0)  # unmeasured: the first loader of a process runs slow
    for codec in ("qoi", "png"):
        ratios = []
        for rnd in range(args.rounds):
            if rnd % 2 == 0:  # the order alternates: neither setting always runs first
                (four, idle4), (dflt, idled) = run(urls[codec], 4, args.seconds), run(urls[codec], None, args.seconds)
            else:
                (dflt, idled), (four, idle4) = run(urls[codec], None, args.seconds), run(urls[codec], 4, args.seconds)
            ratios.append(dflt / four)
            row = f"| {codec.upper()} | {rnd + 1} | {four:.0f} | {dflt:.0f} | **{dflt / four:.2f}x** |"
            lines.append(f"{row} {idle4:.1%} | {idled:.1%} |")
            print(lines[-1], flush=True)
        lines.append(f"| {codec.upper()} | mean | | | **{sum(ratios) / len(ratios):.2f}x** | | |")
    text = "\n".join(lines)
    print(text)
    (Path(args.out) / "prefetch_bench.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
