"""Degradation ops on float32 ``[B, C, H, W]`` batches in [0, 1], on any device.

Every random draw comes from an explicit ``torch.Generator`` (or an explicit noise tensor), never the
global RNG. The arithmetic of each op is ordered like the Real-ESRGAN/BasicSR function it reproduces
(named per function), so on CPU the results are ``torch.equal`` to theirs given the same draws."""

from __future__ import annotations

import math

import cv2
import numpy as np
import torch
import torch.nn.functional as F

RESIZE_MODES = ("area", "bilinear", "bicubic")  # the modes Real-ESRGAN draws from, by index


def filter2d(img: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Correlate each image with its own odd ``k x k`` kernel (``kernel`` ``[B, k, k]``, or ``[1, k, k]``
    shared), reflect-padded so the size is kept; as ``basicsr.utils.img_process_util.filter2D``."""
    k = kernel.shape[-1]
    if k % 2 != 1 or kernel.shape[-2] != k:
        raise ValueError(f"filter2d needs square odd kernels, got {tuple(kernel.shape)}")
    b, c, h, w = img.shape
    if kernel.shape[0] not in (1, b):
        raise ValueError(f"filter2d: {kernel.shape[0]} kernels for a batch of {b}")
    x = F.pad(img, (k // 2, k // 2, k // 2, k // 2), mode="reflect")
    ph, pw = x.shape[-2:]
    kernel = kernel.to(img.dtype)
    if kernel.shape[0] == 1:
        return F.conv2d(x.reshape(b * c, 1, ph, pw), kernel.view(1, 1, k, k)).view(b, c, h, w)
    weight = kernel.view(b, 1, k, k).repeat(1, c, 1, 1).view(b * c, 1, k, k)
    return F.conv2d(x.reshape(1, b * c, ph, pw), weight, groups=b * c).view(b, c, h, w)


def gaussian_kernel2d(size: int, sigma: float = 0.0) -> np.ndarray:
    """OpenCV's separable Gaussian (``cv2.getGaussianKernel``: sigma 0 derives it from the size), as the
    outer product of the 1-D kernel with itself, float64."""
    g = cv2.getGaussianKernel(size, sigma)
    return np.dot(g, g.T)


class USMSharp(torch.nn.Module):
    """Unsharp masking with a soft threshold mask (Real-ESRGAN's GT sharpening): where the residual
    ``img - blur`` exceeds ``threshold``/255, blend in ``clip(img + weight * residual)``."""

    kernel: torch.Tensor

    def __init__(self, radius: int = 50, sigma: float = 0.0) -> None:
        super().__init__()
        radius += 1 - radius % 2  # an even radius becomes the next odd size
        kernel = torch.from_numpy(gaussian_kernel2d(radius, sigma)).float().unsqueeze(0)
        self.register_buffer("kernel", kernel, persistent=False)

    def _blur(self, img: torch.Tensor) -> torch.Tensor:
        # the shared kernel given per sample takes the depthwise path: ~5x faster on CPU than BasicSR's
        # shared-kernel call, and bit-equal to it (tests/test_degrade_equivalence.py::test_usm_equal)
        return filter2d(img, self.kernel.expand(img.shape[0], -1, -1))

    def forward(self, img: torch.Tensor, weight: float = 0.5, threshold: float = 10) -> torch.Tensor:
        blur = self._blur(img)
        residual = img - blur
        mask = (torch.abs(residual) * 255 > threshold).float()
        soft = self._blur(mask)
        sharp = torch.clip(img + weight * residual, 0, 1)
        return soft * sharp + (1 - soft) * img


def resize(img: torch.Tensor, mode: str, *, scale: float | None = None, size: tuple[int, int] | None = None) -> torch.Tensor:
    """``F.interpolate`` as Real-ESRGAN calls it: by ``scale`` (the kernel then uses ``1/scale`` itself,
    not out/in) or to ``size``; ``area`` is adaptive average pooling, the others ``align_corners=False``."""
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize mode must be one of {RESIZE_MODES}, got {mode!r}")
    if (scale is None) == (size is None):
        raise ValueError("resize takes exactly one of scale= and size=")
    if scale is not None:
        return F.interpolate(img, scale_factor=scale, mode=mode)
    return F.interpolate(img, size=size, mode=mode)


def rgb_to_gray(img: torch.Tensor) -> torch.Tensor:
    """ITU-R 601-2 luma with torchvision's weights (0.2989, 0.587, 0.114): ``[B, 3, H, W] -> [B, 1, H, W]``."""
    r, g, b = img.unbind(dim=-3)
    return (0.2989 * r + 0.587 * g + 0.114 * b).to(img.dtype).unsqueeze(-3)


def normal_draws(
    img: torch.Tensor, gray: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Standard normal draws for :func:`gaussian_noise` in Real-ESRGAN's order: one ``[H, W]`` grey map
    (shared by the batch, as ``generate_gaussian_noise_pt`` draws it) only when some sample is grey, then
    the colour noise ``[B, C, H, W]``."""
    b, c, h, w = img.shape
    gray_map = None
    if bool((gray > 0).any()):
        gray_map = torch.randn(h, w, generator=generator, dtype=img.dtype, device=img.device).expand(b, 1, h, w)
    return torch.randn(b, c, h, w, generator=generator, dtype=img.dtype, device=img.device), gray_map


def gaussian_noise(
    img: torch.Tensor, sigma: torch.Tensor, gray: torch.Tensor, color: torch.Tensor, gray_map: torch.Tensor | None
) -> torch.Tensor:
    """``img`` plus ``N(0, sigma/255)`` noise made from given standard normal draws, clamped to [0, 1]:
    per sample, sigma ``[B]`` (in 0-255 units) and ``gray`` ``[B]`` (1: the grey map on every channel)."""
    b = img.shape[0]
    sig = sigma.to(img).view(b, 1, 1, 1)
    noise = color * sig / 255.0
    if gray_map is not None:
        noise = torch.where(gray.to(img.device).view(b, 1, 1, 1) > 0, gray_map * sig / 255.0, noise)
    return torch.clamp(img + noise, 0, 1)


def _shot(img: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Poisson noise of an image quantised to 8 bits, with per-sample photon levels 2^ceil(log2(#levels))."""
    q = torch.clamp((img * 255.0).round(), 0, 255) / 255.0
    levels = [2.0 ** math.ceil(math.log2(len(torch.unique(q[i])))) for i in range(q.shape[0])]
    vals = q.new_tensor(levels).view(-1, 1, 1, 1)
    return torch.poisson(q * vals, generator=generator) / vals - q


def poisson_noise(img: torch.Tensor, scale: torch.Tensor, gray: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``img`` plus shot noise times ``scale`` ``[B]``, grey where ``gray`` ``[B]`` is 1, clamped to [0, 1];
    the draws in ``generate_poisson_noise_pt``'s order (grey first, only when some sample is grey)."""
    b, _, h, w = img.shape
    g = gray.to(img.device).view(b, 1, 1, 1)
    gray_noise = _shot(rgb_to_gray(img), generator).expand(b, 3, h, w) if bool((g > 0).any()) else None
    noise = _shot(img, generator)
    if gray_noise is not None:
        noise = torch.where(g > 0, gray_noise, noise)
    return torch.clamp(img + noise * scale.to(img).view(b, 1, 1, 1), 0, 1)


def clamp_round(img: torch.Tensor) -> torch.Tensor:
    """Quantise to 8-bit levels and back to float, as an 8-bit LR image would be stored."""
    return torch.clamp((img * 255.0).round(), 0, 255) / 255.0
