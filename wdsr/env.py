"""Where this process stands: rank and world size, DataLoader worker. The one place that reads them."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class World:
    """Rank/world of the training process (from torchrun or Kubernetes)."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is not in a world of size {self.size}")


def current_world(environ: Mapping[str, str] | None = None) -> World:
    """An initialised ``torch.distributed`` wins; else ``RANK``/``WORLD_SIZE``; else a world of one."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return World(dist.get_rank(), dist.get_world_size())
    except ImportError:  # pragma: no cover
        pass
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" in env or "RANK" in env:
        try:
            rank, size = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
        except ValueError:
            raise ValueError(f"RANK={env.get('RANK')!r} / WORLD_SIZE={env.get('WORLD_SIZE')!r} are not integers") from None
        return World(rank, size)
    return World()


def current_worker() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the DataLoader worker we run in; ``(0, 1)`` outside one."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def in_worker() -> bool:
    """Whether we run in a DataLoader worker process (batches then go through the handoff slots)."""
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's index on its node (``LOCAL_RANK`` from torchrun; 0 outside it): picks its GPU."""
    env = os.environ if environ is None else environ
    try:
        return int(env.get("LOCAL_RANK", "0"))
    except ValueError:
        raise ValueError(f"LOCAL_RANK={env.get('LOCAL_RANK')!r} is not an integer") from None
