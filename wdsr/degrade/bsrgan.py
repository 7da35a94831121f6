"""BSRGAN's degradation (Zhang et al. 2021, ``utils_blindsr.degradation_bsrgan``) on the device, without
the camera-ISP branch: per-sample draws in numpy (the worker), the shuffled ops in torch.

Where BSRGAN calls OpenCV/SciPy on the CPU we use torch ops of the same family (documented in
docs/degrade.md): cv2.resize INTER_LINEAR/CUBIC/AREA -> F.interpolate bilinear/bicubic/area, MATLAB
bicubic -> antialiased bicubic, ``ndimage.convolve(mode='mirror')`` -> reflect-padded filter2d, cv2 JPEG
-> DiffJPEG on 8-bit levels. Its ``scipy.interpolate.interp2d`` kernel shift (removed in SciPy 1.14) is
bilinear interpolation on the regular grid: SciPy's transition guide names ``RectBivariateSpline``
(``kx=ky=1`` for linear) as the replacement; :func:`shift_kernel` computes that directly in numpy.

Parameters of one sample: ``pre_down`` int64 [] (0 none, 1-3 resize mode + 1, 4 MATLAB-like bicubic),
``order`` int64 [7], ``blur_kernel`` float32 [2, K, K], ``down2_resize`` bool [], ``down2_scale`` float64 [],
``down2_kernel`` float32 [25, 25], ``resize_mode`` int64 [2] (down2, down3), ``noise_factor`` float32 [3, 3]
(standard normal RGB draws times it = the noise), ``jpeg`` bool [], ``jpeg_quality`` float32 [2]
(shuffled, final), ``noise_seed`` int64 []."""

from __future__ import annotations

import math

import numpy as np
import torch

from wdsr.degrade import ops
from wdsr.degrade.config import SHIFT_SIZE, BSRGANConfig, check_bsrgan_patch
from wdsr.degrade.fields import check_param
from wdsr.degrade.jpeg import DiffJPEG

Params = dict[str, torch.Tensor]


def fspecial_gaussian(size: int, sigma: float) -> np.ndarray:
    """MATLAB's ``fspecial('gaussian')``: taps below eps * max set to 0, normalised."""
    r = (size - 1) / 2
    x, y = np.meshgrid(np.arange(-r, r + 1), np.arange(-r, r + 1))
    h = np.exp(-(x * x + y * y) / (2 * sigma * sigma))
    h[h < np.finfo(float).eps * h.max()] = 0
    return h / h.sum()


def anisotropic_gaussian(size: int, theta: float, l1: float, l2: float) -> np.ndarray:
    """Gaussian with covariance eigenvalues ``l1`` (along angle ``theta``) and ``l2``, normalised."""
    v = np.array([math.cos(theta), math.sin(theta)])
    basis = np.array([[v[0], v[1]], [v[1], -v[0]]])  # a reflection: its own inverse
    inv = basis @ np.diag([1 / l1, 1 / l2]) @ basis
    r = (size - 1) / 2
    d = np.stack(np.meshgrid(np.arange(size) - r, np.arange(size) - r), axis=-1)  # (x, y) per tap
    k = np.exp(-0.5 * np.einsum("...i,ij,...j->...", d, inv, d))
    return k / k.sum()


def _linear_weights(n: int, shift: float) -> np.ndarray:
    """Row j samples position clip(j + shift, 0, n - 1) of a length-n signal linearly."""
    c = np.clip(np.arange(n) + shift, 0, n - 1)
    i0 = np.minimum(np.floor(c).astype(int), n - 2)
    t = c - i0
    w = np.zeros((n, n))
    w[np.arange(n), i0] = 1 - t
    w[np.arange(n), i0 + 1] = t
    return w


def shift_kernel(k: np.ndarray, sf: int) -> np.ndarray:
    """BSRGAN's ``shift_pixel``: the kernel resampled (bilinear, clamped) at +(sf - 1)/2 px, which aligns
    a blur-and-subsample LR pixel with the centre of its sf x sf HR block."""
    shift = (sf - 1) * 0.5
    return _linear_weights(k.shape[0], shift) @ k @ _linear_weights(k.shape[1], shift).T


def _blur(rng: np.random.Generator, cfg: BSRGANConfig, sf: int, pad: int) -> np.ndarray:
    size = int(rng.choice(cfg.blur_sizes))
    if rng.uniform() < 0.5:
        wd2 = 4.0 + sf  # eigenvalues floored: BSRGAN's U(0, wd2) may draw a singular covariance
        l1, l2 = max(wd2 * rng.uniform(), 1e-3), max(wd2 * rng.uniform(), 1e-3)
        k = anisotropic_gaussian(size, rng.uniform() * math.pi, l1, l2)
    else:
        k = fspecial_gaussian(size, max((2.0 + 0.2 * sf) * rng.uniform(), 1e-3))
    p = (pad - size) // 2
    return np.pad(k, ((p, p), (p, p)))


def _noise_factor(rng: np.random.Generator, cfg: BSRGANConfig) -> np.ndarray:
    """Colour (40%), grey (40%) or channel-correlated (20%) Gaussian noise as a 3x3 factor ``F``:
    noise = z @ F for standard normal RGB draws z (the correlated case factors its covariance by SVD)."""
    level = int(rng.integers(cfg.noise_range[0], cfg.noise_range[1] + 1)) / 255.0
    u = rng.uniform()
    if u > 0.6:
        return np.eye(3) * level
    if u < 0.4:
        return np.array([[level] * 3, [0.0] * 3, [0.0] * 3])
    big = cfg.noise_range[1] / 255.0
    basis = np.linalg.svd(rng.uniform(size=(3, 3)))[0]
    cov = np.abs(big**2 * basis.T @ np.diag(rng.uniform(size=3)) @ basis)
    _, s, vh = np.linalg.svd(cov)
    return np.sqrt(s)[:, None] * vh


