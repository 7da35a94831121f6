"""Memory of the node-wide decoded cache: one copy per node, whatever the ranks and workers.

    .venv/bin/python -m bench.decoded_bench [--seconds 20] [--out bench/out] [--cache /dev/shm/wdsr-decoded-bench]

Two ranks (RANK=0/1 of WORLD_SIZE=2, as torchrun sets them; no collective is needed to stream) of 2
DataLoader workers each stream the 128 4K PNG frames of ``bench.stream_bench`` (k=16, HR patch 192),
first without the cache, then with it warm (filled by one val pass). Every 0.5 s the four workers'
``/proc/PID/smaps_rollup`` is read: Rss, Pss (shared pages divided among the processes that map
them), Shared (pages also mapped elsewhere) and Private; the table gives the mean over the run,
summed over the four workers, next to the cache's size on tmpfs and the decoded size of the data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import REPO, machine_line, md_table, parser, report, shards
from shardmaker import format as fmt
from wdsr.store.decoded import pair_bytes
from wdsr.tools.bench import fill_decoded_cache

RANK_SCRIPT = """
import sys, time, wdsr
url, seconds, cache = sys.argv[1], float(sys.argv[2]), sys.argv[3] or None
ds = wdsr.SRDataset(url, scale=4, patch_size=192, patches_per_image=16, batch_size=16, shuffle_buffer=256,
                    decoded_cache=cache)
loader = wdsr.make_loader(ds, num_workers=2, persistent_workers=True)
t0, n, e = time.perf_counter(), 0, 0
while time.perf_counter() - t0 < seconds:
    loader.set_epoch(e)
    for _ in loader:
        n += 1
        if time.perf_counter() - t0 >= seconds:
            break
    e += 1
print(n * 16 / (time.perf_counter() - t0), ds.stats.totals()["decoded_hits"], flush=True)
"""


def _rollup(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            name, value = line.split(":", 1)
            out[name] = int(value.split()[0])
    except (OSError, ValueError):
        return {}
    return out


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def run(url: str, seconds: float, cache: str | None) -> dict[str, float]:
    env = {**os.environ, "WORLD_SIZE": "2", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT, url, str(seconds), cache or ""],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    samples = []
    time.sleep(3)  # workers started, buffers filling
    while all(p.poll() is None for p in procs):
        workers = [c for p in procs for c in _children(p.pid)]
        rows = [_rollup(w) for w in workers]
        rows = [r for r in rows if r]
        if len(rows) == 4:
            samples.append(
                {
                    k: sum(r.get(k, 0) for r in rows) / 1024
                    for k in ("Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty")
                }
            )
        time.sleep(0.5)
    outs = [p.communicate()[0].split() for p in procs]
    mean = {k: sum(s[k] for s in samples) / max(1, len(samples)) for k in samples[0]} if samples else {}
    mean["patches_per_s"] = sum(float(o[0]) for o in outs)
    mean["hits"] = sum(int(o[1]) for o in outs)
    return mean


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--cache", default="/dev/shm/wdsr-decoded-bench")
    args = ap.parse_args()
    head = machine_line()
    url = shards(Path(args.out), 128)["png"]
    m = fmt.load(url)
    decoded = sum(pair_bytes(wh, 4, 3) for sh in m.shards for wh in sh.hr_sizes)
    plain = run(url, args.seconds, None)
    shutil.rmtree(args.cache, ignore_errors=True)
    n, fill_s = fill_decoded_cache(url, 4, args.cache, None, 2)
    on_tmpfs = sum(p.stat().st_size for p in Path(args.cache).rglob("*.pair"))
    cached = run(url, args.seconds, args.cache)
    shutil.rmtree(args.cache, ignore_errors=True)
    rows = [
        (
            name,
            f"{r['patches_per_s']:.0f}",
            f"{r['Rss']:.0f}",
            f"{r['Pss']:.0f}",
            f"{r['Shared_Clean'] + r['Shared_Dirty']:.0f}",
            f"{r['Private_Clean'] + r['Private_Dirty']:.0f}",
            f"{tmpfs:.0f}",
        )
        for name, r, tmpfs in (("no cache", plain, 0.0), ("decoded cache warm", cached, on_tmpfs / 1e6))
    ]
    lines = [
        f"{head}; 128 4K PNG frames, 2 ranks x 2 workers, k=16, HR patch 192; {args.seconds:.0f} s; "
        "sums over the 4 workers (MB):",
        "",
        md_table(["run", "patches/s (2 ranks)", "Rss", "Pss", "Shared", "Private", "cache on tmpfs"], rows),
        "",
        f"- decoded size of the data: {decoded / 1e6:.0f} MB; the cache holds {n} pairs, {on_tmpfs / 1e6:.0f} MB "
        f"(one copy for the node), filled in {fill_s:.1f} s; cache hits in the warm run: {cached['hits']}",
        f"- decoded cache warm / no cache: **{cached['patches_per_s'] / plain['patches_per_s']:.1f}x**",
    ]
    report(
        Path(args.out),
        "decoded_bench",
        "\n".join(lines),
        {"plain": plain, "cached": cached, "on_tmpfs": on_tmpfs, "decoded": decoded},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
