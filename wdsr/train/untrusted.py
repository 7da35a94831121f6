"""A model built from untrusted bytes (a model file, a checkpoint's record): its weights' names and shapes held
to the architecture (:func:`check_shapes`), and every allocation its construction makes bounded (:func:`bounded`).

An architecture's hyperparameters are read from the weights' shapes (spandrel) or from a checkpoint's record, so
a crafted file can ask for a 154 GB convolution (``RRDBNet`` with 65536 features) before any weight is compared.
Where the architecture can be laid out on the meta device its shapes are checked first, for nothing; where its
constructor computes with its tensors (SwinIR) it is built for real under :class:`AllocationBudget`, which sizes
each operation on the meta device before running it and refuses the first that would pass the budget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from shardmaker.errors import brief
from wdsr.train.checkpoint import RunError

SLACK_BYTES = 256 << 20  # buffers and temporaries a constructor makes beyond its weights (attention masks)
WEIGHT_FACTOR = 8  # the weights (as float32) may be allocated this many times over while being built (DRCT: ~6)
MAX_OPS = 50_000  # tensor operations of one construction (spandrel's large models: 1-4 thousand; DRCT 3.3k)


class BudgetError(ValueError):
    """A model whose construction would allocate more than its weights justify (exit 2)."""


def budget_for(weights: Mapping[str, Any]) -> int:
    """The bytes a model built to hold ``weights`` may allocate: a few times their float32 size, plus slack."""
    numel = sum(v.numel() for v in weights.values() if isinstance(v, torch.Tensor))
    return WEIGHT_FACTOR * 4 * numel + SLACK_BYTES


def _to_meta(x: Any) -> Any:
    return x.to("meta") if isinstance(x, torch.Tensor) else x


def _allocates(func: Any) -> bool:
    """False for views and in-place ops (their outputs alias an input): they allocate nothing."""
    return not any(r.alias_info is not None for r in func._schema.returns)


class AllocationBudget(TorchDispatchMode):
    """Every tensor operation sized on the meta device first; the running total of the bytes they allocate
    may not pass ``limit`` (a BudgetError naming ``what`` before the operation that would pass it runs), nor
    their number ``max_ops`` (a layer count of 10^9 builds for hours even on the meta device). ``limit=None``:
    the operations are counted only (a layout on the meta device allocates nothing)."""

    def __init__(self, limit: int | None, what: str, max_ops: int | None = None) -> None:
        super().__init__()
        self.limit, self.what, self.used, self.ops = limit, what, 0, 0
        self.max_ops = MAX_OPS if max_ops is None else max_ops

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.ops += 1
        if self.ops > self.max_ops:
            raise BudgetError(
                f"{self.what}: building this model takes over {self.max_ops} tensor operations; its shapes or "
                "hyperparameters (a layer count?) are not a real model's"
            )
        if self.limit is not None and _allocates(func):
            self.used += self._planned(func, args, kwargs)
            if self.used > self.limit:
                raise BudgetError(
                    f"{self.what}: building this model would allocate over {self.limit >> 20} MiB, far more than "
                    f"its weights hold ({func.__name__}); its shapes or hyperparameters are not a real model's"
                )
        return func(*args, **kwargs)

    @staticmethod
    def _planned(func: Any, args: Any, kwargs: dict[str, Any]) -> int:
        meta_kwargs = {k: ("meta" if k == "device" else _to_meta(v)) for k, v in kwargs.items()}
        try:
            out = func(*tree_map(_to_meta, args), **meta_kwargs)
        except Exception:  # noqa: BLE001 - no meta kernel, or a value read (item): a scalar, run for real
            return 0
        tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)


@contextlib.contextmanager
def bounded(weights: Mapping[str, Any], what: str) -> Iterator[None]:
    """Tensor allocations inside bounded by :func:`budget_for` ``weights``."""
    with AllocationBudget(budget_for(weights), what):
        yield


def check_shapes(expected: Mapping[str, torch.Tensor], weights: Mapping[str, Any], what: str) -> None:
    """The same names and, name by name, tensors of the same shapes; a RunError starting ``what`` otherwise."""
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        first = f"missing {missing[0]!r}" if missing else f"unexpected {brief(unexpected[0])}"
        raise RunError(f"{what} ({len(missing)} missing, {len(unexpected)} unexpected: {first})")
    for key, want in expected.items():
        got = weights[key]
        if not isinstance(got, torch.Tensor):
            raise RunError(f"{what} ({key}: a {type(got).__name__} in the file, not a tensor)")
        if tuple(got.shape) != tuple(want.shape):
            raise RunError(f"{what} ({key}: {brief(tuple(got.shape))} in the file, {tuple(want.shape)} in the model)")
