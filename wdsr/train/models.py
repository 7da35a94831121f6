"""The two reference SR models of ``wdsr train``: EDSR-baseline and ESPCN, in a few lines each.

Both take float input in [0, 1] (``wdsr.to_float``) of ``channels`` (3 or 1) and return the
image ``scale`` times larger; pixel shuffle does the upsampling, as in the papers.
"""

from __future__ import annotations

import enum

import torch
from torch import nn

# DIV2K's RGB mean (EDSR subtracts it before the first conv and adds it back at the end)
_DIV2K_MEAN = (0.4488, 0.4371, 0.4040)


class ModelName(str, enum.Enum):
    EDSR_BASELINE = "edsr-baseline"
    ESPCN = "espcn"


class _ResBlock(nn.Module):
    def __init__(self, ch: int, res_scale: float = 1.0) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(ch, ch, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(ch, ch, 3, padding=1))
        self.res_scale = res_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) * self.res_scale


def _upsampler(ch: int, scale: int) -> nn.Sequential:
    """x2 stages for powers of two (EDSR's layout), one stage otherwise."""
    layers: list[nn.Module] = []
    if scale & (scale - 1) == 0:
        for _ in range(scale.bit_length() - 1):
            layers += [nn.Conv2d(ch, 4 * ch, 3, padding=1), nn.PixelShuffle(2)]
    else:
        layers += [nn.Conv2d(ch, scale * scale * ch, 3, padding=1), nn.PixelShuffle(scale)]
    return nn.Sequential(*layers)


class EDSR(nn.Module):
    """EDSR (Lim et al. 2017); the defaults are its baseline: 16 res blocks of 64 channels, no res scaling."""

    mean: torch.Tensor

    def __init__(self, scale: int, channels: int = 3, blocks: int = 16, width: int = 64, res_scale: float = 1.0) -> None:
        super().__init__()
        mean = _DIV2K_MEAN if channels == 3 else (sum(_DIV2K_MEAN) / 3,) * channels
        self.register_buffer("mean", torch.tensor(mean).view(1, channels, 1, 1), persistent=False)
        self.head = nn.Conv2d(channels, width, 3, padding=1)
        self.body = nn.Sequential(*[_ResBlock(width, res_scale) for _ in range(blocks)], nn.Conv2d(width, width, 3, padding=1))
        self.tail = nn.Sequential(_upsampler(width, scale), nn.Conv2d(width, channels, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(x - self.mean)
        return self.tail(x + self.body(x)) + self.mean


class ESPCN(nn.Module):
    """ESPCN (Shi et al. 2016): three convs on the LR grid (tanh), then one pixel shuffle."""

    def __init__(self, scale: int, channels: int = 3) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, 64, 5, padding=2),
            nn.Tanh(),
            nn.Conv2d(64, 32, 3, padding=1),
            nn.Tanh(),
            nn.Conv2d(32, channels * scale * scale, 3, padding=1),
            nn.PixelShuffle(scale),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def build_model(name: ModelName | str, scale: int, channels: int = 3) -> nn.Module:
    name = ModelName(name)
    if scale < 2:
        raise ValueError(f"scale must be >= 2, got {scale}")
    if name is ModelName.EDSR_BASELINE:
        return EDSR(scale, channels)
    return ESPCN(scale, channels)
