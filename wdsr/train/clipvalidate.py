"""Validation of clip datasets for ``wdsr train`` (``--val-data`` with ``--clip-frames``): each rank its
whole clips (``SRDataset(split="val", clip=...)`` gives every clip to one rank and worker), scored REDS4-style
by :class:`~wdsr.pipeline.clipval.ClipMeter`: PSNR-Y/SSIM-Y per frame, averaged per clip, then over clips.

How the model sees a clip: the val pass hands it chunks of at most ``val_frames`` frames that overlap by
``T // 2`` context frames each side. A recurrent model (``--clip-window recurrent``) runs over each chunk
and scores the chunk's own frames, so every frame has at least ``T // 2`` frames of context each side
where the clip has them; at the clip's ends it has what the clip has. A centre-window model runs once per
frame on the ``T`` frames around it, windows at the clip's ends padded as BasicSR pads them
(``reflection_circle``). The bicubic baseline upsamples each frame alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from wdsr.dataset import SRDataset
from wdsr.loader import make_loader, to_float
from wdsr.pipeline.clips import ClipConfig
from wdsr.pipeline.clipval import ClipMeter, ValClip
from wdsr.train.upsample import MatlabBicubic
from wdsr.train.validate import quantise, super_resolve

VAL_FRAMES = 32  # frames per chunk of a val clip (at least the window plus one): REDS4's clips are 100
_WINDOWS_AT_ONCE = 4  # centre windows per forward pass


def val_clip_config(train: ClipConfig) -> ClipConfig:
    """The val set's windows: the train set's length and kind, consecutive frames, chunks of ``VAL_FRAMES``
    (more where the window needs them)."""
    return ClipConfig(frames=train.frames, window=train.window, val_frames=max(VAL_FRAMES, 2 * (train.frames // 2) + 1))


@torch.no_grad()
def super_resolve_chunk(model: nn.Module, item: ValClip, device: torch.device) -> torch.Tensor:
    """Float SR on the CPU of the chunk's own frames ``[own, C, H, W]``: a centre-window model once per own
    frame on its window (``item.windows``), a recurrent one over the whole chunk."""
    if item.windows is not None:
        outs = []
        for i in range(0, len(item.windows), _WINDOWS_AT_ONCE):
            x = to_float(item.lr[item.windows[i : i + _WINDOWS_AT_ONCE]].to(device))  # [n, T, C, h, w]
            outs.append(model(x).float().cpu())
        return torch.cat(outs)
    x = to_float(item.lr.to(device))[None]  # [1, n, C, h, w]
    return model(x)[0, item.own].float().cpu()


def validate_clips(model: nn.Module, val: SRDataset, cfg: Any, ctx: Any, frames: bool = False) -> list[float]:
    """``[sum over clips of the clip's mean PSNR-Y, of its mean SSIM-Y, clips]`` of this rank's clips (summed
    over ranks, their ratio is the REDS4 mean); ``frames``: ``model`` upsamples frames ``[N, C, h, w]``
    one by one (the bicubic baseline). A clip with frames left unscored (a skipped bad segment) counts not."""
    scale = val.config.scale
    was_training = model.training
    model.eval()
    meter = ClipMeter(crop_border=scale)
    loader = make_loader(val, num_workers=min(cfg.workers, 2), persistent_workers=False)
    try:
        for item in loader:
            if frames:
                sr = super_resolve(model, item.lr[item.own], ctx.device)
            else:
                sr = super_resolve_chunk(model, item, ctx.device)
            meter.add(item, quantise(sr, item.hr))
    finally:
        model.train(was_training)
    result = meter.result()
    done = [c for k, c in result["clips"].items() if k not in result["incomplete"]]
    return [sum(c["psnr_y"] for c in done), sum(c["ssim_y"] for c in done), float(len(done))]


def bicubic_clips(val: SRDataset, cfg: Any, ctx: Any, channels: int) -> list[float]:
    """``validate_clips``' sums for MATLAB's bicubic upsampling of each val LR frame: the reference line."""
    return validate_clips(MatlabBicubic(val.config.scale, channels).to(ctx.device), val, cfg, ctx, frames=True)
