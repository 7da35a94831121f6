"""A seeded shuffle buffer whose whole state is a count, so a stream can resume inside it.

Items leave in random order once ``size`` of them are waiting: each new item takes the place of
a random waiting one, which leaves; when the input ends, the rest leave in a random permutation.
The random draws never look at the items. So after ``n`` items have left, which input positions
are still waiting, and in which buffer place, is a function of ``(size, rng seed, inputs, n)``
alone: :func:`fast_forward` recomputes it from positions (a few ms per 100k items, vectorised),
and :func:`shuffled` continues from there with a buffer of positions that it resolves to items
only when they leave. The random indices come in blocks of ``_BLOCK`` draws, which is what makes
the replay vectorisable (and the shuffle itself cheaper than one draw per item).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
_BLOCK = 4096


@dataclasses.dataclass(frozen=True)
class ShufflePoint:
    """Where a shuffle stands after ``emitted`` items have left.

    ``buffer``: input positions waiting, in buffer order; ``next_input``: the first input position
    not yet taken in; ``draws``: the unused rest of the current block of random indices; ``tail``:
    once the input has ended, the positions still to leave, in order (then ``buffer`` is empty).
    """

    emitted: int
    buffer: tuple[int, ...]
    next_input: int
    draws: tuple[int, ...] = ()
    tail: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class _Waiting:
    pos: int


def _draws(rng: np.random.Generator, size: int, first: Iterable[int] = ()) -> Iterator[int]:
    yield from first
    while True:
        yield from rng.integers(0, size, _BLOCK).tolist()


def shuffled(
    items: Iterable[T],
    size: int,
    rng: np.random.Generator,
    start: ShufflePoint | None = None,
    resolve: Callable[[int], T] | None = None,
) -> Iterator[T]:
    """Yield every item exactly once; a larger ``size`` mixes more (size <= 1: no shuffling).

    From ``start`` (made by :func:`fast_forward` with a fresh ``rng`` of the same seed), ``items``
    must begin at input position ``start.next_input``, and ``resolve(position)`` makes the item of
    a position that was waiting in the buffer at ``start``.
    """
    if size <= 1:
        yield from items
        return
    buf: list[Any] = []
    first: tuple[int, ...] = ()
    if start is not None and start.emitted:
        if resolve is None:
            raise ValueError("resuming a shuffle needs resolve() for the positions waiting in it")
        if start.tail is not None:
            for pos in start.tail:
                yield resolve(pos)
            return
        buf, first = [_Waiting(p) for p in start.buffer], start.draws
    draws = _draws(rng, size, first)
    for item in items:
        if len(buf) < size:
            buf.append(item)
            continue
        i = next(draws)
        out, buf[i] = buf[i], item
        yield resolve(out.pos) if isinstance(out, _Waiting) else out  # type: ignore[misc]
    for i in rng.permutation(len(buf)).tolist():
        out = buf[i]
        yield resolve(out.pos) if isinstance(out, _Waiting) else out  # type: ignore[misc]


def fast_forward(size: int, rng: np.random.Generator, total: int, emitted: int) -> ShufflePoint:
    """The state of ``shuffled`` over ``total`` inputs after ``emitted`` outputs, with ``rng``
    advanced exactly as that run had advanced it (pass the same ``rng`` on to :func:`shuffled`)."""
    if not 0 <= emitted <= total:
        raise ValueError(f"cannot resume a shuffle after {emitted} of {total} items")
    if size <= 1:
        return ShufflePoint(emitted, (), emitted)
    if emitted == 0:
        return ShufflePoint(0, (), 0)
    fill, steady = min(size, total), max(0, total - size)  # steady: outputs made while inputs still come in
    n = min(emitted, steady)
    buf = np.arange(fill, dtype=np.int64)
    rest: tuple[int, ...] = ()
    if n:
        draws = np.concatenate([rng.integers(0, size, _BLOCK) for _ in range(-(-n // _BLOCK))])
        # a place holds the last input written into it (input size + t at step t), or its first fill
        places, first = np.unique(draws[:n][::-1], return_index=True)
        buf[places] = size + (n - 1 - first)
        rest = tuple(draws[n:].tolist())
    if emitted <= steady:
        return ShufflePoint(emitted, tuple(buf.tolist()), size + n, rest)
    order = buf[rng.permutation(fill)]
    return ShufflePoint(emitted, (), total, (), tuple(order[emitted - steady :].tolist()))
