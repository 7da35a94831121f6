"""The decoder's table: every kind of sample (how it is stored) and every source of LR, as their
modules declare them (``wdsr.pipeline.sample``), and the rules they make for a dataset.

A sample is decoded by the first kind that claims it, with its stored LR or its HR alone made into
a pair by the LR source asked for. A dataset is streamed with a kind x LR source x options that
the kinds and sources allow; what they do not is a ValueError naming the folder, before any read.
Adding a kind (3D volumes, say) is a module that declares its :class:`SampleKind`, and a row here.
"""

from __future__ import annotations

from typing import Any

from shardmaker.format import Manifest
from wdsr.pipeline import bicubic, clips, degraded, tiled, whole
from wdsr.pipeline.read import RawSample
from wdsr.pipeline.sample import LrMode, LrSource, SampleKind

SAMPLE_KINDS: tuple[SampleKind, ...] = (clips.KIND, tiled.KIND, whole.KIND)  # the first that claims a sample decodes it


def _stored_lr(folder: str, m: Manifest, scale: int) -> None:
    """The dataset holds LR images of the scale asked for."""
    if scale in m.scales:
        return
    if not m.scales:
        raise ValueError(f"{folder}: an HR-only dataset (shardmaker build --hr-only): stream it with lr='bicubic'")
    raise ValueError(f"{folder}: no x{scale} LR in this dataset (scales: {m.scales}; lr='bicubic' makes any)")


STORED = LrSource(modes=(LrMode.STORED,), make=None, check=_stored_lr, cacheable=True)  # each sample kind decodes it
LR_SOURCES: dict[LrMode, LrSource] = {mode: src for src in (STORED, bicubic.SOURCE, degraded.SOURCE) for mode in src.modes}


def sample_kind(raw: RawSample) -> SampleKind:
    """The kind of this sample: the first row of :data:`SAMPLE_KINDS` that claims it."""
    return next(kind for kind in SAMPLE_KINDS if kind.claims(raw))


def dataset_kinds(m: Manifest) -> list[SampleKind]:
    """The kinds of sample a dataset may hold (an image dataset: whole and tiled samples, mixed)."""
    return [kind for kind in SAMPLE_KINDS if kind.holds(m)]


def wanted_members(m: Manifest, scale: int, lr: LrMode) -> frozenset[str]:
    """The members a sample is read with, whatever kind it turns out to be: HR, the x``scale`` LR and (our
    shards) ``{key}.json``; of a clip dataset's sample, every frame's; with LR made from HR, HR alone."""
    kinds = dataset_kinds(m)
    if len(kinds) == 1:
        return kinds[0].members(m, scale, lr)
    return frozenset().union(*(kind.members(m, scale, lr) for kind in kinds))


def check_modes(folder: str, m: Manifest, scale: int, lr: LrMode, clip: Any) -> LrSource:
    """The dataset ``m`` (at ``folder``) streamed at ``scale`` with LR from ``lr`` and ``clip=``: what the
    LR source needs of the dataset, whether its kinds of sample serve that source, and what they ask of
    the options; the LR source, or a ValueError."""
    source = LR_SOURCES[lr]
    source.check(folder, m, scale)
    for kind in dataset_kinds(m):
        if not kind.serves(lr):
            raise ValueError(f"{folder}: {kind.what}; {source.what(lr)} of {kind.plural} is not there yet")
        kind.options(folder, clip)
    return source
