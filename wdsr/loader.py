"""``make_loader``: the DataLoader around an SRDataset, with exact ``len()`` and epoch handling."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from shardmaker import deprecation
from shardmaker import format as fmt
from wdsr import env, state
from wdsr.dataset import Split, SRDataset
from wdsr.errors import SampleError
from wdsr.pipeline.degraded import as_batch
from wdsr.pipeline.handoff import BatchPool, is_slot
from wdsr.pipeline.plan import Span
from wdsr.pipeline.worker import tune_malloc, worker_init
from wdsr.pipeline.workers import WorkerDied, check, detach, ended, watched
from wdsr.state import LoaderStateError, WorldChanged

__all__ = [
    "LoaderStateError",
    "SRLoader",
    "WorkerDied",
    "WorldChanged",
    "default_prefetch",
    "make_loader",
    "sample_meta",
    "to_float",
    "tune_malloc",
]
log = logging.getLogger("wdsr")


class _Pass(IterableDataset):
    """What the DataLoader (and its workers) iterate: the dataset, plus this loader's slot pool and
    a shared ``[epoch, batches already handed out]`` that each pass reads when it starts."""

    def __init__(self, ds: SRDataset, control: torch.Tensor, pool: BatchPool | None) -> None:
        self.ds, self.control, self.pool = ds, control, pool

    def __iter__(self) -> Iterator[Any]:
        worker, nw = env.current_worker()
        epoch, start, old_world, old_workers, old_batches = (int(v) for v in self.control)
        origin = (old_world, old_workers, old_batches) if old_world else None
        if self.ds.config.split is Split.VAL:
            return self.ds.stream(worker, nw, epoch)
        # The DataLoader takes batches from its workers in turn, starting with worker 0 on every
        # pass: batch b of an epoch comes from worker b % nw. A pass that starts after ``start``
        # batches lets worker w play worker (w + start) % nw, which has handed out
        # ceil((start - that) / nw) batches already.
        as_worker = (worker + start) % nw
        done = (start - as_worker + nw - 1) // nw
        return self.ds.stream(worker, nw, epoch, done, self.pool, as_worker, origin)

    def __getattr__(self, name: str) -> Any:  # loader.dataset.stats and the like still work
        if name in ("ds", "control", "pool") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.ds, name)


def _end_workers(inner: Any) -> None:
    inner._shutdown_workers()  # a no-op where they have ended already


class SRLoader(DataLoader):
    """A DataLoader whose ``len()`` is the exact number of batches per rank per epoch, and which
    owns the epoch counter and the position in the epoch.

    A new pass moves to the next epoch unless ``loader.set_epoch(e)`` or ``dataset.set_epoch(e)``
    asked for one, the same way on every rank. ``state_dict()`` says how far the trainer got
    (batches handed out, not those prefetched); ``load_state_dict()`` on a fresh loader makes its
    next pass continue there, with exactly the batches the interrupted run would have given.
    The dataset is ``loader.sr_dataset`` (``loader.dataset`` wraps it for the workers).
    """

    def __init__(self, dataset: SRDataset, pool: BatchPool | None = None, pin_batches: bool = False, **kwargs: Any) -> None:
        # [epoch, batches handed out, elastic origin: old world, old workers, old batches (0: none)],
        # read by the (persistent) workers at each pass
        kwargs["num_workers"] = state.check_workers(kwargs.get("num_workers", 0))
        control = torch.zeros(5, dtype=torch.int64).share_memory_()
        super().__init__(_Pass(dataset, control, pool), batch_size=None, **kwargs)
        self.sr_dataset = dataset
        self._control, self._pool, self._pin = control, pool, pin_batches
        self.epoch = 0  # of the current (or last) pass
        self._position = 0  # batches of that epoch handed to the trainer
        self._passes = 0
        asked = dataset.requested_epoch  # set_epoch(), here or on the dataset
        self._asked: int | None = None if asked is None else state.check_epoch(asked)
        self._resume: tuple[int, int, tuple[int, int, int] | None] | None = None
        self._loaded_batches = 0  # the "batches" of the state loaded last (named when set_epoch discards it)
        self._origin: tuple[int, int, int] | None = None  # of the current pass, when it is an elastic one
        self.elastic_report: dict[str, int] | None = None  # what an elastic resume re-planned
        self._ender: weakref.finalize | None = None  # ends the persistent workers with this loader
        dataset.attach(self)  # the dataset's set_epoch() reaches this loader

    def __len__(self) -> int:
        return self.sr_dataset.length(self.num_workers)

    @property
    def position(self) -> int:
        """Batches of the current epoch handed to the trainer (a resumed pass starts above 0)."""
        return self._position

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` at the next pass (shard order, patch positions). After ``load_state_dict``
        of an unfinished epoch, another epoch discards the loaded position: that is logged as a warning."""
        asked = state.check_epoch(epoch)
        r = self._resume
        if r is not None and asked != r[0] and (r[1] > 0 or r[2] is not None):
            log.warning(
                "set_epoch(%d) discards the loaded state (epoch %d, %d batches of it done): the next pass gives "
                "epoch %d from its first batch; to continue the interrupted epoch, start the epoch loop at "
                "loader.epoch (%d after load_state_dict), e.g. `for epoch in range(loader.epoch, epochs)`",
                asked,
                r[0],
                self._loaded_batches,
                asked,
                r[0],
            )
        self._asked = asked

    def _next_epoch(self) -> int:
        if self._asked is not None:
            return self._asked
        return self.epoch + 1 if self._passes else 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator over the inner iterator
        epoch = self._next_epoch()
        self._asked = None
        start, origin = 0, None
        if self._resume is not None:
            if self._resume[0] == epoch:
                start, origin = self._resume[1], self._resume[2]
            self._resume = None
        self.epoch, self._position, self._origin = epoch, start, origin
        self._passes += 1
        self._control[0], self._control[1] = epoch, start
        self._control[2], self._control[3], self._control[4] = origin if origin is not None else (0, 0, 0)
        if self._iterator is not None:
            ended(self._iterator)  # a persistent worker that died between passes: reported at once
        try:
            inner = super().__iter__()  # persistent workers: a new pass waits for each of them
        except RuntimeError as exc:
            check(self._iterator, exc)
        detach(inner)  # a dead worker is reported by the next fetch, never in the trainer's own code
        if self.persistent_workers and self.num_workers > 0:
            self._end_with_me(inner)
        return self._batches(inner)

    def _end_with_me(self, inner: Any) -> None:
        """Have the persistent workers of ``inner`` end when this loader is collected, even when it
        is collected as part of a reference cycle (a loader named in a frame that a traceback holds):
        torch's own ``__del__`` then found its queues finalized first, and each worker waited out a
        5 s join timeout before it was terminated."""
        held = self._ender.peek() if self._ender is not None else None
        if held is not None and held[2][0] is inner:  # (loader, function, args, kwargs)
            return
        if self._ender is not None:
            self._ender.detach()
        self._ender = weakref.finalize(self, _end_workers, inner)

    def pass_length(self) -> int:
        """Batches of the current pass: ``len(loader)``, or that of the rest of an epoch re-planned
        by an elastic resume."""
        epoch, _, origin = self._resume if self._resume is not None else (self.epoch, 0, self._origin)
        return state.pass_length(self.sr_dataset, self.num_workers, epoch, origin)

    def _batches(self, inner: Any) -> Iterator[Any]:
        """Batches from the DataLoader, taken out of their pool slots and counted; workers that
        are not persistent are shut down as soon as the pass ends or fails, not whenever garbage
        collection gets to the iterator (which stalled exits by seconds). A dead worker is one
        :class:`WorkerDied` here, whichever check noticed it."""
        pool, pin = self._pool, self._pin
        failed = True
        try:
            for item in watched(inner):
                self._position += 1
                yield as_batch(pool.take(item, pin) if pool is not None and is_slot(item) else item)
            failed = False
        except GeneratorExit:  # the trainer left the pass: persistent workers serve the next one
            failed = False
            raise
        finally:
            if (failed or not self.persistent_workers) and hasattr(inner, "_shutdown_workers"):
                # A failed pass ends its workers now, persistent or not: left to garbage collection
                # with the traceback that holds them, their queues could be finalized first, and
                # each worker then waited out torch's 5 s join timeout before it was terminated.
                inner._shutdown_workers()
                if failed and self._iterator is inner:
                    self._iterator = None  # the next pass starts fresh workers

    # ---- saving and restoring the position --------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A small JSON-able dict: how far the trainer got in which epoch, and what must match to resume."""
        position: state.Position
        if self._resume is not None:
            position = self._resume
        elif not self._passes:
            position = (self._next_epoch(), 0, None)
        else:
            position = (self.epoch, self._position, self._origin)
            if self._position >= self.pass_length():
                position = (self.epoch + 1, 0, None)
        return state.save(self.sr_dataset, self.num_workers, position)

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue where ``saved`` (from :meth:`state_dict`) stopped, at the next pass; ``{}`` changes
        nothing (torchdata's ``StatefulDataLoader`` protocol, which Lightning follows)."""
        if isinstance(saved, dict) and not saved:
            return
        ds = self.sr_dataset
        self._resume = state.restore(ds, self.num_workers, saved)
        epoch, _, origin = self._resume
        self._asked = self.epoch = epoch  # the loop of a resumed run starts at loader.epoch
        self._loaded_batches = int(saved["batches"])
        self.elastic_report = None
        if origin is not None:
            self.elastic_report = r = state.report(ds.elastic_plan(epoch, origin, self.num_workers), ds.config.patches_per_image)
            log.debug(
                "elastic resume of epoch %d: %d patches of %d images (%d partly consumed) left by %d x %d slots, "
                "re-planned over %d x %d: %d per slot, %d dropped",
                epoch,
                r["patches"],
                r["images"],
                r["partial_images"],
                origin[0],
                max(1, origin[1]),
                ds.world.size,
                max(1, self.num_workers),
                r["per_slot"],
                r["dropped"],
            )


def make_loader(
    dataset: SRDataset,
    num_workers: int = 4,
    pin_memory: bool | None = None,
    prefetch_factor: int | None = None,
    persistent_workers: bool = True,
    shared_slots: bool = True,
    **kwargs: Any,
) -> SRLoader:
    """Batches come ready-made from the workers (``batch_size=None``); keep them uint8 until on the device.

    ``prefetch_factor``: batches each worker may have in flight; None (default):
    ``default_prefetch(dataset)``, enough for one image's patches.

    ``shared_slots`` (default): workers hand batches over through recycled shared-memory slots
    (unpinned, the batch tensors are the slot itself until they are dropped; a worker whose slots
    are all held sends its batch torch's way); False: torch's own path (a new shared-memory
    segment per batch), for comparison.
    """
    num_workers = state.check_workers(num_workers)
    dataset.check_batches(num_workers)
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    extra: dict[str, Any] = {}
    pool = None
    if num_workers > 0:
        train = dataset.config.split is Split.TRAIN
        batch_bytes = _batch_bytes(dataset) if train else 0  # reads the first sample's json
        if prefetch_factor is None:
            prefetch_factor = default_prefetch(dataset, batch_bytes)
        elif prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be >= 1, got {prefetch_factor}")
        extra = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers, "worker_init_fn": worker_init}
        if train and shared_slots:
            # slots: the batches a worker may have in flight, plus those the trainer still holds (lent,
            # unpinned: the current one and the one before it while the next is fetched) and one spare
            pool = BatchPool(num_workers, prefetch_factor + 3, batch_bytes)
    if pool is not None:  # the copy out of the slot goes straight into pinned memory
        return SRLoader(dataset, pool, pin_batches=pin_memory, num_workers=num_workers, pin_memory=False, **extra, **kwargs)
    return SRLoader(dataset, num_workers=num_workers, pin_memory=pin_memory, **extra, **kwargs)


