"""Every random stream of a run, derived in one place from ``(seed, epoch, ...)``.

Each derivation has a name and a salt of its own, so two streams never coincide and a rule cannot
drift between the code that makes a stream and the code that replays it (an elastic resume replays
other ranks' shuffles: it must draw exactly what they drew). Nothing here reads a clock, a pid or the
environment; changing a salt changes every batch of every run, so they are fixed forever.
"""

from __future__ import annotations

import hashlib

import numpy as np

# one salt per stream (ASCII pairs, for the eye)
SHARD_ORDER = 0x5A4D  # the epoch's shard permutation
MIX_SOURCE_ORDER = 0x4D49  # a mix source's own shard order
MIX_SEGMENT_ORDER = 0x5345  # the order of a mix's segments (sources interleaved)
SHUFFLE = 0x5348  # a worker slot's shuffle buffer
ELASTIC_SHUFFLE = 0x454C  # the shuffle buffer of a slot of an epoch re-planned over a new world
DEGRADE = 0x4447  # one patch's degradation parameters (SRDataset(..., degrade=cfg))


def shard_order(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, SHARD_ORDER])


def mix_source_order(seed: int, epoch: int, source: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, source, MIX_SOURCE_ORDER])


def mix_segment_order(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, MIX_SEGMENT_ORDER])


def shuffle(seed: int, epoch: int, rank: int, worker: int) -> np.random.Generator:
    """The shuffle buffer of worker slot ``(rank, worker)``: made by that worker, replayed (to know
    what it had handed out) by an elastic resume."""
    return np.random.default_rng([seed, epoch, rank, worker, SHUFFLE])


def elastic_shuffle(seed: int, epoch: int, rank: int, worker: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, rank, worker, ELASTIC_SHUFFLE])


def degrade(base: np.uint64, j: int) -> np.random.Generator:
    """Patch ``j``'s degradation parameters, from its sample's :func:`patch_base` (seed, epoch, key)."""
    return np.random.default_rng([int(base), j, DEGRADE])


def key_hash(key: str) -> int:
    """A sample key as 64 bits (blake2b), the same in every process and Python version."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def patch_base(seed: int, epoch: int, key: str | int) -> np.uint64:
    """The counter base of one sample's patch draws in one epoch (``key`` or its :func:`key_hash`):
    independent of the world size, the worker and the order samples arrive in."""
    kh = key if isinstance(key, int) else key_hash(key)
    digest = hashlib.blake2b(f"{seed}:{epoch}:{kh}".encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))
