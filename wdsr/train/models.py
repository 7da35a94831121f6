"""The reference SR models of ``wdsr train``: EDSR-baseline and ESPCN for images, TinyVSR for clips.

All take float input in [0, 1] (``wdsr.to_float``) of ``channels`` (3 or 1) and return it
``scale`` times larger; pixel shuffle does the upsampling, as in the papers. The image models map
``[B, C, h, w]``; TinyVSR maps ``[B, T, C, h, w]`` clips (BasicSR's video models come through its
integration, not here).
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
    TINYVSR = "tinyvsr"

    @property
    def video(self) -> bool:
        """Trained on clip datasets (windows of frames), not on image patches."""
        return self is ModelName.TINYVSR


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


class TinyVSR(nn.Module):
    """A small BasicVSR-like model (Chan et al. 2021) without optical flow: per-frame features are
    propagated backward, then forward, through the T frames (each step a conv of [frame, state]
    and a res block), the two directions fused per frame and pixel-shuffled up, plus the bilinearly
    upsampled frame. ``[B, T, C, h, w]`` -> ``[B, T, C, H, W]``; with ``center``, only the centre
    frame's output ``[B, C, H, W]`` (EDVR-style windows: T frames in, the middle one out). The
    weights are the same either way. A ``[B, C, h, w]`` input is a clip of one frame."""

    def __init__(self, scale: int, channels: int = 3, width: int = 8, center: bool = False) -> None:
        super().__init__()
        self.scale, self.width, self.center = scale, width, center
        self.head = nn.Conv2d(channels, width, 3, padding=1)  # first: wdsr upscale reads the channels here
        self.backward_step = nn.Sequential(nn.Conv2d(2 * width, width, 3, padding=1), nn.LeakyReLU(0.1), _ResBlock(width))
        self.forward_step = nn.Sequential(nn.Conv2d(2 * width, width, 3, padding=1), nn.LeakyReLU(0.1), _ResBlock(width))
        self.fuse = nn.Sequential(nn.Conv2d(2 * width, width, 1), nn.LeakyReLU(0.1))
        self.up = nn.Sequential(nn.Conv2d(width, channels * scale * scale, 3, padding=1), nn.PixelShuffle(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 4:
            one = self.forward(x[:, None])
            return one if self.center else one[:, 0]
        if x.ndim != 5:
            raise ValueError(f"TinyVSR takes clips [B, T, C, h, w], got a tensor of shape {tuple(x.shape)}")
        b, t, c, h, w = x.shape
        feats = nn.functional.leaky_relu(self.head(x.flatten(0, 1)), 0.1).view(b, t, self.width, h, w)
        state = feats.new_zeros(b, self.width, h, w)
        back: list[torch.Tensor] = [state] * t
        for i in reversed(range(t)):
            state = back[i] = self.backward_step(torch.cat([feats[:, i], state], 1))
        state = feats.new_zeros(b, self.width, h, w)
        fwd: list[torch.Tensor] = []
        for i in range(t):
            state = self.forward_step(torch.cat([feats[:, i], state], 1))
            fwd.append(state)
        keep = [t // 2] if self.center else list(range(t))  # the centre frame still sees all T through both states
        both = torch.cat([torch.stack([fwd[i] for i in keep], 1), torch.stack([back[i] for i in keep], 1)], 2)
        fused = self.fuse(both.flatten(0, 1))
        frames = x[:, keep].flatten(0, 1)
        base = nn.functional.interpolate(frames, scale_factor=self.scale, mode="bilinear", align_corners=False)
        out = (self.up(fused) + base).view(b, len(keep), c, h * self.scale, w * self.scale)
        return out[:, 0] if self.center else out


def build_model(name: ModelName | str, scale: int, channels: int = 3, center: bool = False) -> nn.Module:
    """The model ``name`` x``scale``; ``center``: a video model predicts the centre frame of its window only."""
    name = ModelName(name)
    if scale < 2:
        raise ValueError(f"scale must be >= 2, got {scale}")
    if name is ModelName.EDSR_BASELINE:
        return EDSR(scale, channels)
    if name is ModelName.TINYVSR:
        return TinyVSR(scale, channels, center=center)
    return ESPCN(scale, channels)
