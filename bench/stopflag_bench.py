"""What the per-step stop vote costs a training step, at 2, 16 and 64 simulated ranks.

    .venv/bin/python -m bench.stopflag_bench [--ranks 2,16,64] [--steps 200] [--step-ms 20]

``wdsr train`` asks every step whether any rank was told to stop (SIGTERM: a preemption), with an
all-reduce of one number on a gloo CPU group. Here each rank is a thread holding its own gloo
process group on 127.0.0.1 (one process, so 64 ranks fit a small machine; gloo's collectives release
the GIL), and a step's compute is ``--step-ms`` of sleep (a GPU step leaves the CPU idle). Two ways:
"blocking" (the vote waited for in the step that cast it) and "overlapped" (cast after step i, read
after step i+1, as the trainer does): the table gives the time a step waits for the vote, median
and 95th percentile, and that as a share of the step.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from bench.common import machine_line, report


def _groups(n: int) -> list[dist.ProcessGroupGloo]:
    store = dist.HashStore()
    groups: list[dist.ProcessGroupGloo | None] = [None] * n

    def make(rank: int) -> None:
        groups[rank] = dist.ProcessGroupGloo(dist.PrefixStore("vote", store), rank, n, datetime.timedelta(seconds=120))

    threads = [threading.Thread(target=make, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [g for g in groups if g is not None]


def _rank(group: dist.ProcessGroupGloo, steps: int, step_s: float, overlapped: bool, out: list[float]) -> None:
    vote = torch.zeros(1, dtype=torch.float64)
    pending = None
    for i in range(steps):
        time.sleep(step_s)  # the step's compute
        t0 = time.perf_counter()
        if overlapped:
            if pending is not None:
                pending.wait()
            pending = group.allreduce([vote])
        else:
            group.allreduce([vote]).wait()
        if i >= 10:  # the first votes set up gloo's pairs
            out.append(time.perf_counter() - t0)
    if pending is not None:
        pending.wait()


def measure(n: int, steps: int, step_s: float, overlapped: bool) -> list[float]:
    groups = _groups(n)
    waits: list[list[float]] = [[] for _ in range(n)]
    threads = [threading.Thread(target=_rank, args=(groups[r], steps, step_s, overlapped, waits[r])) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(w for ws in waits for w in ws)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,16,64")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-ms", type=float, default=20.0, help="a step's compute (a light CNN on one GPU: 20-60 ms)")
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    rows = ["| ranks | vote | wait median | wait p95 | share of a step (median) |", "|---|---|---|---|---|"]
    for n in (int(x) for x in args.ranks.split(",")):
        for overlapped in (False, True):
            w = measure(n, args.steps, args.step_ms / 1e3, overlapped)
            med, p95 = w[len(w) // 2], w[int(len(w) * 0.95)]
            name = "overlapped" if overlapped else "blocking"
            rows.append(f"| {n} | {name} | {med * 1e3:.3f} ms | {p95 * 1e3:.3f} ms | {med / (args.step_ms / 1e3):.2%} |")
            print(rows[-1], flush=True)
    text = "\n".join([f"{machine_line()}; a step = {args.step_ms:g} ms of compute, {args.steps} steps:", "", *rows, ""])
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report(Path(args.out), "stopflag_bench", text)
    sys.stdout.flush()
    os._exit(0)  # gloo groups destroyed at interpreter exit from other threads abort the process


if __name__ == "__main__":
    raise SystemExit(main())
