"""A seeded shuffle buffer: items leave in random order once ``size`` of them are waiting."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def shuffled(items: Iterable[T], size: int, rng: np.random.Generator) -> Iterator[T]:
    """Yield every item exactly once; a larger ``size`` mixes more (size <= 1: no shuffling)."""
    if size <= 1:
        yield from items
        return
    buf: list[T] = []
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        i = int(rng.integers(0, size))
        out, buf[i] = buf[i], item
        yield out
    for i in rng.permutation(len(buf)):
        yield buf[int(i)]
