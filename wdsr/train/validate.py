"""Validation for ``wdsr train``: each rank its disjoint part of the val split, PSNR-Y / SSIM-Y sums
(of the model, and once of bicubic upsampling: the baseline the model must beat).

The model's output is clamped and quantised to the data's integer type, as SR papers report;
``crop_border`` is the scale. Large images are run as overlapping tiles (``--val-tile``), a
few at a time, and stitched back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from wdsr.dataset import SRDataset
from wdsr.loader import make_loader, to_float
from wdsr.metrics import psnr_y, ssim_y
from wdsr.pipeline.tiles import stitch
from wdsr.train.upsample import MatlabBicubic

_TILES_AT_ONCE = 16


def quantise(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Float SR in [0, 1] -> ``like``'s integer type (uint8 or uint16), clamped and rounded."""
    top = 65535.0 if like.dtype == torch.uint16 else 255.0
    q = (x.float().clamp(0, 1) * top).round()
    return q.to(torch.int32).to(like.dtype) if like.dtype == torch.uint16 else q.to(like.dtype)


@torch.no_grad()
def super_resolve(model: nn.Module, lr: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``[N, C, h, w]`` integer LR -> float SR on the CPU, ``_TILES_AT_ONCE`` images per forward pass."""
    outs = []
    for i in range(0, lr.shape[0], _TILES_AT_ONCE):
        x = to_float(lr[i : i + _TILES_AT_ONCE].to(device, non_blocking=True))
        if device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        outs.append(model(x).float().cpu())
    return torch.cat(outs)


def validate(model: nn.Module, val: SRDataset, cfg: Any, ctx: Any) -> list[float]:
    """``[sum of PSNR-Y, sum of SSIM-Y, images]`` over this rank's part of the val split."""
    scale = val.config.scale
    was_training = model.training
    model.eval()
    psnr = ssim = 0.0
    n = 0
    loader = make_loader(val, num_workers=min(cfg.workers, 2), persistent_workers=False)
    try:
        for sample in loader:
            sr = super_resolve(model, sample.lr, ctx.device)
            hr = sample.hr
            if sample.boxes is not None:
                sr = stitch(sr, sample.boxes, scale, sample.lr_size)[None]
                hr = stitch(hr.float(), sample.boxes, scale, sample.lr_size).round().to(hr.dtype)[None]
            sr_q = quantise(sr[0], hr)
            psnr += psnr_y(sr_q, hr[0], crop_border=scale)
            ssim += ssim_y(sr_q, hr[0], crop_border=scale)
            n += 1
    finally:
        model.train(was_training)
    return [psnr, ssim, float(n)]


def bicubic_baseline(val: SRDataset, cfg: Any, ctx: Any, channels: int) -> list[float]:
    """``validate``'s sums for MATLAB's bicubic upsampling of the val LR (the papers' baseline): the
    reference line of ``wdsr plot``'s PSNR/SSIM panels, computed once at step 0."""
    return validate(MatlabBicubic(val.config.scale, channels).to(ctx.device), val, cfg, ctx)
