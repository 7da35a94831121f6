"""Ranges written once, on the dataclass fields (``wdsr.bounds``): ``wdsr.Retry``, ``wdsr.ClipConfig`` and
``TrainConfig`` check their own, and ``wdsr train``'s flags and config files give the same range; the one
``patch_size % scale`` rule in one wording wherever a patch meets a scale; ``--help`` shows the dataclasses'
defaults."""

from __future__ import annotations

import argparse
import re

import numpy as np
import pytest
import torch

import wdsr
from wdsr.bounds import bounds, default_of
from wdsr.degrade import draw_params
from wdsr.pipeline.patches import PatchConfig
from wdsr.tools.cli import _parser
from wdsr.train.config import CLIP_KEYS, DEFAULT_STEPS, ConfigError, TrainConfig, make_config

BASE = {"data": "/d", "out": "/o"}


def _range(message: str) -> str:
    found = re.search(r"must be (an integer|a finite number|a list of .*?) in ([\[(].*?\])", message)
    assert found, message
    return found.group(0)


def _out_of_range(bound) -> list:
    return [bound.hi * 2 + 1, bound.lo - 1] if bound.integer else [bound.hi * 2 + 1, bound.lo - 1, float("inf")]


@pytest.mark.parametrize("field", sorted(bounds(wdsr.Retry)))
def test_a_config_file_retry_is_held_to_retrys_own_ranges(field):
    for bad in _out_of_range(bounds(wdsr.Retry)[field]):
        with pytest.raises(ValueError) as own:
            wdsr.Retry(**{field: bad})
        with pytest.raises(ConfigError) as filed:
            make_config(BASE | {"retry": {field: bad}})
        assert str(own.value).startswith(f"retry.{field} must be") and str(own.value) in str(filed.value)


@pytest.mark.parametrize("key", sorted(k for k, f in CLIP_KEYS.items() if f in bounds(wdsr.ClipConfig)))
def test_clip_flags_are_held_to_clipconfigs_own_ranges(key):
    field = CLIP_KEYS[key]
    bound = bounds(wdsr.ClipConfig)[field]
    for bad in _out_of_range(bound):
        with pytest.raises(ValueError) as own:
            wdsr.ClipConfig(**{field: bad})
        with pytest.raises(ConfigError) as flagged:
            make_config(BASE | {"model": "tinyvsr", "clip_frames": 3, key: bad})
        assert str(own.value).startswith(f"clip {field} must be")
        assert _range(str(flagged.value)).split(" in ")[-1] == _range(str(own.value)).split(" in ")[-1]


def test_train_settings_are_held_to_their_fields_ranges():
    for field, bound in bounds(TrainConfig).items():
        for bad in _out_of_range(bound):
            with pytest.raises(ConfigError, match=f"^--{field.replace('_', '-')} must be"):
                make_config(BASE | {field: bad})


def test_one_patch_and_scale_rule_in_one_wording():
    rule = (
        r"^(patch_size|gt_size|--patch-size|HR patch height) 190 must be a positive multiple of (scale|--scale) 4 \(e\.g\. 192\)$"
    )
    calls = [
        lambda: PatchConfig(4, 190),
        lambda: wdsr.DatasetConfig(patch_size=190),
        lambda: wdsr.RealESRGANConfig(gt_size=190),
        lambda: wdsr.BSRGANConfig(gt_size=190),
        lambda: wdsr.ArbitraryScaleConfig(scale=4, gt_size=190),
        lambda: draw_params(wdsr.RealESRGANConfig(), np.random.default_rng(0), 190),
        lambda: wdsr.Degrader(wdsr.BSRGANConfig())(torch.zeros(1, 3, 190, 192, dtype=torch.uint8), {}),
        lambda: make_config(BASE | {"patch_size": 190}),
    ]
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        assert re.match(rule, str(info.value)), str(info.value)


def _train_help() -> dict[str, str]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a.help or "" for a in sub.choices["train"]._actions}


def test_train_help_shows_the_dataclasses_defaults():
    shown = {dest: re.search(r"\(default ([^;)]+)", text) for dest, text in _train_help().items()}
    shown = {dest: m.group(1) for dest, m in shown.items() if m}
    assert len(shown) >= 15, shown
    for dest, text in shown.items():
        if dest == "steps":  # None in the dataclass: DEFAULT_STEPS unless --epochs
            value = DEFAULT_STEPS
        elif dest in TrainConfig.__dataclass_fields__:
            value = default_of(TrainConfig, dest)
        elif dest in CLIP_KEYS:
            value = default_of(wdsr.ClipConfig, CLIP_KEYS[dest])
        else:
            value = getattr(wdsr.DatasetConfig(), dest)
        value = getattr(value, "value", value)
        expected = (
            ",".join(map(str, value)) if isinstance(value, tuple) else f"{value:g}" if isinstance(value, float) else str(value)
        )
        assert text.split(" ")[0] == expected, (dest, text, expected)


def test_bench_and_preview_defaults_are_the_datasets():
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    d = wdsr.DatasetConfig()
    for command, dests in (
        ("bench", ("scale", "patch_size", "batch_size", "patches_per_image", "read_ahead")),
        ("preview", ("scale", "seed")),
    ):
        actions = {a.dest: a for a in sub.choices[command]._actions}
        for dest in dests:
            assert actions[dest].default == getattr(d, dest), (command, dest)
