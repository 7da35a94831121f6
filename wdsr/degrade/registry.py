"""The degradation models, named once. ``wdsr.Degrader``, ``draw_params``, the ``--degrade`` choices of
``wdsr train`` and ``wdsr preview``, a train config file's ``degrade:`` and BasicSR's
``datasets.train.degrade`` all read :data:`DEGRADATIONS`.

A model is one entry: its name, its config (a frozen dataclass with ``scale`` and ``gt_size``), the
module that draws a sample's parameters in the worker (``draw_arrays``) and degrades on the device (its
pipeline), the granularities its ``Degrader`` takes, and whether its LR is the HR over one integer scale
(what a model of one scale, such as ``wdsr train``'s, learns from)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from shardmaker.errors import brief
from wdsr.degrade import arbitrary, bsrgan, realesrgan
from wdsr.degrade.config import ArbitraryScaleConfig, BSRGANConfig, RealESRGANConfig

GRANULARITIES = ("sample", "batch")


@dataclasses.dataclass(frozen=True)
class Degradation:
    """One degradation model and what it needs."""

    name: str  # what --degrade, config files and BasicSR's YAML call it
    config: type  # its settings: a frozen dataclass with scale and gt_size (the HR patch side)
    summary: str  # one line: what it is (the --help of --degrade)
    draw_arrays: Callable[[Any, np.random.Generator, int], dict[str, np.ndarray]]  # a sample's parameters
    pipeline: Callable[[Any], torch.nn.Module]  # the device side: (gt, params, granularity) -> (lr, hr)
    granularities: tuple[str, ...]  # what Degrader(cfg, granularity=...) takes; the first is the default
    granularity_note: str  # why the others are refused
    float_scale: str | None = None  # None: the LR is HR / cfg.scale; else why it is not (a float scale)

    def __post_init__(self) -> None:
        if not self.granularities or not set(self.granularities) <= set(GRANULARITIES):
            raise ValueError(f"degradation {self.name}: granularities must be some of {GRANULARITIES}")


DEGRADATIONS: dict[str, Degradation] = {
    d.name: d
    for d in (
        Degradation(
            "realesrgan",
            RealESRGANConfig,
            "Real-ESRGAN's second-order model (train_realesrnet_x4plus.yml, USM-sharpened HR target)",
            realesrgan.draw_arrays,
            realesrgan.RealESRGANPipeline,
            ("sample", "batch"),
            "",
        ),
        Degradation(
            "bsrgan",
            BSRGANConfig,
            "BSRGAN's shuffled one (degradation_bsrgan)",
            bsrgan.draw_arrays,
            bsrgan.BSRGANPipeline,
            ("sample",),
            "granularity='batch' is Real-ESRGAN's per-batch draws; BSRGAN degrades each sample on its own",
        ),
        Degradation(
            "arbitrary",
            ArbitraryScaleConfig,
            "arbitrary-scale SR's bicubic down-sampling at a float scale drawn per batch (LIIF, LTE)",
            arbitrary.draw_arrays,
            arbitrary.ArbitraryScalePipeline,
            ("batch",),
            "granularity='sample' would give LR patches of many sizes; one scale per batch ('batch')",
            float_scale="draws a float scale per batch, for arbitrary-scale models (LIIF, LTE)",
        ),
    )
}
NAMES = tuple(DEGRADATIONS)
CONFIGS = tuple(d.config for d in DEGRADATIONS.values())


def config_names() -> str:
    """``wdsr.RealESRGANConfig, wdsr.BSRGANConfig or wdsr.ArbitraryScaleConfig``: for error messages."""
    names = [f"wdsr.{c.__name__}" for c in CONFIGS]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def lookup(name: Any, label: str = "degrade") -> Degradation:
    """The model called ``name``; a ValueError naming ``label`` and the names there are otherwise."""
    if not isinstance(name, str) or name not in DEGRADATIONS:
        raise ValueError(f"{label}: {brief(name)} is not one of {', '.join(NAMES)}")
    return DEGRADATIONS[name]


def of(cfg: Any) -> Degradation:
    """The model of a config instance; a TypeError naming the configs there are otherwise."""
    for d in DEGRADATIONS.values():
        if type(cfg) is d.config:
            return d
    raise TypeError(f"expected a {config_names()}, got {type(cfg).__name__}")


def name_of(cfg: Any) -> str | None:
    """The name of a config's model (None for None: no degradations)."""
    return None if cfg is None else of(cfg).name


def make(name: Any, scale: int, gt_size: int, label: str = "degrade", **fields: Any) -> Any:
    """The named model's config at ``scale`` and HR patch side ``gt_size``, its defaults otherwise (or
    ``fields``, the config's own names); a ValueError naming ``label`` for an unknown name or field."""
    d = lookup(name, label)
    known = {f.name for f in dataclasses.fields(d.config)} - {"scale", "gt_size"}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"{label}: unknown field {unknown[0]!r} of {d.config.__name__} (known: {', '.join(sorted(known))})")
    return d.config(scale=scale, gt_size=gt_size, **fields)


def check_fixed_scale(d: Degradation, label: str, user: str) -> None:
    """The one refusal of a float-scale model by a ``user`` whose models upscale by one integer scale."""
    if d.float_scale is not None:
        raise ValueError(
            f"{label} {d.name} {d.float_scale}; {user}'s models upscale by one integer --scale: stream it with "
            f"SRDataset(degrade=wdsr.{d.config.__name__}(...)) or BasicSR's WdsrDataset (docs/degrade.md)"
        )
