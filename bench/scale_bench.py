"""Manifest and plan cost at 100k and 1M samples, per process (the issue-11 scale targets), and
(``--index``) the column index at 1M and 10M (issue 27).

    .venv/bin/python -m bench.scale_bench [--samples 100000 1000000] [--out bench/out/scale] [--plain]
    .venv/bin/python -m bench.scale_bench --index [--samples 1000000 10000000]

Writes synthetic but valid manifests (250 samples per shard, DIV2K-like keys and sizes), then, each
in a fresh process: the time to load the manifest and the memory it holds (RSS after minus before,
and the peak), the memory a forked worker makes private by touching the manifest (a gc pass plus reading every
shard's entry), and the time for one DataLoader worker to plan its part of an epoch at 1,024 ranks x
16 workers, with the dataset's own plan code. ``--plain`` loads lists of Python objects instead of
columns (``shardmaker.format.load(..., compact=False)``), for comparison.

``--index``: manifests written by the real writer (``colindex.write_manifest``: ``manifest.json``,
with ``indent=1`` as builds write it, and ``manifest.json.idx``); each in a fresh process, the open
with the index and from the JSON (``index=False``), the private memory it holds (RssAnon after minus
before: the index's mapped pages are page cache, RssFile, shared by every process on the node), the
private memory a forked worker makes by touching it (less the index pages it alone faulted in: page
cache), and a DataLoader with 2 workers (fork, then spawn) each opening it itself: the slowest open
and the most private memory (RssAnon) the open added to a worker.
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
    for line in open("/proc/self/status"):  # (RssAnon: private; RssFile: mapped files, page cache)
        if line.startswith(field):
            return int(line.split()[1]) * 1024
import numpy as np
from shardmaker import format as fmt
from wdsr.pipeline import plan
path, ranks, workers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
before, anon0 = rss(), rss("RssAnon:")
t0 = time.perf_counter()
m = fmt.load(path, compact=sys.argv[4] != "plain", index=sys.argv[4] == "index")
load_s = time.perf_counter() - t0
held, anon = rss() - before, rss("RssAnon:") - anon0
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
    private, mapped, in_index = 0, 0, False  # mapped: index pages only this process faulted in (page cache, not its own)
    for line in open("/proc/self/smaps"):
        if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
            in_index = line.rstrip().endswith(".idx")
        elif line.startswith(("Private_Dirty:", "Private_Clean:")):
            private += int(line.split()[1]) * 1024
            mapped += int(line.split()[1]) * 1024 if in_index else 0
    os.write(w, str(private - mapped).encode())
    os._exit(0)
os.close(w)
child = int(os.read(r, 64))
os.waitpid(pid, 0)
print(json.dumps({"samples": m.samples, "load_s": load_s, "held": held, "peak": peak, "plan_s": plan_s, "first_s": first_s,
                  "child": child, "anon": anon, "indexed": type(m.shards).__name__ == "ShardTable"}))
"""


LOADER_PROBE = r"""
import json, sys
import torch
from bench.scale_bench import WorkerOpens
out = {}
for ctx in ("fork", "spawn"):
    loader = torch.utils.data.DataLoader(WorkerOpens(sys.argv[1]), batch_size=None, num_workers=2, multiprocessing_context=ctx)
    out[ctx] = list(loader)
print(json.dumps(out))
"""


def _status(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0


class WorkerOpens:
    """A map-style dataset of 2 items whose DataLoader worker opens the manifest itself (as a spawned
    worker's dataset copy does) and says how long that took and what private memory it added."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> dict:
        import time

        from shardmaker import format as fmt

        anon = _status("RssAnon:")
        t0 = time.perf_counter()
        m = fmt.load(self.path, compact=True)
        load_s = time.perf_counter() - t0
        for sh in m.shards[:: max(1, len(m.shards) // 1000)]:  # what a reader touches: some shards' entries
            sh.keys[0], sh.offsets[0], sh.hr_sizes[0][0]
        return {"load_s": load_s, "anon": _status("RssAnon:") - anon, "indexed": type(m.shards).__name__ == "ShardTable"}


def write_indexed(path: Path, samples: int) -> None:
    """The synthetic dataset of :func:`write_manifest` through the real writer: manifest + index."""
    import fsspec
    import numpy as np

    from shardmaker.format import manifest as mf
    from shardmaker.format.colindex import write_manifest as write_both

    shards = []
    for s in range(-(-samples // PER_SHARD)):
        n = min(PER_SHARD, samples - s * PER_SHARD)
        offsets = np.arange(n, dtype=np.int64) * 4_800_000 // 512 * 512
        sizes = np.stack([np.full(n, 2040), 1356 + np.arange(n) % 7], axis=1)
        keys = mf.KeyColumn([f"train/{s:04d}/img_{s * PER_SHARD + i:07d}" for i in range(n)])
        digest = hashlib.sha256(str(s).encode()).hexdigest()
        shards.append(mf.ShardInfo(f"shard-{s:06d}.tar", n, int(offsets[-1]) + 4_800_000, digest, keys, offsets, sizes, digest))
    path.mkdir(parents=True, exist_ok=True)
    write_both(fsspec.filesystem("file"), str(path / "manifest.json"), mf.Manifest("png", [2, 4], "matlab", shards, {}))


def _probe(d: Path, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(d), "1024", "16", mode], capture_output=True, text=True, check=True, cwd=REPO
    )
    return json.loads(out.stdout)


def index_table(args) -> str:
    """Open cost with and without the column index, per process and per DataLoader worker."""
    rows = []
    for n in args.samples:
        d = Path(args.out) / f"i{n}"
        if not (d / "manifest.json.idx").exists():
            write_indexed(d, n)
        sizes = f"{(d / 'manifest.json').stat().st_size / 1e6:.0f} / {(d / 'manifest.json.idx').stat().st_size / 1e6:.0f} MB"
        for mode in ("index", "compact"):
            r = _probe(d, mode)
            assert r["indexed"] == (mode == "index"), r
            if mode == "index":
                cmd = [sys.executable, "-c", LOADER_PROBE, str(d)]
                w = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO).stdout)
                assert all(x["indexed"] for c in w.values() for x in c), w
                workers = "; ".join(
                    f"{c}: {max(x['load_s'] for x in w[c]):.2f} s, {max(x['anon'] for x in w[c]) / 1e6:.0f} MB" for c in w
                )
            else:
                workers = "-"
            rows.append(
                (
                    f"{n:,}",
                    sizes,
                    "index" if mode == "index" else "JSON",
                    f"{r['load_s']:.2f} s",
                    f"{r['anon'] / 1e6:.0f} MB",
                    f"{r['held'] / 1e6:.0f} MB",
                    f"{r['child'] / 1e6:.0f} MB",
                    workers,
                )
            )
    head_cols = [
        "samples",
        "manifest.json / .idx",
        "read from",
        "open",
        "private held (RssAnon)",
        "RSS held (with mapped page cache)",
        "private in a forked worker",
        "DataLoader, 2 workers each opening it (slowest open, most private)",
    ]
    return f"{machine_line()}; column index:\n\n" + md_table(head_cols, rows)


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
    ap.add_argument("--index", action="store_true", help="the column index (manifest.json.idx) against the JSON")
    args = ap.parse_args()
    if args.index:
        report(Path(args.out), "scale_bench_index", index_table(args))
        return 0
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
