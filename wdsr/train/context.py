"""Where a training process runs: rank and world (from torchrun's environment, through ``wdsr.env``),
its device, the process group (gloo on CPU, nccl on CUDA) with a gloo group for the per-step sums, and
its intra-op thread count."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import torch
import torch.distributed as dist

from wdsr import env
from wdsr.train.config import Device


@dataclasses.dataclass
class Ctx:
    """Where this process trains: its rank in the world, its device, the group for small collectives."""

    rank: int
    world: int
    device: torch.device
    cpu_group: Any  # a gloo group for the small per-step collectives (no GPU sync for them)

    def all_sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self.cpu_group)
        return t.tolist()


def setup(want: Device) -> Ctx:
    """This process's place in the run: rank, world, device; the process group is made here under torchrun."""
    cuda = want is not Device.CPU and torch.cuda.is_available()
    if want is Device.CUDA and not cuda:
        raise ValueError("--device cuda: no CUDA device is available")
    world = env.current_world()
    device = torch.device("cuda", env.local_rank()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    group = None
    if world.size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=10))
        group = dist.new_group(backend="gloo") if cuda else dist.group.WORLD
    return Ctx(world.rank, world.size, device, group)


def pin_threads(saved: int | None) -> int:
    """Set this run's intra-op thread count explicitly and return it: a resumed run takes its checkpoint's
    (``saved``), a new one this process's count now. Float sums split over another number of threads round
    differently, so a resume with another count (torchrun's OMP_NUM_THREADS=1, a library that set it, a
    node with other cores) would not end with the straight run's weights. Setting it also stops MKL from
    choosing its own thread count per call."""
    n = saved if saved is not None else torch.get_num_threads()
    torch.set_num_threads(n)
    return n
