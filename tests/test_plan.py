"""The plan: a pure function; equal slices, full coverage, wrap-only duplicates, val exactly once."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from wdsr.pipeline.plan import slice_length, train_plan, val_plan


def positions(slices):
    return [[(sp.shard_index, i, sp.rep) for sp in s for i in range(sp.start, sp.stop)] for s in slices]


CASES = [
    ([5], 4, 4),  # one shard, 16 slices: fewer shards than workers
    ([3, 3, 3, 1], 2, 2),
    ([7, 1, 4, 9, 2], 3, 2),
    ([100], 1, 1),
    ([1, 1, 1], 5, 3),
    ([10, 0, 10], 2, 3),
] + [
    (
        list(np.random.default_rng(i).integers(1, 30, size=int(np.random.default_rng(i).integers(1, 12)))),
        int(1 + i % 4),
        int(1 + (i // 4) % 4),
    )
    for i in range(40)
]


@pytest.mark.parametrize("sizes,world,workers", CASES)
def test_slices_equal_disjoint_and_covering(sizes, world, workers):
    total = sum(sizes)
    for epoch in (0, 1):
        slices = positions(train_plan(sizes, seed=7, epoch=epoch, world_size=world, num_workers=workers))
        length = slice_length(total, world * workers)
        assert len(slices) == world * workers
        assert all(len(s) == length for s in slices)  # every rank: same samples, same batches
        flat = [p for s in slices for p in s]
        first = [(sh, i) for sh, i, rep in flat if rep == 0]
        assert len(first) == len(set(first)) == total  # first pass: disjoint and complete
        assert sorted(set(first)) == [(s, i) for s, n in enumerate(sizes) for i in range(n)]
        padding = [(sh, i) for sh, i, rep in flat if rep > 0]
        assert len(padding) == world * workers * length - total  # duplicates only from the wrap


def test_pure_and_epoch_dependent():
    sizes = [4, 6, 2, 8, 5]
    a = train_plan(sizes, 1, 3, 2, 2)
    assert a == train_plan(sizes, 1, 3, 2, 2)
    orders = {tuple(sp.shard_index for s in train_plan(sizes, 1, e, 1, 1) for sp in s) for e in range(6)}
    assert len(orders) > 1
    assert train_plan(sizes, 1, 3, 2, 2) != train_plan(sizes, 2, 3, 2, 2) or len(set(sizes)) == 1


@pytest.mark.parametrize("sizes,world,workers", list(itertools.product([[3, 3, 3, 1], [1], [9, 4]], [1, 2, 3], [1, 2, 4])))
def test_val_every_sample_once_in_manifest_order(sizes, world, workers):
    slices = [[(ref.shard_index, ref.sample) for ref in s] for s in val_plan(sizes, world, workers)]
    every = [x for s in slices for x in s]
    assert Counter(every) == Counter((s, i) for s, n in enumerate(sizes) for i in range(n))
    expected = [(s, i) for s, n in enumerate(sizes) for i in range(n)]
    merged = []
    for r in range(world):
        rank = slices[r * workers : (r + 1) * workers]
        # a DataLoader takes one item from each worker in turn
        for n in range(max(len(x) for x in rank) if any(rank) else 0):
            merged += [w[n] for w in rank if n < len(w)]
    assert merged == expected


def test_bad_arguments():
    with pytest.raises(ValueError):
        train_plan([3], 0, 0, 0, 1)
    with pytest.raises(ValueError, match="no samples"):
        train_plan([0, 0], 0, 0, 1, 1)
