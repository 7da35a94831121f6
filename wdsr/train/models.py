"""The reference SR models of ``wdsr train``: EDSR-baseline and ESPCN for images, TinyVSR for clips.

All take float input in [0, 1] (``wdsr.to_float``) of ``channels`` (3 or 1) and return it
``scale`` times larger; pixel shuffle does the upsampling, as in the papers. The image models map
``[B, C, h, w]``; TinyVSR maps ``[B, T, C, h, w]`` clips (BasicSR's video models come through its
integration, not here).

The image models come in two variants (``Residual``), recorded as ``residual`` in a checkpoint's
config: ``bicubic`` (what ``wdsr train`` builds) adds the network's output to MATLAB's bicubic
upsampling of the input, with the residual branch's last conv zeroed (a fresh model *is* bicubic),
sub-pixel convs ICNR-initialised (no checkerboard) and replicate padding (no dark frame);
``none`` is the papers' plain network, which checkpoints without the field hold.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from wdsr.train.upsample import MatlabBicubic, icnr_, zero_

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


class Residual(str, enum.Enum):
    """What an image model adds its network's output to: nothing (the papers; checkpoints without the
    field) or MATLAB's bicubic upsampling of its input (``wdsr train`` since the field exists)."""

    NONE = "none"
    BICUBIC = "bicubic"

    @property
    def padding(self) -> Literal["zeros", "replicate"]:
        return "zeros" if self is Residual.NONE else "replicate"


def residual_of(config: Mapping[str, Any], where: str) -> Residual:
    """The variant a checkpoint's (or run.json's) config records; absent: ``none``, the models of older runs."""
    value = config.get("residual", Residual.NONE.value)
    try:
        return Residual(value)
    except ValueError:
        known = ", ".join(r.value for r in Residual)
        raise ValueError(f"{where}: unknown model variant residual={str(value)[:40]!r} (known: {known})") from None


def _conv(cin: int, cout: int, k: int, padding_mode: Literal["zeros", "replicate"] = "zeros") -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, padding=k // 2, padding_mode=padding_mode)


class _ResBlock(nn.Module):
    def __init__(self, ch: int, res_scale: float = 1.0, padding_mode: Literal["zeros", "replicate"] = "zeros") -> None:
        super().__init__()
        conv1, conv2 = _conv(ch, ch, 3, padding_mode), _conv(ch, ch, 3, padding_mode)
        self.body = nn.Sequential(conv1, nn.ReLU(inplace=True), conv2)
        self.res_scale = res_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) * self.res_scale


def _upsampler(ch: int, scale: int, residual: Residual = Residual.NONE) -> nn.Sequential:
    """x2 stages for powers of two (EDSR's layout), one stage otherwise; ICNR-initialised in the bicubic variant."""
    stages = [2] * (scale.bit_length() - 1) if scale & (scale - 1) == 0 else [scale]
    layers: list[nn.Module] = []
    for r in stages:
        conv = _conv(ch, r * r * ch, 3, residual.padding)
        if residual is Residual.BICUBIC:
            icnr_(conv, r)
        layers += [conv, nn.PixelShuffle(r)]
    return nn.Sequential(*layers)


def _skip(scale: int, channels: int, residual: Residual) -> MatlabBicubic | None:
    return MatlabBicubic(scale, channels) if residual is Residual.BICUBIC else None


class EDSR(nn.Module):
    """EDSR (Lim et al. 2017); the defaults are its baseline: 16 res blocks of 64 channels, no res scaling.
    ``residual``: see the module's docstring (the state dict's keys are the same either way)."""

    mean: torch.Tensor

    def __init__(
        self,
        scale: int,
        channels: int = 3,
        blocks: int = 16,
        width: int = 64,
        res_scale: float = 1.0,
        residual: Residual = Residual.NONE,
    ) -> None:
        super().__init__()
        mean = _DIV2K_MEAN if channels == 3 else (sum(_DIV2K_MEAN) / 3,) * channels
        self.register_buffer("mean", torch.tensor(mean).view(1, channels, 1, 1), persistent=False)
        pad = residual.padding
        self.head = _conv(channels, width, 3, pad)
        self.body = nn.Sequential(*[_ResBlock(width, res_scale, pad) for _ in range(blocks)], _conv(width, width, 3, pad))
        last = _conv(width, channels, 3, pad)
        self.tail = nn.Sequential(_upsampler(width, scale, residual), last)
        self.skip = _skip(scale, channels, residual)
        if self.skip is not None:
            zero_(last)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.head(x - self.mean)
        out = self.tail(feat + self.body(feat))
        return out + self.mean if self.skip is None else out + self.skip(x)


class ESPCN(nn.Module):
    """ESPCN (Shi et al. 2016): three convs on the LR grid (tanh), then one pixel shuffle. ``residual``: see
    the module's docstring; the bicubic variant also centres its input on DIV2K's mean."""

    mean: torch.Tensor

    def __init__(self, scale: int, channels: int = 3, residual: Residual = Residual.NONE) -> None:
        super().__init__()
        pad = residual.padding
        subpixel = _conv(32, channels * scale * scale, 3, pad)
        self.body = nn.Sequential(
            _conv(channels, 64, 5, pad), nn.Tanh(), _conv(64, 32, 3, pad), nn.Tanh(), subpixel, nn.PixelShuffle(scale)
        )
        self.skip = _skip(scale, channels, residual)
        mean = (0.0,) * channels if self.skip is None else _DIV2K_MEAN if channels == 3 else (sum(_DIV2K_MEAN) / 3,)
        self.register_buffer("mean", torch.tensor(mean).view(1, channels, 1, 1), persistent=False)
        if self.skip is not None:
            zero_(subpixel)  # zero is ICNR too (all sub-pixel phases equal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x - self.mean)
        return out if self.skip is None else out + self.skip(x)


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


def build_model(
    name: ModelName | str,
    scale: int,
    channels: int = 3,
    center: bool = False,
    residual: Residual | str = Residual.BICUBIC,
) -> nn.Module:
    """The model ``name`` x``scale``; ``center``: a video model predicts the centre frame of its window only;
    ``residual``: the image models' variant (``none`` for checkpoints without the field: ``residual_of``).
    TinyVSR has one variant (it always adds the bilinearly upsampled frame)."""
    name, residual = ModelName(name), Residual(residual)
    if scale < 2:
        raise ValueError(f"scale must be >= 2, got {scale}")
    if name is ModelName.EDSR_BASELINE:
        return EDSR(scale, channels, residual=residual)
    if name is ModelName.TINYVSR:
        return TinyVSR(scale, channels, center=center)
    return ESPCN(scale, channels, residual=residual)
