"""``Degrader(cfg)``: uint8 HR patches + per-sample parameters -> float32 ``(lr, hr)`` on their device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from wdsr.bounds import check_multiple
from wdsr.degrade import registry
from wdsr.degrade.config import ArbitraryScaleConfig, BSRGANConfig, RealESRGANConfig

Params = dict[str, torch.Tensor]
Config = RealESRGANConfig | BSRGANConfig | ArbitraryScaleConfig
GRANULARITIES = registry.GRANULARITIES


def draw_arrays(cfg: Config, rng: np.random.Generator, patch_size: int) -> dict[str, np.ndarray]:
    """One sample's degradation parameters from ``rng`` as numpy arrays (kernels built here, in the
    worker): what the stream hands on, stacked per batch, without a tensor per sample."""
    model = registry.of(cfg)
    check_multiple(patch_size, cfg.scale)
    return model.draw_arrays(cfg, rng, patch_size)


def draw_params(cfg: Config, rng: np.random.Generator, patch_size: int) -> Params:
    """One sample's degradation parameters from ``rng``, as tensors (:func:`draw_arrays`)."""
    return {k: torch.from_numpy(v) for k, v in draw_arrays(cfg, rng, patch_size).items()}


def collate_params(samples: Sequence[Params]) -> Params:
    """Per-sample parameter dicts -> one dict of batch tensors (a leading batch dimension per key)."""
    if not samples:
        raise ValueError("collate_params: no samples")
    keys = samples[0].keys()
    for i, s in enumerate(samples):
        if s.keys() != keys:
            raise ValueError(f"collate_params: sample {i} has keys {sorted(s)}, sample 0 {sorted(keys)}")
    return {k: torch.stack([s[k] for s in samples]) for k in keys}


class Degrader(torch.nn.Module):
    """``forward(hr, params) -> (lr, hr)``: ``hr`` uint8 ``[B, 3, H, W]`` RGB, ``params`` the collated
    :func:`draw_params` dicts. ``granularity="sample"`` applies each sample's own parameters (the
    sharpening and first blur run batch-wide, a kernel per sample, the rest sample by sample);
    ``"batch"`` takes the per-batch draws of Real-ESRGAN (resize scales and modes, noise kind, blur and
    order flags, noise seeds) from row 0, as ``RealESRGANModel.feed_data`` draws them once per batch.
    The default (None) is ``"sample"``, except for ``ArbitraryScaleConfig``: ``"batch"`` only (row 0's
    scale: one LR size per batch). Runs in fp32 (the arbitrary-scale resize in exact float64) with
    autocast off and no autograd; the noise comes from generators seeded by the parameters, on the
    batch's device."""

    _anchor: torch.Tensor

    def __init__(self, cfg: Config, granularity: str | None = None) -> None:
        super().__init__()
        if granularity is not None and granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        self.register_buffer("_anchor", torch.empty(0), persistent=False)  # the module's device
        self.cfg = cfg
        model = registry.of(cfg)
        granularity = granularity or getattr(cfg, "granularity", model.granularities[0])
        if granularity not in model.granularities:
            raise ValueError(f"{model.name}: {model.granularity_note}")
        self.pipeline = model.pipeline(cfg)
        self.granularity = granularity

    def _check(self, hr: torch.Tensor, params: Params) -> None:
        if hr.dtype != torch.uint8 or hr.dim() != 4 or hr.shape[1] != 3:
            raise ValueError(f"Degrader expects uint8 [B, 3, H, W] HR patches, got {hr.dtype} {tuple(hr.shape)}")
        for side, name in zip(hr.shape[2:], ("HR patch height", "HR patch width"), strict=True):
            check_multiple(side, self.cfg.scale, name)
        for k, v in params.items():
            if v.shape[0] != hr.shape[0]:
                raise ValueError(f"params[{k!r}] has {v.shape[0]} rows for a batch of {hr.shape[0]}")

    @property
    def device(self) -> torch.device:
        """Where the degradation runs: the module's (``Degrader(cfg).to("cuda")``)."""
        return self._anchor.device

    @torch.no_grad()
    def forward(self, hr: Any, params: Params | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``degrader(batch)`` with a batch of ``SRDataset(..., degrade=cfg)`` (``(hr, params)`` or
        ``(hr, params, keys)``), or ``degrader(hr, params)``: both are moved to the module's device."""
        if params is None:
            if not isinstance(hr, (tuple, list)) or len(hr) not in (2, 3) or not isinstance(hr[1], dict):
                raise TypeError("Degrader expects a batch (hr, params[, keys]) of SRDataset(..., degrade=...), or (hr, params)")
            hr, params = hr[0], hr[1]
        dev = self.device
        hr = hr.to(dev, non_blocking=True)
        params = {k: v.to(dev, non_blocking=True) for k, v in params.items()}
        self._check(hr, params)
        with torch.autocast(device_type=dev.type, enabled=False):
            return self.pipeline(hr.float() / 255.0, params, self.granularity)
