"""The per-step vote of ``wdsr train``: which ranks were told to stop (SIGTERM: a preemption), and whether
rank 0's clock says a time-based checkpoint (``--ckpt-minutes``) is due.

The vote after step i is cast without waiting (an all-reduce with ``async_op=True`` on the gloo CPU
group) and read after step i+1, so its cost hides behind a step (``bench.stopflag_bench``): every
rank reads the same answer at the same step, one step after the question was asked. Rank 0's clock
alone decides the time, so every rank checkpoints at the same step whatever its own clock says.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from wdsr.train.context import Ctx

CLOCK: Callable[[], float] = time.monotonic  # seconds; tests replace it (read once per vote, on rank 0 only)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the ranks answered, as every rank reads it."""

    told: tuple[int, ...] = ()  # the ranks told to stop (SIGTERM), ascending
    checkpoint_due: bool = False  # rank 0's clock: --ckpt-minutes have passed since the last checkpoint
    world: int = 1

    def __post_init__(self) -> None:
        if self.world < 1 or list(self.told) != sorted(set(self.told)) or any(not 0 <= r < self.world for r in self.told):
            raise ValueError(f"told must be distinct ranks below {self.world}, ascending: {self.told}")

    @property
    def stop(self) -> bool:
        return bool(self.told)

    @property
    def writer(self) -> int:
        """The rank that writes a checkpoint now: the lowest one not told to stop (its node is not going
        away; the weights and the data position are the same on every rank), or 0 if every rank was told."""
        return next((r for r in range(self.world) if r not in self.told), 0)


class Vote:
    """Cast after a step with :meth:`cast`, read after the next with :meth:`read`; :meth:`drain` on every
    way out (the cast one is waited for, so no collective is left in flight)."""

    def __init__(self, ctx: Ctx, ckpt_minutes: float | None, clock: Callable[[], float] | None = None) -> None:
        self.ctx = ctx
        self.every_s = ckpt_minutes * 60.0 if ckpt_minutes else None
        self.clock = clock or CLOCK
        self.since: float | None = None  # rank 0: when the time-based interval started (None: at the next vote)
        self._pending: tuple[torch.Tensor, Any] | None = None

    def cast(self, stop_requested: bool) -> None:
        """This rank's answer (one slot per rank, then rank 0's checkpoint clock), sent without waiting."""
        assert self._pending is None, "a vote is already in flight"
        world = self.ctx.world
        ballot = torch.zeros(world + 1, dtype=torch.int64)
        ballot[self.ctx.rank] = int(stop_requested)
        if self.ctx.rank == 0 and self.every_s is not None:
            now = self.clock()
            if self.since is None:
                self.since = now
            ballot[world] = int(now - self.since >= self.every_s)
        work = dist.all_reduce(ballot, group=self.ctx.cpu_group, async_op=True) if world > 1 else None
        self._pending = (ballot, work)

    def read(self) -> Verdict:
        """The answer to the vote cast after the previous step (none cast: nothing to do)."""
        if self._pending is None:
            return Verdict(world=self.ctx.world)
        ballot, work = self._pending
        self._pending = None
        if work is not None:
            work.wait()
        world = self.ctx.world
        told = tuple(r for r in range(world) if int(ballot[r]) > 0)
        return Verdict(told, int(ballot[world]) > 0, world)

    def checkpointed(self) -> None:
        """A checkpoint was written: the next time-based one is ``--ckpt-minutes`` after the next vote."""
        self.since = None

    def drain(self) -> None:
        """Wait for a vote still in flight (every rank cast it) and forget its answer."""
        if self._pending is not None:
            work = self._pending[1]
            self._pending = None
            if work is not None:
                work.wait()
