"""One registry of degradations (``wdsr.degrade.registry``): every surface that takes a model by name offers
the same names, read from the surface itself (argparse choices, the error a surface gives for an unknown
name, the config a name becomes), and each name's config runs in ``wdsr.Degrader`` and ``SRDataset``.
``arbitrary`` draws a float scale, which ``wdsr train``'s models of one integer scale cannot learn from: its
flag and its config files refuse it with one reason."""

from __future__ import annotations

import argparse
import re

import numpy as np
import pytest
import torch

import wdsr
from wdsr.degrade import DEGRADATIONS, collate_params, draw_params
from wdsr.integrations.basicsr import dataset_options
from wdsr.tools.cli import _parser, main
from wdsr.train.config import ConfigError, degrade_config, make_config

P = 128  # BSRGAN needs above 96 at x4


def _choices(command: str) -> set[str]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if a.dest == "degrade")
    return set(action.choices)


def _named_in_refusal(call) -> set[str]:
    """The names a surface lists when it refuses an unknown one."""
    with pytest.raises(ValueError) as info:
        call("realesrnet")
    found = re.search(r"'realesrnet' is not one of (.+)$", str(info.value))
    assert found, str(info.value)
    return set(found.group(1).split(", "))


def _basicsr_config(name: str):
    """The config BasicSR's ``degrade: NAME`` makes (``scale: 1`` where the model asks for it)."""
    opt = {"type": "WdsrDataset", "dataroot": "/d", "gt_size": P}
    try:
        return dataset_options(opt | {"scale": 4, "degrade": name})[1]["degrade"]
    except ValueError as exc:
        assert "give the top-level `scale: 1`" in str(exc)
        return dataset_options(opt | {"scale": 1, "degrade": name})[1]["degrade"]


def test_every_surface_offers_the_same_names():
    surfaces = {
        "wdsr train --degrade": _choices("train"),
        "wdsr preview --degrade": _choices("preview"),
        "train config files": _named_in_refusal(lambda n: make_config({"data": "/d", "out": "/o", "degrade": n})),
        "BasicSR datasets.train.degrade": _named_in_refusal(
            lambda n: dataset_options({"type": "WdsrDataset", "dataroot": "/d", "degrade": n})
        ),
    }
    assert all(names == set(DEGRADATIONS) for names in surfaces.values()), surfaces
    assert {"realesrgan", "bsrgan", "arbitrary"} <= set(DEGRADATIONS)


@pytest.mark.parametrize("name", sorted(DEGRADATIONS))
def test_each_name_degrades_everywhere_and_trains_or_is_refused_with_its_reason(name):
    cfg = _basicsr_config(name)
    assert type(cfg).__name__ in wdsr.__all__  # the config is public
    assert degrade_config(name, cfg.scale, P, "flags", fixed_scale=False) == cfg  # wdsr preview's
    ds = wdsr.DatasetConfig(scale=cfg.scale, patch_size=P, degrade=cfg)  # SRDataset's check
    assert ds.degrade is cfg
    hr = torch.randint(0, 256, (2, 3, P, P), dtype=torch.uint8)
    params = collate_params([draw_params(cfg, np.random.default_rng([7, j]), P) for j in range(2)])
    lr, target = wdsr.Degrader(cfg)(hr, params)
    assert lr.dtype == torch.float32 and lr.shape[:2] == (2, 3) and target.shape == (2, 3, P, P)
    try:
        trained = make_config({"data": "/d", "out": "/o", "degrade": name, "scale": max(cfg.scale, 2), "patch_size": P})
    except ConfigError as exc:  # the one refusal: a float scale
        assert str(exc).startswith(f"--degrade {name} draws a float scale per batch")
        assert "wdsr train's models upscale by one integer --scale" in str(exc)
    else:
        assert trained.dict["degrade"] == name


def test_wdsr_train_refuses_arbitrary_in_one_line_from_the_flag_and_a_config_file(tmp_path, capsys):
    argv = ["train", "--data", str(tmp_path / "d"), "--out", str(tmp_path / "o"), "--degrade", "arbitrary"]
    assert main(argv) == 2
    flag = capsys.readouterr().err.strip()
    assert flag.count("\n") == 0 and "--degrade arbitrary draws a float scale per batch" in flag
    assert "SRDataset(degrade=wdsr.ArbitraryScaleConfig(...))" in flag
    conf = tmp_path / "train.yaml"
    conf.write_text(f"data: {tmp_path / 'd'}\nout: {tmp_path / 'o'}\ndegrade: arbitrary\n")
    assert main(["train", "--config", str(conf)]) == 2
    filed = capsys.readouterr().err.strip()
    assert filed.endswith(flag.split("--degrade arbitrary", 1)[1]) and "--config: --degrade arbitrary" in filed
    assert not (tmp_path / "o").exists()


def test_degrader_takes_the_registry_granularities():
    for d in DEGRADATIONS.values():
        cfg = _basicsr_config(d.name)
        assert wdsr.Degrader(cfg).granularity == d.granularities[0]
        for g in {"sample", "batch"} - set(d.granularities):
            with pytest.raises(ValueError, match=f"^{d.name}: "):
                wdsr.Degrader(cfg, granularity=g)
    with pytest.raises(TypeError, match="expected a wdsr.RealESRGANConfig, wdsr.BSRGANConfig or wdsr.ArbitraryScaleConfig"):
        wdsr.Degrader(object())
    with pytest.raises(ValueError, match="degrade must be a wdsr.RealESRGANConfig, wdsr.BSRGANConfig or"):
        wdsr.DatasetConfig(degrade=object())
