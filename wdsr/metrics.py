"""PSNR and SSIM on the Y channel, as SR papers report them.

Y is ITU-R BT.601 luma in MATLAB's ``rgb2ycbcr`` convention, ``16 + (65.481 R + 128.553 G +
24.966 B) / 255`` for RGB in [0, 255], not rounded; ``crop_border`` pixels (= the scale) are cut
from every side; SSIM is Wang et al.'s with an 11x11 Gaussian window (sigma 1.5), "valid" borders.
"""

from __future__ import annotations

import numpy as np
import torch

_Y = np.array([65.481, 128.553, 24.966]) / 255.0


def _as_hwc_float(img: np.ndarray | torch.Tensor) -> np.ndarray:
    """HxWxC / CxHxW / 1xCxHxW, uint8 [0,255] or float [0,1] or float [0,255] -> float64 HxWxC in [0,255]."""
    if isinstance(img, torch.Tensor):
        t = img.detach().cpu()
        if t.ndim == 4:
            if t.shape[0] != 1:
                raise ValueError(f"expected one image, got a batch of {t.shape[0]}")
            t = t[0]
        if t.ndim == 3 and t.shape[0] in (1, 3):
            t = t.permute(1, 2, 0)
        arr = t.numpy()
    else:
        arr = np.asarray(img)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.dtype == np.uint8:
        return arr.astype(np.float64)
    if arr.dtype == np.uint16:
        return arr.astype(np.float64) / 257.0
    arr = arr.astype(np.float64)
    return arr * 255.0 if arr.max() <= 1.0 + 1e-6 else arr


def to_y(img: np.ndarray | torch.Tensor) -> np.ndarray:
    """Luma Y in [16, 235] (float64, not rounded) of an RGB image; grey images pass through."""
    a = _as_hwc_float(img)
    if a.shape[2] == 1:
        return a[:, :, 0]
    return 16.0 + a[:, :, :3] @ _Y


def _prepare(sr: np.ndarray | torch.Tensor, hr: np.ndarray | torch.Tensor, crop_border: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = to_y(sr), to_y(hr)
    if a.shape != b.shape:
        raise ValueError(f"SR {a.shape} and HR {b.shape} differ in size")
    if crop_border:
        a, b = a[crop_border:-crop_border, crop_border:-crop_border], b[crop_border:-crop_border, crop_border:-crop_border]
    return a, b


def psnr_y(sr: np.ndarray | torch.Tensor, hr: np.ndarray | torch.Tensor, crop_border: int = 0) -> float:
    a, b = _prepare(sr, hr, crop_border)
    mse = float(np.mean((a - b) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0**2 / mse)


def _gaussian_valid(x: np.ndarray, win: np.ndarray) -> np.ndarray:
    """Separable 'valid' filtering with a 1-D window (outer product = the 2-D Gaussian)."""
    n = len(win)
    rows = sum(win[i] * x[i : x.shape[0] - n + 1 + i] for i in range(n))
    return sum(win[i] * rows[:, i : x.shape[1] - n + 1 + i] for i in range(n))


def ssim_y(sr: np.ndarray | torch.Tensor, hr: np.ndarray | torch.Tensor, crop_border: int = 0) -> float:
    a, b = _prepare(sr, hr, crop_border)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    g = np.exp(-((np.arange(11) - 5) ** 2) / (2 * 1.5**2))
    g /= g.sum()
    mu_a, mu_b = _gaussian_valid(a, g), _gaussian_valid(b, g)
    saa = _gaussian_valid(a * a, g) - mu_a**2
    sbb = _gaussian_valid(b * b, g) - mu_b**2
    sab = _gaussian_valid(a * b, g) - mu_a * mu_b
    ssim_map = ((2 * mu_a * mu_b + c1) * (2 * sab + c2)) / ((mu_a**2 + mu_b**2 + c1) * (saa + sbb + c2))
    return float(ssim_map.mean())
