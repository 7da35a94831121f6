"""``make_loader``: the DataLoader around an SRDataset, with exact ``len()`` and epoch handling."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from wdsr.dataset import Split, SRDataset
from wdsr.errors import SampleError
from wdsr.handoff import BatchPool, is_slot

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_malloc() -> bool:
    """Keep large decode buffers in the heap instead of mmap/munmap per image (glibc only).

    Each 4K decode allocates 25-60 MB; glibc maps and unmaps such blocks every time and the
    page faults cost +25% decode time on PNG. Returns whether the settings took.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1
        return bool(libc.mallopt(_M_TRIM_THRESHOLD, 512 * 1024 * 1024) == 1 and ok)
    except (OSError, AttributeError):
        return False


def _worker_init(_worker_id: int) -> None:
    # a trainer's SIGTERM handler (checkpoint, then exit) must not keep a worker alive when the
    # DataLoader terminates it: workers die on SIGTERM as usual
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    torch.set_num_threads(1)
    tune_malloc()


class SRLoader(DataLoader):
    """A DataLoader whose ``len()`` is the exact number of batches per rank per epoch.

    A new pass without ``dataset.set_epoch(e)`` in between moves to the next epoch, the same
    way on every rank.
    """

    dataset: SRDataset

    def __init__(self, dataset: SRDataset, pin_batches: bool = False, **kwargs: Any) -> None:
        super().__init__(dataset, batch_size=None, **kwargs)
        self._passes = 0
        self._pin = pin_batches
        self._pool = dataset.handoff  # this loader's slots, even if the dataset gets another loader later

    def __len__(self) -> int:
        return self.dataset.length(self.num_workers)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator over the inner iterator
        ds = self.dataset
        if self._passes and not ds.epoch_set:
            ds._epoch += 1
        ds.epoch_set = False
        self._passes += 1
        ds.handoff = self._pool  # workers started now write into this loader's slots
        return _batches(super().__iter__(), self._pool, self._pin, self.persistent_workers)


def _batches(inner: Any, pool: BatchPool | None, pin: bool, persistent: bool) -> Iterator[Any]:
    """Batches from the DataLoader, copied out of their pool slots; workers that are not
    persistent are shut down as soon as the pass ends or fails, not whenever garbage collection
    gets to the iterator (which stalled exits by seconds)."""
    try:
        for item in inner:
            yield pool.take(item, pin) if pool is not None and is_slot(item) else item
    finally:
        if not persistent and hasattr(inner, "_shutdown_workers"):
            inner._shutdown_workers()


def make_loader(
    dataset: SRDataset,
    num_workers: int = 4,
    pin_memory: bool | None = None,
    prefetch_factor: int = 4,
    persistent_workers: bool = True,
    shared_slots: bool = True,
    **kwargs: Any,
) -> SRLoader:
    """Batches come ready-made from the workers (``batch_size=None``); keep them uint8 until on the device.

    ``shared_slots`` (default): workers hand batches over through recycled shared-memory slots;
    False: torch's own path (a new shared-memory segment per batch), for comparison.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    dataset.num_workers = num_workers
    dataset.check_batches(num_workers)
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    extra: dict[str, Any] = {}
    dataset.handoff = None
    if num_workers > 0:
        extra = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers, "worker_init_fn": _worker_init}
        if dataset.opts.split is Split.TRAIN and shared_slots:
            # slots: the batches a worker may have in flight, plus the one being copied out
            dataset.handoff = BatchPool(num_workers, prefetch_factor + 2, _batch_bytes(dataset))
    if dataset.handoff is not None:  # the copy out of the slot goes straight into pinned memory
        return SRLoader(dataset, pin_batches=pin_memory, num_workers=num_workers, pin_memory=False, **extra, **kwargs)
    return SRLoader(dataset, num_workers=num_workers, pin_memory=pin_memory, **extra, **kwargs)


def sample_meta(ds: SRDataset) -> dict[str, Any]:
    """``{key}.json`` of the first readable sample (channels, bit depth); the largest batch's
    values (3 channels, 16 bit) if none of the first shards can be read here."""
    import json

    from wdsr.plan import Span

    for i in range(min(8, len(ds.manifest.shards))):
        try:
            raw = next(ds.reader.span(Span(i, 0, 1), frozenset({"json"}), fill_cache=False), None)
            if raw is not None and "json" in raw.members:
                meta = json.loads(bytes(raw.members["json"]))
                if isinstance(meta, dict) and meta.get("channels") in (1, 3) and meta.get("bit_depth") in (8, 16):
                    return {"channels": meta["channels"], "bit_depth": meta["bit_depth"]}
        except (SampleError, ValueError, RecursionError):
            continue  # a broken shard or sample: the workers will report it
        finally:
            ds.stats.add(0, **ds.reader.take_counts())  # retries made here count too
    return {"channels": 3, "bit_depth": 16}


def _batch_bytes(ds: SRDataset) -> int:
    """Bytes of one batch, from the first sample's channels and bit depth."""
    meta = sample_meta(ds)
    o = ds.opts
    per_pixel = int(meta.get("channels", 3)) * (2 if int(meta.get("bit_depth", 8)) == 16 else 1)
    p = o.patch_size // o.scale
    return o.batch_size * per_pixel * (p * p + o.patch_size * o.patch_size)


def to_float(x: torch.Tensor) -> torch.Tensor:
    """uint8/uint16 batch -> float32 in [0, 1]; call it on the device (after ``.to(device)``)."""
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)
    if x.dtype == torch.uint16:
        return x.to(torch.int32).float().div_(65535.0)
    if x.is_floating_point():
        return x.float()
    raise TypeError(f"to_float expects a uint8/uint16 tensor, got {x.dtype}")
