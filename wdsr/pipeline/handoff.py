"""Hand batches from workers to the trainer through recycled shared memory.

torch sends each batch tensor through a new shared-memory segment: creating it costs ~1.2 ms per
1.9 MB batch here (mostly ``fallocate`` zeroing tmpfs pages), about 8% of a worker's time at
QOI speed. Instead each worker writes its batch into one of a few slots of a pool made before
the workers start, and sends only the slot number. Unpinned, the trainer gets tensors over the slot
itself, and the slot is free again when they are gone (copying a 1.9 MB batch out took ~0.3 ms of
the trainer process per batch, a quarter of a core at 900 batches/s). Pinned, the trainer copies the
batch out into pinned memory and frees the slot at once. Either way a slot is never reused while
anything can still see it; a worker that finds all its slots in use sends its batch torch's way.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class SlotRef:
    """What a worker sends instead of a batch: which slot of which pool holds it, and its shapes.
    (A dataclass passes through the DataLoader's ``default_convert`` untouched.)"""

    token: int  # the pool's
    index: int
    lr_shape: tuple[int, ...]
    hr_shape: tuple[int, ...]
    dtype: str
    keys: list[str] | None
    params: Any = None  # degrade=: the batch's degradation parameters (numpy, pickled with the reference)


_DTYPES = {"uint8": (np.uint8, torch.uint8), "uint16": (np.uint16, torch.uint16)}


class BatchPool:
    def __init__(self, workers: int, slots: int, slot_bytes: int) -> None:
        self.workers, self.slots, self.slot_bytes = workers, slots, slot_bytes
        # torch shared memory (not multiprocessing's heap): inherited by forked workers, sent by fd to spawned ones
        self._data = torch.empty(workers * slots * slot_bytes, dtype=torch.uint8).share_memory_()
        self._flags = torch.zeros(workers * slots, dtype=torch.int8).share_memory_()
        self._next = 0
        self.token = int.from_bytes(os.urandom(6), "little")  # tells pools apart

    @property
    def _busy(self) -> np.ndarray:
        return self._flags.numpy()

    def _view(self, index: int) -> np.ndarray:
        return self._data.numpy()[index * self.slot_bytes : (index + 1) * self.slot_bytes]

    def _reserve(self, worker: int) -> int | None:
        """A free slot of ``worker``, marked busy; None when all are busy."""
        for k in range(self.slots):
            slot = (self._next + k) % self.slots
            index = worker * self.slots + slot
            if not self._busy[index]:
                self._next = slot + 1
                self._busy[index] = 1
                return index
        return None

    def _rows(
        self, index: int, dtype: np.dtype, lr_shape: tuple[int, ...], hr_shape: tuple[int, ...]
    ) -> tuple[np.ndarray, np.ndarray]:
        view = self._view(index)
        n_lr = int(np.prod(lr_shape)) * dtype.itemsize
        n_hr = int(np.prod(hr_shape)) * dtype.itemsize
        return view[:n_lr].view(dtype).reshape(lr_shape), view[n_lr : n_lr + n_hr].view(dtype).reshape(hr_shape)

    def _fits(self, dtype: np.dtype, lr_shape: tuple[int, ...], hr_shape: tuple[int, ...]) -> bool:
        nbytes = (int(np.prod(lr_shape)) + int(np.prod(hr_shape))) * dtype.itemsize
        return nbytes <= self.slot_bytes and dtype.name in _DTYPES

    def put_patches(self, worker: int, patches: Sequence[Writable], keys: list[str] | None, params: Any = None) -> SlotRef | None:
        """Write patches straight into a free slot of ``worker`` (each patch's one copy); None when
        none is free or they do not fit."""
        first = patches[0]
        dtype = np.dtype(first.dtype)
        lr_shape, hr_shape = (len(patches),) + first.lr_shape, (len(patches),) + first.hr_shape
        if not self._fits(dtype, lr_shape, hr_shape):
            return None
        index = self._reserve(worker)
        if index is None:
            return None
        try:
            write_rows(patches, *self._rows(index, dtype, lr_shape, hr_shape))
        except BaseException:
            self._busy[index] = 0
            raise
        return SlotRef(self.token, index, lr_shape, hr_shape, dtype.name, keys, params)

    def take(self, ref: SlotRef, pin: bool) -> tuple[Any, ...]:
        """The trainer side: the batch's tensors. Pinned: copied out into pinned memory and the
        slot freed at once (an asynchronous copy to the device may still read a pinned batch
        after the trainer dropped it, so a slot is never handed out pinned). Else the tensors are
        the slot itself, lent: the slot is freed when the last of them and of their views is gone
        (a copy to a device from pageable memory is done when ``.to()`` returns)."""
        token, index, lr_shape, hr_shape, dtype, keys = ref.token, ref.index, ref.lr_shape, ref.hr_shape, ref.dtype, ref.keys
        if token != self.token:
            raise RuntimeError("a batch arrived from another loader's workers; build one loader per dataset")
        np_t, torch_t = _DTYPES[dtype]
        if not pin:
            lr, hr = self._rows(index, np.dtype(np_t), tuple(lr_shape), tuple(hr_shape))
            _lend(self._busy, index, (lr, hr))
            lr_t, hr_t = torch.from_numpy(lr), torch.from_numpy(hr)
            return _batch(lr_t, hr_t, keys, ref.params)
        view, out, at = self._view(index), [], 0
        for shape in (lr_shape, hr_shape):
            t = torch.empty(tuple(shape), dtype=torch_t, pin_memory=pin)
            nbytes = t.numel() * t.element_size()
            dst = t.view(torch.uint8).reshape(-1).numpy() if torch_t is torch.uint16 else t.reshape(-1).numpy()
            np.copyto(dst, view[at : at + nbytes].view(dst.dtype))
            at += nbytes
            out.append(t)
        self._busy[index] = 0
        return _batch(out[0], out[1], keys, ref.params)


def _batch(lr: torch.Tensor, hr: torch.Tensor, keys: list[str] | None, params: Any) -> tuple[Any, ...]:
    """``(lr, hr[, keys])``; with degradation parameters (``degrade=``: no LR yet) ``(hr, params[, keys])``."""
    out: tuple[Any, ...] = (lr, hr) if params is None else (hr, params)
    return out if keys is None else (*out, list(keys))


def _lend(busy: np.ndarray, index: int, arrays: tuple[np.ndarray, ...]) -> None:
    """Free slot ``index`` once every one of ``arrays`` is gone: each tensor made from one with
    ``torch.from_numpy`` holds it until its storage, shared by all its views, is freed."""
    left = [len(arrays)]

    def release() -> None:
        left[0] -= 1
        if left[0] == 0:
            busy[index] = 0

    for a in arrays:
        weakref.finalize(a, release)


class Writable(Protocol):
    """A patch that can write itself into a batch's rows (``wdsr.pipeline.patches.Patch``)."""

    @property
    def dtype(self) -> np.dtype: ...
    @property
    def lr_shape(self) -> tuple[int, int, int]: ...
    @property
    def hr_shape(self) -> tuple[int, int, int]: ...
    def write(self, lr_out: np.ndarray, hr_out: np.ndarray) -> None: ...


def write_rows(patches: Sequence[Writable], lr_rows: np.ndarray, hr_rows: np.ndarray) -> None:
    """Patch ``i`` into row ``i`` of ``lr_rows`` and ``hr_rows`` (each patch refuses rows of another size or depth)."""
    for i, p in enumerate(patches):
        p.write(lr_rows[i], hr_rows[i])


def is_slot(item: Any) -> bool:
    return isinstance(item, SlotRef)
