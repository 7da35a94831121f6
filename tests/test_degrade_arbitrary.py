"""Arbitrary-scale SR (``wdsr.degrade.ArbitraryScaleConfig``): config errors, the scale draws (KS against
uniform, fixed seeds), the LR side rule, row 0's scale for the batch, and the LR against Pillow's
``Image.resize(size, Image.BICUBIC)`` on real photos: bit-equal (LIIF's ``resize_fn`` is that resize)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import load_rgb, photos
from wdsr.degrade import ArbitraryScaleConfig, BSRGANConfig, Degrader, RealESRGANConfig, collate_params, draw_params
from wdsr.degrade.arbitrary import lr_side, pillow_bicubic

P = 96


def _batch(cfg: ArbitraryScaleConfig, hr: torch.Tensor, seeds: list[int]) -> dict[str, torch.Tensor]:
    return collate_params([draw_params(cfg, np.random.default_rng([s, 0, 7, j]), hr.shape[-1]) for j, s in enumerate(seeds)])


def _patches(pics: list[np.ndarray], n: int, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for i in range(n):
        img = pics[i % len(pics)]
        y, x = (int(v) for v in rng.integers(0, [img.shape[0] - size + 1, img.shape[1] - size + 1]))
        out.append(np.ascontiguousarray(img[y : y + size, x : x + size]))
    return out


def _chw(hwc: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(hwc).permute(2, 0, 1)


def _pil(hr: np.ndarray, h: int, w: int) -> torch.Tensor:
    return _chw(np.array(Image.fromarray(hr).resize((w, h), Image.BICUBIC))).float() / 255


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scale_range": (4.0, 1.0)}, r"scale_range must be \(low, high\) with low <= high"),
        ({"scale_range": (0.5, 4.0)}, r"scale_range must lie within \[1.0, inf\]"),
        ({"scale_range": (0.0, 2.0)}, r"scale_range must lie within \[1.0, inf\]"),
        ({"scale_range": (1.0, float("nan"))}, r"scale_range must be \(low, high\), two finite numbers"),
        ({"scale_range": (1.0,)}, r"scale_range must be \(low, high\)"),
        ({"scale_range": (1.0, 300.0)}, "goes above gt_size 192"),
        ({"scale": 4, "gt_size": 190}, "gt_size 190 must be a positive multiple of scale 4"),
        ({"scale": 0}, r"scale must be an integer in \[1, 64\], got 0"),
    ],
)
def test_bad_config_is_one_clear_error(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ArbitraryScaleConfig(**change)


def test_defaults_and_granularity() -> None:
    cfg = ArbitraryScaleConfig()
    assert (cfg.scale_range, cfg.gt_size, cfg.scale, cfg.quantize) == ((1.0, 4.0), 192, 1, True)
    assert Degrader(cfg).granularity == "batch" and Degrader(cfg, "batch").granularity == "batch"
    with pytest.raises(ValueError, match="granularity='sample' would give LR patches of many sizes"):
        Degrader(cfg, granularity="sample")
    assert Degrader(RealESRGANConfig()).granularity == "sample"
    assert Degrader(BSRGANConfig()).granularity == "sample"
    with pytest.raises(ValueError, match="granularity='batch' is Real-ESRGAN's"):
        Degrader(BSRGANConfig(), granularity="batch")


def test_draw_params_checks_the_patch() -> None:
    cfg = ArbitraryScaleConfig(scale=4, gt_size=96, scale_range=(1.0, 9.0))
    with pytest.raises(ValueError, match="patch_size 90 must be a positive multiple of scale 4"):
        draw_params(cfg, np.random.default_rng(0), 90)
    with pytest.raises(ValueError, match="an HR side of 4 at scale 9.0 leaves no LR pixel"):
        draw_params(cfg, np.random.default_rng(0), 4)


@pytest.mark.parametrize(
    ("hr", "scale", "want"),
    [
        (192, 1.0, 192),
        (192, 4.0, 48),
        (192, 3.0, 64),
        (192, 2.5, 77),  # 76.8
        (192, 3.9, 49),  # 49.23
        (93, 2.0, 47),  # 46.5: halves go up (Python's round would give 46)
        (190, 4.0, 48),  # 47.5
        (7, 4.0, 2),  # 1.75
        (1, 1.5, 1),  # 0.67
    ],
)
def test_lr_side_is_nearest_halves_up(hr: int, scale: float, want: int) -> None:
    assert lr_side(hr, scale) == want


def test_scale_draws_are_uniform_on_the_range() -> None:
    stats = pytest.importorskip("scipy.stats")
    cfg = ArbitraryScaleConfig(scale_range=(1.5, 3.5))
    s = np.array([float(draw_params(cfg, np.random.default_rng([0, 0, k, 0]), 192)["scale"]) for k in range(3000)])
    assert s.min() >= 1.5 and s.max() < 3.5
    assert stats.kstest(s, stats.uniform(loc=1.5, scale=2.0).cdf).pvalue > 1e-3
    counts, _ = np.histogram(s, bins=10, range=(1.5, 3.5))
    assert stats.chisquare(counts).pvalue > 1e-3
    # the same test rejects a draw that is not uniform (its power at this count)
    assert stats.kstest(np.sqrt(s - 1.5) * np.sqrt(2.0) + 1.5, stats.uniform(loc=1.5, scale=2.0).cdf).pvalue < 1e-6
    one = draw_params(ArbitraryScaleConfig(scale_range=(2.0, 2.0)), np.random.default_rng(1), 192)
    assert one.keys() == {"scale"} and one["scale"].dtype == torch.float64 and float(one["scale"]) == 2.0


def test_same_seed_same_params_and_lr() -> None:
    cfg = ArbitraryScaleConfig(gt_size=P)
    hr = torch.stack([_chw(p) for p in _patches(photos(), 4, P, np.random.default_rng(0))])
    a, b, c = _batch(cfg, hr, [1, 2, 3, 4]), _batch(cfg, hr, [1, 2, 3, 4]), _batch(cfg, hr, [5, 2, 3, 4])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["scale"], c["scale"])
    lr_a, hr_a = Degrader(cfg)((hr, a))
    lr_b, _ = Degrader(cfg)(hr, b)
    assert torch.equal(lr_a, lr_b) and torch.equal(hr_a, hr.float() / 255)


@pytest.mark.parametrize("scale", [1.0, 1.37, 2.0, 2.5, 3.0, 3.9, 4.0])
def test_lr_shape_at_several_scales(scale: float) -> None:
    cfg = ArbitraryScaleConfig(gt_size=P, scale_range=(scale, scale))
    hr = torch.stack([_chw(p) for p in _patches(photos(), 3, P, np.random.default_rng(1))])
    lr, out = Degrader(cfg)(hr, _batch(cfg, hr, [0, 1, 2]))
    side = lr_side(P, scale)
    assert lr.shape == (3, 3, side, side) and lr.dtype == torch.float32 and out.shape == (3, 3, P, P)
    assert float(lr.min()) >= 0 and float(lr.max()) <= 1
    assert torch.equal(torch.round(lr * 255) / 255, lr)  # 8-bit levels
    if scale == 1.0:
        assert torch.equal(lr, out)


def test_the_batch_takes_row_0s_scale() -> None:
    cfg = ArbitraryScaleConfig(gt_size=P, scale_range=(1.0, 4.0))
    pics = _patches(photos(), 4, P, np.random.default_rng(2))
    hr = torch.stack([_chw(p) for p in pics])
    params = {"scale": torch.tensor([3.0, 1.5, 2.0, 4.0], dtype=torch.float64)}
    lr, _ = Degrader(cfg)(hr, params)
    assert lr.shape[-2:] == (32, 32)
    for i, p in enumerate(pics):  # every row at row 0's size, as Pillow resizes it alone
        assert torch.equal(lr[i], _pil(p, 32, 32))
    perm = [1, 0, 2, 3]
    lr2, _ = Degrader(cfg)(hr[perm], {"scale": params["scale"][perm]})
    assert lr2.shape[-2:] == (64, 64)


def _refdata_photos(refdata: Path) -> list[np.ndarray]:
    paths = sorted((refdata / "set5" / "HR").glob("*.png")) + [refdata / "matlab_bicubic" / "baboon.png"]
    return [load_rgb(p) for p in paths]


def test_lr_equals_pillow_bicubic_on_real_photos(refdata: Path) -> None:
    """Bound: 0 (``torch.equal``) on 120 patches of Set5, baboon and scikit-image's photos at U(1, 4)
    scales. The premise that this is LIIF's LR: its ``ToPILImage`` (``mul(255).byte()``, truncating) of
    ``ToTensor``'s k / 255 gives back k for every level, so ``resize_fn`` resizes the uint8 patch itself."""
    levels = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(levels.float().div(255).mul(255).byte(), levels)
    rng = np.random.default_rng(3)
    pics = _patches(_refdata_photos(refdata) + photos(), 120, P, rng)
    deg = Degrader(ArbitraryScaleConfig(gt_size=P))
    for n, p in enumerate(pics):
        s = float(rng.uniform(1.0, 4.0))
        lr, _ = deg(_chw(p)[None], {"scale": torch.tensor([s], dtype=torch.float64)})
        side = lr_side(P, s)
        assert torch.equal(lr[0], _pil(p, side, side)), (n, s)


