"""Does the loader keep up with training? `wdsr train` on 4K photo shards, side by side in one run.

    .venv/bin/python -m bench.train_bench [--frames 32] [--out bench/out/train]

For each model (ESPCN, EDSR-baseline), codec and 1 or 2 DataLoader workers: HR patch 192, x4,
batch 16, k=16, shuffle buffer 64, CPU. Reports patches/s consumed by the optimizer and data_wait
(share of step time spent waiting for the next batch) from metrics.jsonl, leaving out the first
log window (worker start, first decodes); each run is its own `wdsr train` process. "loader
alone" is `wdsr bench` on the same shards and workers (no training beside it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.common import machine_line, md_table, parser, report, shards
from wdsr.tools.bench import bench_stream

RUNS = [  # model, codec, workers, steps, log window: EDSR-baseline takes seconds per step on 2 CPU cores
    ("espcn", "png", 1, 150, 30),
    ("espcn", "png", 2, 150, 30),
    ("espcn", "qoi", 2, 150, 30),
    ("edsr-baseline", "png", 1, 16, 4),
    ("edsr-baseline", "png", 2, 16, 4),
]


def run(url: str, model: str, workers: int, steps: int, window: int, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "wdsr",
        "train",
        "--data",
        url,
        "--out",
        str(out),
        "--model",
        model,
        "--patch-size",
        "192",
        "--scale",
        "4",
        "-k",
        "16",
        "--batch-size",
        "16",
        "--shuffle-buffer",
        "64",
        "--workers",
        str(workers),
        "--steps",
        str(steps),
        "--log-every",
        str(window),
        "--val-every",
        "0",
        "--ckpt-every",
        "0",
        "--keep-ckpts",
        "1",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in recs if "loss" in r][1:]  # the first window holds worker start-up
    return {
        "model": model,
        "workers": workers,
        "steps": steps,
        "patches_per_s": sum(r["patches_per_s"] for r in windows) / len(windows),
        "data_wait": sum(r["data_wait"] for r in windows) / len(windows),
    }


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--frames", type=int, default=32)
    ap.add_argument("--out", default="bench/out/train")
    args = ap.parse_args()
    head = machine_line()
    work = Path(args.out)
    urls = shards(work, args.frames)
    os.sync()
    alone = {
        (c, w): bench_stream(
            urls[c], workers=w, patches_per_image=16, batch_size=16, patch_size=192, scale=4, seconds=15, shuffle_buffer=64
        ).patches_per_s
        for c, w in sorted({(c, w) for _, c, w, _, _ in RUNS})
    }
    rows = [
        run(urls[c], model, w, steps, window, work / f"run-{model}-{c}-{w}") | {"codec": c, "loader_alone": alone[c, w]}
        for model, c, w, steps, window in RUNS
    ]
    lines = [
        f"{head}; `wdsr train` on {args.frames} 4K frames, HR patch 192, x4, batch 16, k=16, shuffle buffer 64, "
        "CPU, first log window left out:",
        "",
        md_table(
            ["model", "codec", "workers", "steps", "patches/s consumed", "data_wait", "loader alone, patches/s"],
            [
                (
                    r["model"],
                    r["codec"],
                    r["workers"],
                    r["steps"],
                    f"{r['patches_per_s']:.1f}",
                    f"{r['data_wait']:.1%}",
                    f"{r['loader_alone']:.0f}",
                )
                for r in rows
            ],
        ),
    ]
    report(work, "train_bench", "\n".join(lines), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