PREFETCH_MIN, PREFETCH_MAX, PREFETCH_SLOT_BYTES = 4, 16, 64 << 20


def default_prefetch(ds: SRDataset, batch_bytes: int | None = None) -> int:
    """The batches each worker may have in flight by default: those one image's patches fill, plus
    two, at least ``PREFETCH_MIN`` and at most ``PREFETCH_MAX`` (and at most what fits in
    ``PREFETCH_SLOT_BYTES`` of handoff slots, but never under the minimum).

    A worker emits an image's patches in one burst after its decode, and the trainer takes batches
    from the workers in turn (so that they come in the same order every run): while one worker
    decodes, the others can run only this far ahead, then wait (k=120, batch 16, 2 workers: the
    default is 10; ``python -m bench.prefetch_bench`` measures it against 4, see bench/README.md)."""
    o = ds.config
    if o.split is not Split.TRAIN:
        return PREFETCH_MIN
    burst = -(-o.patches_per_image // o.batch_size) + 2
    by_bytes = PREFETCH_SLOT_BYTES // max(1, batch_bytes if batch_bytes is not None else _batch_bytes(ds))
    return max(PREFETCH_MIN, min(burst, PREFETCH_MAX, by_bytes))


def sample_meta(ds: SRDataset) -> dict[str, Any]:
    """``{key}.json`` of the first readable sample (channels, bit depth); the largest batch's
    values (3 channels, 16 bit) if none of the first shards can be read here."""
    for i in range(min(8, len(ds.manifest.shards))):
        try:
            raw = next(ds.reader.span(Span(i, 0, 1), frozenset({"json"}), fill_cache=False), None)
            if raw is not None and "json" in raw.members:
                header = fmt.SampleHeader.parse(raw.members["json"], raw.shard, raw.key)
                return {"channels": header.channels, "bit_depth": header.bit_depth}
        except (SampleError, ValueError):  # fmt.SampleHeaderError is a ValueError
            continue  # a broken shard or sample: the workers will report it
        finally:
            ds.stats.add(0, **ds.reader.take_counts())  # retries made here count too
    return {"channels": 3, "bit_depth": 16}


def _batch_bytes(ds: SRDataset) -> int:
    """Bytes of one batch, from the first sample's channels and bit depth."""
    meta = sample_meta(ds)
    o = ds.config
    per_pixel = int(meta.get("channels", 3)) * (2 if int(meta.get("bit_depth", 8)) == 16 else 1)
    p = o.patch_size // o.scale
    if o.clip is not None:  # windows: T LR frames, and T HR frames (recurrent) or the centre one
        hr_frames = 1 if o.clip.window == "center" else o.clip.frames
        return o.batch_size * per_pixel * (o.clip.frames * p * p + hr_frames * o.patch_size * o.patch_size)
    lr = 0 if o.degrade is not None else p * p  # degrade=: HR alone (its LR is made on the device)
    return o.batch_size * per_pixel * (lr + o.patch_size * o.patch_size)


def to_float(x: torch.Tensor) -> torch.Tensor:
    """uint8/uint16 batch -> float32 in [0, 1]; call it on the device (after ``.to(device)``)."""
    if x.dtype == torch.uint8:
        return x.float().div_(255.0)
    if x.dtype == torch.uint16:
        return x.to(torch.int32).float().div_(65535.0)
    if x.is_floating_point():
        return x.float()
    raise TypeError(f"to_float expects a uint8/uint16 tensor, got {x.dtype}")


__getattr__ = deprecation.module_getattr(
    __name__,
    {
        "STATE_FORMAT": ("wdsr.state.STATE_FORMAT", state.STATE_FORMAT),
        "PATCH_DRAWS": ("wdsr.state.PATCH_DRAWS", state.PATCH_DRAWS),
    },
)