def test_non_square_patches_resize_per_axis(refdata: Path) -> None:
    img = _refdata_photos(refdata)[-1][:120, :200]  # baboon; Pillow skips the pass of an unchanged axis
    hr = _chw(np.ascontiguousarray(img))[None]
    for s in (1.0, 2.3, 3.0):
        lr, _ = Degrader(ArbitraryScaleConfig(gt_size=P))(hr, {"scale": torch.tensor([s], dtype=torch.float64)})
        assert torch.equal(lr[0], _pil(img, lr_side(120, s), lr_side(200, s)))
    lr = pillow_bicubic(hr.float() / 255, (120, 57))  # only the horizontal pass
    assert torch.equal(lr[0], _pil(img, 120, 57))


def test_float_lr_is_pillows_mode_f(refdata: Path) -> None:
    """``quantize=False``: Pillow's float ("F") resize of each channel, clamped to [0, 1], within float32
    rounding (Pillow keeps its horizontal pass in float32, we in float64)."""
    p = _patches(_refdata_photos(refdata), 1, P, np.random.default_rng(4))[0]
    cfg = ArbitraryScaleConfig(gt_size=P, quantize=False)
    lr, _ = Degrader(cfg)(_chw(p)[None], {"scale": torch.tensor([2.7], dtype=torch.float64)})
    side = lr_side(P, 2.7)
    chans = [Image.fromarray(p[..., c].astype(np.float32) / 255, mode="F").resize((side, side), Image.BICUBIC) for c in range(3)]
    ref = np.clip(np.stack([np.asarray(c) for c in chans]), 0, 1)
    np.testing.assert_allclose(lr[0].numpy(), ref, rtol=0, atol=1e-6)
    assert not torch.equal(torch.round(lr * 255) / 255, lr)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_equals_cpu() -> None:
    cfg = ArbitraryScaleConfig(gt_size=P)
    hr = torch.stack([_chw(p) for p in _patches(photos(), 8, P, np.random.default_rng(5))])
    params = _batch(cfg, hr, list(range(8)))
    lr_cpu, _ = Degrader(cfg)(hr, params)
    lr_gpu, _ = Degrader(cfg).to("cuda")(hr, params)
    assert lr_gpu.device.type == "cuda" and torch.equal(lr_gpu.cpu(), lr_cpu)