def draw_arrays(cfg: BSRGANConfig, rng: np.random.Generator, patch_size: int) -> dict[str, np.ndarray]:
    """One sample's BSRGAN parameters (module docstring), all from ``rng``. (numpy arrays; ``patch_size``
    a multiple of ``cfg.scale``: ``degrader.draw_arrays`` checks it)"""
    check_bsrgan_patch(cfg, patch_size)
    pad = max(max(cfg.blur_sizes), SHIFT_SIZE)
    sf, pre = cfg.scale, 0
    if sf == 4 and rng.uniform() < cfg.scale2_prob:
        pre = int(rng.integers(1, 4)) if rng.uniform() < 0.5 else 4
        sf = 2
    order = rng.permutation(7)
    i2, i3 = int(np.flatnonzero(order == 2)[0]), int(np.flatnonzero(order == 3)[0])
    if i2 > i3:  # the final down-sampling stays after the first
        order[i2], order[i3] = 3, 2
    blurs = np.stack([_blur(rng, cfg, sf, pad), _blur(rng, cfg, sf, pad)])
    shifted = shift_kernel(fspecial_gaussian(SHIFT_SIZE, rng.uniform(0.1, 0.6 * sf)), sf)
    shifted = shifted[::-1, ::-1] / shifted.sum()  # ndimage.convolve flips; filter2d correlates
    return {
        "pre_down": np.array(pre, dtype=np.int64),
        "order": order.astype(np.int64),
        "blur_kernel": blurs.astype(np.float32),
        "down2_resize": np.array(rng.uniform() < cfg.down2_prob),
        "down2_scale": np.array(rng.uniform(1.0, 2.0 * sf), dtype=np.float64),
        "down2_kernel": np.pad(shifted, (pad - SHIFT_SIZE) // 2).astype(np.float32),
        "resize_mode": rng.integers(0, 3, size=2),
        "noise_factor": _noise_factor(rng, cfg).astype(np.float32),
        "jpeg": np.array(rng.uniform() < cfg.jpeg_prob),
        "jpeg_quality": rng.integers(cfg.jpeg_range[0], cfg.jpeg_range[1] + 1, size=2).astype(np.float32),
        "noise_seed": np.array(int(rng.integers(0, 2**63 - 1)), dtype=np.int64),
    }


class BSRGANPipeline(torch.nn.Module):
    """``forward(gt, p) -> (lr, hr)`` on float ``gt`` [B, 3, H, W], sample by sample (the HR is ``gt``)."""

    def __init__(self, cfg: BSRGANConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.jpeg = DiffJPEG()

    def _jpeg8(self, x: torch.Tensor, quality: torch.Tensor) -> torch.Tensor:
        """JPEG of the 8-bit image, decoded to 8-bit levels (BSRGAN encodes and decodes uint8)."""
        return ops.clamp_round(self.jpeg(ops.clamp_round(x), quality))

    def forward(self, gt: torch.Tensor, p: Params, granularity: str = "sample") -> tuple[torch.Tensor, torch.Tensor]:
        if granularity != "sample":
            raise ValueError("BSRGAN degrades each sample on its own")
        check_param("down2_scale", p["down2_scale"], 1.0, 2.0 * self.cfg.scale)  # >= 1: it only shrinks
        return torch.cat([self._one(gt[i : i + 1], {k: v[i : i + 1] for k, v in p.items()}) for i in range(len(gt))]), gt

    def _one(self, gt: torch.Tensor, p: Params) -> torch.Tensor:
        dev, (h, w) = gt.device, gt.shape[-2:]
        x, sf = gt, self.cfg.scale
        pre = int(p["pre_down"][0])
        if pre:
            size = (h // 2, w // 2)
            if pre == 4:
                x = torch.nn.functional.interpolate(x, size=size, mode="bicubic", antialias=True)
            else:
                x = ops.resize(x, ops.RESIZE_MODES[pre - 1], size=size)
            x, sf = torch.clamp(x, 0, 1), 2
        modes = [ops.RESIZE_MODES[m] for m in p["resize_mode"][0].tolist()]
        gen = torch.Generator(device=dev).manual_seed(int(p["noise_seed"][0]))
        before = x.shape[-2:]
        for op in p["order"][0].tolist():
            if op in (0, 1):
                x = ops.filter2d(x, p["blur_kernel"][:, op].to(dev))
            elif op == 2:
                before = x.shape[-2:]
                if bool(p["down2_resize"][0]):
                    sf1 = float(p["down2_scale"][0])
                    x = ops.resize(x, modes[0], size=(int(1 / sf1 * before[0]), int(1 / sf1 * before[1])))
                else:
                    x = ops.filter2d(x, p["down2_kernel"].to(dev))[..., ::sf, ::sf]
                x = torch.clamp(x, 0, 1)
            elif op == 3:
                x = torch.clamp(ops.resize(x, modes[1], size=(int(before[0] / sf), int(before[1] / sf))), 0, 1)
            elif op == 4:
                z = torch.randn(1, *x.shape[-2:], 3, generator=gen, device=dev)
                x = torch.clamp(x + (z @ p["noise_factor"][0].to(dev)).permute(0, 3, 1, 2), 0, 1)
            elif op == 5 and bool(p["jpeg"][0]):
                x = self._jpeg8(x, p["jpeg_quality"][:, 0])
        return self._jpeg8(x, p["jpeg_quality"][:, 1])
