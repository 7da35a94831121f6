"""The pieces that make a built-in model start as bicubic: MATLAB's bicubic upsampling as a fixed
convolution (the global skip), and ICNR initialisation of sub-pixel convolutions.

``MatlabBicubic`` is ``imresize(x, s, 'bicubic')`` for an integer ``s`` (Keys a=-0.5, mirrored
borders), the method Set5/DIV2K's LR were made with and the bicubic baseline of every SR paper: each
of the ``s*s`` output phases is a fixed 5x5 filter of the LR, so it is one grouped conv and a pixel
shuffle. It has no parameters (its filters are a non-persistent buffer) and always runs in float32.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def _cubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic with a=-0.5, MATLAB's ``cubic``."""
    ax = np.abs(x)
    near = (1.5 * ax**3 - 2.5 * ax**2 + 1) * (ax <= 1)
    far = (-0.5 * ax**3 + 2.5 * ax**2 - 4 * ax + 2) * ((ax > 1) & (ax <= 2))
    return near + far


def phase_weights(scale: int) -> np.ndarray:
    """``[scale, 5]``: the weights of LR pixels ``k-2..k+2`` for HR pixel ``scale*k + p`` (row ``p``).

    MATLAB maps HR pixel ``i`` (0-based) to LR position ``(i + 0.5) / scale - 0.5``."""
    offsets = (np.arange(scale) + 0.5) / scale - 0.5
    w = _cubic(offsets[:, None] - np.arange(-2, 3)[None, :])
    return w / w.sum(1, keepdims=True)


def _pad_symmetric(x: torch.Tensor, pad: int) -> torch.Tensor:
    """Mirror ``pad`` pixels on each side of H and W, the edge pixel repeated (MATLAB's 'symmetric')."""
    if min(x.shape[-2:]) < pad:
        return nn.functional.pad(x, (pad,) * 4, mode="replicate")
    x = torch.cat([x[..., :pad, :].flip(-2), x, x[..., -pad:, :].flip(-2)], -2)
    return torch.cat([x[..., :pad].flip(-1), x, x[..., -pad:].flip(-1)], -1)


class MatlabBicubic(nn.Module):
    """``[B, C, h, w]`` -> ``[B, C, s*h, s*w]``, MATLAB's bicubic upsampling, in float32."""

    weight: torch.Tensor

    def __init__(self, scale: int, channels: int) -> None:
        super().__init__()
        w = phase_weights(scale)
        per_phase = np.einsum("pi,qj->pqij", w, w).reshape(scale * scale, 1, 5, 5)  # phase (py, px) -> 5x5 filter
        weight = torch.from_numpy(np.tile(per_phase, (channels, 1, 1, 1))).float()
        self.register_buffer("weight", weight, persistent=False)
        self.scale, self.channels = scale, channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            y = nn.functional.conv2d(_pad_symmetric(x.float(), 2), self.weight, groups=self.channels)
            return nn.functional.pixel_shuffle(y, self.scale)


@torch.no_grad()
def icnr_(conv: nn.Conv2d, scale: int) -> None:
    """ICNR (Aitken et al. 2017): the conv before a ``PixelShuffle(scale)`` starts as a kaiming-initialised
    conv followed by nearest upsampling, so its output has no checkerboard: the ``scale**2`` sub-pixel
    outputs of each channel start with the same weights."""
    out = conv.out_channels // (scale * scale)
    sub = torch.empty(out, *conv.weight.shape[1:])
    nn.init.kaiming_normal_(sub, nonlinearity="relu")
    conv.weight.copy_(sub.repeat_interleave(scale * scale, dim=0))
    if conv.bias is not None:
        conv.bias.zero_()


@torch.no_grad()
def zero_(conv: nn.Conv2d) -> None:
    """The last conv of a residual branch: zero, so the branch adds nothing until training moves it."""
    conv.weight.zero_()
    if conv.bias is not None:
        conv.bias.zero_()
