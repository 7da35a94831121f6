"""Run under torchrun: the per-step vote of `wdsr train` over real gloo ranks, each with a clock of its own.

Rank 0's clock says a step lasts a minute; any other rank's clock fails if read (only rank 0's decides).
Rank 1 is told to stop from step 6 on; then, in a second run, rank 0 is told at step 1. Each rank writes
what it read at each step to OUT/vote-RANK.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from wdsr.train.config import Device
from wdsr.train.context import setup
from wdsr.train.vote import Vote


def never() -> float:
    raise AssertionError("only rank 0's clock decides")


def run(vote: Vote, told_from: int, who: int, rank: int, at: list[int]) -> list[dict]:
    seen = []
    for step in range(1, 12):
        at[0] = step
        v = vote.read()
        seen.append({"step": step, "told": list(v.told), "due": v.checkpoint_due, "writer": v.writer})
        if v.checkpoint_due:
            vote.checkpointed()
        if v.stop:
            break
        vote.cast(rank == who and step >= told_from)
    vote.drain()
    return seen


def main() -> int:
    out = Path(sys.argv[1])
    ctx = setup(Device.CPU)
    at = [0]
    clock = (lambda: 60.0 * at[0]) if ctx.rank == 0 else never
    first = run(Vote(ctx, 3, clock), 6, 1, ctx.rank, at)
    second = run(Vote(ctx, None, clock), 1, 0, ctx.rank, at)
    (out / f"vote-{ctx.rank}.json").write_text(json.dumps({"first": first, "second": second}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
