"""Arbitrary-scale SR (LIIF, LTE): one float scale per batch, the LR a bicubic down-sampling of the fixed
HR patch, equal to Pillow's ``Image.resize((w, h), Image.BICUBIC)`` of the uint8 patch (LIIF's ``resize_fn``).

Parameters of one sample (``draw_params``): ``scale`` float64 [], drawn uniformly from ``scale_range``.
The Degrader uses row 0's (every LR of a batch has one size, so they stack); the other rows go unused.

:func:`pillow_bicubic` is Pillow's ``ImagingResample`` (``libImaging/Resample.c``) in torch: the same
double-precision coefficients (bicubic a = -0.5, support 2 x the down-sampling factor, each output
pixel's taps normalised to sum 1), turned into 22-bit fixed point as Pillow does, then the horizontal
pass rounded to 8 bits and the vertical pass on it. The sums are float64 matrix products of integers
below 2^31, exact in any order, so the result is Pillow's bit for bit on every device with float64."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from wdsr.degrade.config import ArbitraryScaleConfig
from wdsr.degrade.fields import check_param

Params = dict[str, torch.Tensor]
PRECISION_BITS = 22  # Pillow's fixed point for 8-bit images: 32 - 8 - 2


def lr_side(hr_side: int, scale: float) -> int:
    """The LR side of an HR side at ``scale``: ``floor(hr_side / scale + 0.5)``, the nearest integer, halves
    up (not Python's or torch's half-to-even). Nearest keeps ``hr_side / lr_side`` closest to ``scale``;
    LIIF's floor serves its cropping of the HR to ``round(lr * s)``, and our HR patch is fixed."""
    side = math.floor(hr_side / scale + 0.5)
    if side < 1:
        raise ValueError(f"an HR side of {hr_side} at scale {scale} leaves no LR pixel")
    return side


def draw_arrays(cfg: ArbitraryScaleConfig, rng: np.random.Generator, patch_size: int) -> dict[str, np.ndarray]:
    """One sample's scale, uniform on ``cfg.scale_range``, from ``rng`` (``patch_size`` a multiple of
    ``cfg.scale``: ``degrader.draw_arrays`` checks it)."""
    lr_side(patch_size, cfg.scale_range[1])  # the largest scale still leaves an LR
    return {"scale": np.array(float(rng.uniform(*cfg.scale_range)), dtype=np.float64)}


def _bicubic(x: np.ndarray) -> np.ndarray:
    """Pillow's ``bicubic_filter`` (a = -0.5), its operations in its order."""
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


@functools.lru_cache(maxsize=64)
def pillow_weights(in_size: int, out_size: int) -> np.ndarray:
    """Pillow's ``precompute_coeffs`` for BICUBIC as a dense ``[out_size, in_size]`` float64 matrix."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    center = (np.arange(out_size) + 0.5) * scale
    xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)  # C's (int) truncates
    xmax = np.minimum(np.trunc(center + support + 0.5), in_size).astype(np.int64) - xmin
    ksize = int(math.ceil(support)) * 2 + 1
    taps = np.arange(ksize)
    ss = 1.0 / filterscale
    k = np.where(taps < xmax[:, None], _bicubic((taps + xmin[:, None] - center[:, None] + 0.5) * ss), 0.0)
    ww = np.zeros(out_size)
    for x in range(ksize):  # Pillow's sequential sum, so the doubles match to the last bit
        ww = ww + k[:, x]
    k = np.where(ww[:, None] != 0.0, k / np.where(ww == 0.0, 1.0, ww)[:, None], k)
    out = np.zeros((out_size, in_size))
    cols = xmin[:, None] + taps
    keep = taps < xmax[:, None]
    out[np.nonzero(keep)[0], cols[keep]] = k[keep]
    return out


@functools.lru_cache(maxsize=64)
def pillow_fixed_weights(in_size: int, out_size: int) -> np.ndarray:
    """:func:`pillow_weights` in Pillow's 8-bit fixed point (``normalize_coeffs_8bpc``), as float64 integers."""
    k = pillow_weights(in_size, out_size) * (1 << PRECISION_BITS)
    return np.trunc(np.where(k < 0, -0.5 + k, 0.5 + k))


def _clip8(acc: torch.Tensor) -> torch.Tensor:
    """Pillow's ``clip8`` of a fixed-point sum: the 8-bit level, rounded half up (the sum starts at a half)."""
    return torch.clamp(torch.floor(acc / (1 << PRECISION_BITS)), 0, 255)


def pillow_bicubic(img: torch.Tensor, size: tuple[int, int], quantize: bool = True) -> torch.Tensor:
    """Resize ``[B, C, H, W]`` float in [0, 1] (8-bit levels / 255 when ``quantize``) to ``size`` (h, w) as
    Pillow's BICUBIC of the 8-bit image; ``quantize=False`` uses the double coefficients without the 8-bit
    rounding of either pass (Pillow's mode "F"), clamped to [0, 1]. Returns float32 on ``img``'s device."""
    h, w = size
    dev = img.device
    if not quantize:
        x = img.double()
        if w != x.shape[-1]:
            x = x @ torch.from_numpy(pillow_weights(x.shape[-1], w)).to(dev).T
        if h != x.shape[-2]:
            x = torch.from_numpy(pillow_weights(x.shape[-2], h)).to(dev) @ x
        return torch.clamp(x, 0, 1).float()
    x = torch.round(img.double() * 255.0)
    half = float(1 << (PRECISION_BITS - 1))
    if w != x.shape[-1]:  # Pillow's horizontal pass first, rounded to 8 bits
        x = _clip8(half + x @ torch.from_numpy(pillow_fixed_weights(x.shape[-1], w)).to(dev).T)
    if h != x.shape[-2]:
        x = _clip8(half + torch.from_numpy(pillow_fixed_weights(x.shape[-2], h)).to(dev) @ x)
    return (x / 255.0).float()


class ArbitraryScalePipeline(torch.nn.Module):
    """``forward(gt, p, "batch") -> (lr, hr)``: the whole batch down-sampled at row 0's scale to
    ``lr_side`` of each HR side; ``hr`` is ``gt``."""

    def __init__(self, cfg: ArbitraryScaleConfig) -> None:
        super().__init__()
        self.cfg = cfg

    def forward(self, gt: torch.Tensor, p: Params, granularity: str = "batch") -> tuple[torch.Tensor, torch.Tensor]:
        if granularity != "batch":
            raise ValueError("ArbitraryScaleConfig draws one scale per batch (LR patches of one size, to stack)")
        h, w = gt.shape[-2:]
        check_param("scale", p["scale"][:1], 1.0, max(h, w))  # >= 1: the LR is never larger than the HR
        s = float(p["scale"][0])
        return pillow_bicubic(gt, (lr_side(h, s), lr_side(w, s)), self.cfg.quantize), gt
