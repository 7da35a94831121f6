"""LR made per patch (issue 28): `shardmaker build --hr-only` stores HR alone and
`SRDataset(lr="bicubic")` makes each LR patch from its HR patch and a margin, MATLAB-exactly: the
batches are byte-identical to those of the same images built with stored MATLAB LR, for x2, x3 and
x4, both MATLAB methods, with patches that touch the images' borders."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import wdsr
from shardmaker import format as fmt
from tests.helpers import build_shards, mosaic, photos, save


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("bicubic-src")
    for i, p in enumerate(photos()):
        # small images, sides no scale divides: many patches touch the borders and the mod-crop
        save(root / f"p{i}.png", np.ascontiguousarray(p[: 97 + 13 * i, : 131 - 7 * i]))
    save(root / "grey.png", np.ascontiguousarray(mosaic(101, 119)[..., 1]))
    return root


def _batches(url, scale, **kw):
    ds = wdsr.SRDataset(str(url), scale=scale, patch_size=12 * scale, patches_per_image=6, batch_size=4, shuffle_buffer=8,
                        seed=4, return_keys=True, **kw)
    return [(lr.clone(), hr.clone(), keys) for lr, hr, keys in wdsr.make_loader(ds, num_workers=0)]


def _same(a, b) -> bool:
    return len(a) == len(b) > 0 and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2] == y[2] for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("method,mode", [("matlab", "bicubic"), ("matlab-uint8", "bicubic-uint8")])
def test_hr_only_bicubic_equals_stored_matlab_lr(sources, tmp_path, method, mode):
    src = tmp_path / "rgb"
    src.mkdir()
    for p in sources.glob("p*.png"):
        (src / p.name).write_bytes(p.read_bytes())
    stored = build_shards(src, tmp_path / "stored", "--scale", "2,3,4", "--lr-method", method)
    hr_only = build_shards(src, tmp_path / "hr", "--hr-only")
    m = fmt.load(str(hr_only))
    assert m.scales == [] and m.lr_method == "none"
    with open(hr_only / m.shards[0].name, "rb") as f:
        _, _, members = next(fmt.iter_samples(f))
    assert set(members) == {"json", "hr.png"} and json.loads(members["json"])["scales"] == []
    for scale in (2, 3, 4):
        want = _batches(stored, scale)
        assert _same(_batches(hr_only, scale, lr=mode), want), f"x{scale}"
        assert _same(_batches(stored, scale, lr=mode), want)  # made from the HR of a dataset with stored LR: the same
    with pytest.raises(ValueError, match="HR-only dataset .* lr='bicubic'"):
        wdsr.SRDataset(str(hr_only), scale=4, patch_size=48)
    assert _batches(hr_only, 5, lr=mode)[0][0].shape[1:] == (3, 12, 12)  # any integer scale


def test_grey_and_flat_patch_rejection(sources, tmp_path):
    src = tmp_path / "grey"
    src.mkdir()
    (src / "grey.png").write_bytes((sources / "grey.png").read_bytes())
    stored = build_shards(src, tmp_path / "stored", "--scale", "3")
    hr_only = build_shards(src, tmp_path / "hr", "--hr-only")
    kw = dict(min_patch_std=40.0, max_tries=5)
    want = _batches(stored, 3, **kw)
    assert _same(_batches(hr_only, 3, lr="bicubic", **kw), want)


def test_bad_options(sources):
    with pytest.raises(ValueError, match="lr must be one of stored, bicubic, bicubic-uint8"):
        wdsr.SRDataset(str(sources), scale=4, lr="area")
    with pytest.raises(ValueError, match=r"got 'degrade' \(degrade=wdsr.RealESRGANConfig\(\) makes LR on the device\)"):
        wdsr.DatasetConfig(lr="degrade")  # the device's LR is asked for with degrade=, not lr=
    with pytest.raises(ValueError, match="lr must be one of stored, bicubic, bicubic-uint8, got 4"):
        wdsr.DatasetConfig(lr=4)


def test_lr_is_an_enum_that_takes_the_strings_users_pass():
    from wdsr.pipeline.sample import LrMode

    assert wdsr.DatasetConfig().lr is LrMode.STORED
    for text in ("stored", "bicubic", "bicubic-uint8"):
        got = wdsr.DatasetConfig(lr=text).lr
        assert got is LrMode(text) and got == text and got.value == text
    assert wdsr.DatasetConfig(lr=LrMode.BICUBIC_UINT8).lr is LrMode.BICUBIC_UINT8
