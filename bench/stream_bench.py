"""Benchmark the wdsr pipeline on 4K photo shards against the naive Dataset, side by side in one run.

    .venv/bin/python -m bench.stream_bench [--frames 128] [--seconds 20] [--out bench/out]

HR patch 192, x4, batch 16, k=16: PNG with 1 and 2 workers, QOI with 2 workers (each also with
verify=none), and the naive decode-per-patch Dataset (``wdsr bench --compare-naive``) on the same
PNG shards, with Pillow and with wdsr's decoders. "of ceiling" is patches/s over workers x 1000 /
(decode_ms / k + ms/patch), from the decode and per-patch times the run itself measured.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.common import loader_table, machine_line, parser, report, shards
from wdsr.tools.bench import bench_naive, bench_stream


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument(
        "--frames",
        type=int,
        default=128,
        help="more frames: longer epochs, the epoch-boundary bubble (buffer fill, drain) amortised as in real data",
    )
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    head = machine_line()
    work = Path(args.out)
    urls = shards(work, args.frames)
    # Flush the shards just written: kernel writeback of a few GB of dirty pages would otherwise
    # run during the first measurements and take CPU from the workers.
    os.sync()
    kw = dict(batch_size=16, patch_size=192, scale=4, seconds=args.seconds)
    warm = {**kw, "seconds": 5.0}
    bench_stream(urls["png"], workers=2, patches_per_image=16, **warm)  # unmeasured: the first loader of a process runs slow
    res = [
        bench_stream(urls["png"], workers=1, patches_per_image=16, name="wdsr PNG, 1 worker", **kw),
        bench_stream(urls["png"], workers=2, patches_per_image=16, name="wdsr PNG, 2 workers", **kw),
        bench_stream(urls["png"], workers=2, patches_per_image=16, verify="none", name="wdsr PNG, 2 workers, verify=none", **kw),
    ]
    # unmeasured: the first pass over another 2.5 GB dataset runs a few points slow (page cache state)
    bench_stream(urls["qoi"], workers=2, patches_per_image=16, **warm)
    res += [
        bench_stream(urls["qoi"], workers=2, patches_per_image=16, name="wdsr QOI, 2 workers", **kw),
        bench_stream(urls["qoi"], workers=2, patches_per_image=16, verify="none", name="wdsr QOI, 2 workers, verify=none", **kw),
        bench_naive(urls["png"], workers=2, decoder="pillow", **kw),
        bench_naive(urls["png"], workers=2, decoder="same", **kw),
    ]
    by = {r.name: r.patches_per_s for r in res}
    png1, png2, qoi2 = by["wdsr PNG, 1 worker"], by["wdsr PNG, 2 workers"], by["wdsr QOI, 2 workers"]
    lines = [
        f"{head}; {args.frames} 4K frames, HR patch 192, x4, batch 16, k=16; {args.seconds:.0f} s per loader after warm-up:",
        "",
        loader_table(res, ("patches/s", "decode ms", "verify ms", "ms/patch", "of ceiling", "private")),
        "",
        f"- k=16 patches per decode / naive, 2 workers each: **{png2 / by['naive decode-per-patch (Pillow)']:.1f}x** "
        f"(naive with Pillow), **{png2 / by['naive decode-per-patch (same decoders)']:.1f}x** (naive with wdsr's decoders)",
        f"- QOI / PNG, 2 workers: **{qoi2 / png2:.2f}x** (verify=xxh3_64, the default), "
        f"{by['wdsr QOI, 2 workers, verify=none'] / by['wdsr PNG, 2 workers, verify=none']:.2f}x (verify=none)",
        f"- 2 workers / 1 worker, PNG: **{png2 / png1:.2f}x**",
    ]
    report(work, "stream_bench", "\n".join(lines), [r.__dict__ | {"efficiency": r.efficiency} for r in res])
    return 0


if __name__ == "__main__":
    sys.exit(main())
