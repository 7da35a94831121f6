"""Manifest and plan cost at 100k and 1M samples, per process (the issue-11 scale targets).

    .venv/bin/python -m bench.scale_bench [--samples 100000 1000000] [--out bench/out/scale] [--plain]

Writes synthetic but valid manifests (250 samples per shard, DIV2K-like keys and sizes), then, each
in a fresh process: the time to load the manifest and the memory it holds (RSS after minus before,
and the peak), the memory a forked worker makes private by touching the manifest (a gc pass plus reading every
shard's entry), and the time for one DataLoader worker to plan its part of an epoch at 1,024 ranks x
16 workers, with the dataset's own plan code. ``--plain`` loads lists of Python objects instead of
columns (``shardmaker.format.load(..., compact=False)``), for comparison.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from bench.common import REPO, machine_line, md_table, parser, report

PER_SHARD = 250

PROBE = r"""
import json, sys, time
def rss(field="VmRSS:"):  # VmHWM for the peak: ru_maxrss would keep the forking parent's across exec
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
import numpy as np
from shardmaker import format as fmt
from wdsr.pipeline import plan
path, ranks, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
before = rss()
t0 = time.perf_counter()
m = fmt.load(path, compact=sys.argv[4] == "compact")
load_s = time.perf_counter() - t0
held = rss() - before
peak = rss("VmHWM:") - before
sizes = [s.samples for s in m.shards]
t0 = time.perf_counter()
plan.slot_plan(sizes, 0, 3, ranks, workers, ranks * workers // 2 + 7)
first_s = time.perf_counter() - t0  # includes numpy's one-time set-up in a process
t0 = time.perf_counter()
plan.slot_plan(sizes, 0, 4, ranks, workers, ranks * workers // 2 + 7)
plan_s = time.perf_counter() - t0  # what each later epoch costs
# a forked DataLoader worker: what it makes private by touching the manifest (a gc pass writes the
# header of every tracked object; reading a shard's keys and offsets is what the reader does)
import gc, os
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    gc.collect()
    for sh in m.shards:
        sh.keys[0], sh.offsets[0], sh.hr_sizes[0][0]
    private = 0
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith(("Private_Dirty:", "Private_Clean:")):
            private += int(line.split()[1]) * 1024
    os.write(w, str(private).encode())
    os._exit(0)
os.close(w)
child = int(os.read(r, 64))
os.waitpid(pid, 0)
print(json.dumps({"samples": m.samples, "load_s": load_s, "held": held, "peak": peak, "plan_s": plan_s, "first_s": first_s,
                  "child": child}))
"""


def write_manifest(path: Path, samples: int) -> None:
    shards = []
    for s in range(-(-samples // PER_SHARD)):
        n = min(PER_SHARD, samples - s * PER_SHARD)
        offsets = [i * 4_800_000 // 512 * 512 for i in range(n)]
        shards.append(
            {
                "name": f"shard-{s:06d}.tar",
                "samples": n,
                "bytes": offsets[-1] + 4_800_000,
                "sha256": hashlib.sha256(str(s).encode()).hexdigest(),
                "keys": [f"train/{s:04d}/img_{s * PER_SHARD + i:07d}" for i in range(n)],
                "offsets": offsets,
                "hr_sizes": [[2040, 1356 + (i % 7)] for i in range(n)],
            }
        )
    doc = {
        "format": "wdsr-shards/1",
        "codec": "png",
        "scales": [2, 4],
        "lr_method": "matlab",
        "samples": samples,
        "bytes": sum(s["bytes"] for s in shards),
        "build": {},
        "shards": shards,
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps(doc, separators=(",", ":")))


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--samples", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--out", default="bench/out/scale")
    ap.add_argument("--plain", action="store_true", help="lists of Python objects (no columns), for comparison")
    args = ap.parse_args()
    head = machine_line()
    rows = []
    for n in args.samples:
        d = Path(args.out) / f"m{n}"
        if not (d / "manifest.json").exists():
            write_manifest(d, n)
        out = subprocess.run(
            [sys.executable, "-c", PROBE, str(d), "1024", "16", "plain" if args.plain else "compact"],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        r = json.loads(out.stdout)
        size = (d / "manifest.json").stat().st_size
        rows.append(
            (
                f"{n:,}",
                f"{size / 1e6:.0f} MB",
                f"{r['load_s']:.2f} s",
                f"{r['held'] / 1e6:.0f} MB",
                f"{r['peak'] / 1e6:.0f} MB",
                f"{r['child'] / 1e6:.0f} MB",
                f"{r['plan_s'] * 1000:.1f} ms ({r['first_s'] * 1000:.0f} ms)",
            )
        )
    head_cols = [
        "samples",
        "manifest.json",
        "load",
        "held after load",
        "peak during load",
        "private in a forked worker",
        "plan per epoch (first in a process)",
    ]
    text = f"{head}; {'lists' if args.plain else 'columns'}:\n\n" + md_table(head_cols, rows)
    report(Path(args.out), "scale_bench_plain" if args.plain else "scale_bench", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
