"""Real-ESRGAN's second-order degradation: per-sample parameter draws (numpy, in the worker) and the
device pipeline in the order of ``RealESRNetModel.feed_data``.

Parameters of one sample (``draw_params``; stack them per key for a batch):

========================  ================  ==================================================
key                       dtype, shape      meaning
========================  ================  ==================================================
kernel1, kernel2          float32 [K, K]    the two rounds' blur kernels (sinc or mixed), K = 21
sinc_kernel               float32 [K, K]    the final sinc kernel, or a unit pulse
resize_scale              float64 [2]       round 1 factor of the patch; round 2 factor of HR/scale
resize_mode               int64 [3]         round 1, round 2, final resize: index of RESIZE_MODES
gaussian                  bool [2]          per round: Gaussian noise (else Poisson)
noise_sigma               float32 [2]       Gaussian sigma, 0-255 units
poisson_scale             float32 [2]       Poisson noise scale
gray_noise                bool [2]          per round: grey (one map on all channels) noise
jpeg_quality              float32 [2]       the two JPEG qualities
second_blur               bool []           round 2 blurs with kernel2
sinc_first                bool []           final [resize back + sinc] before the last JPEG
noise_seed                int64 [2]         seeds of the rounds' torch.Generator noise draws
========================  ================  =================================================="""

from __future__ import annotations

import math

import numpy as np
import torch

from wdsr.degrade import ops
from wdsr.degrade.config import RealESRGANConfig, check_realesrgan_patch
from wdsr.degrade.fields import MAX_RESIZE, check_param
from wdsr.degrade.jpeg import DiffJPEG
from wdsr.degrade.kernels import KernelSpec, build_kernel, draw_mixed_kernel, pad_kernel, pick

Params = dict[str, torch.Tensor]


def _round_kernel(cfg: RealESRGANConfig, rng: np.random.Generator, suffix: str) -> KernelSpec:
    """A round's kernel: sinc with ``sinc_prob`` (cutoff U(pi/3, pi) below size 13, U(pi/5, pi) from 13,
    as Real-ESRGAN's dataset), else a mixed kernel."""
    size = cfg.kernel_sizes[int(rng.integers(len(cfg.kernel_sizes)))]
    if rng.uniform() < getattr(cfg, "sinc_prob" + suffix):
        lo = math.pi / 3 if size < 13 else math.pi / 5
        return KernelSpec("sinc", size, omega=float(rng.uniform(lo, math.pi)))
    return draw_mixed_kernel(
        rng,
        getattr(cfg, "kernel_list" + suffix),
        getattr(cfg, "kernel_prob" + suffix),
        size,
        getattr(cfg, "blur_sigma" + suffix),
        getattr(cfg, "betag_range" + suffix),
        getattr(cfg, "betap_range" + suffix),
    )


def draw_kernel_specs(cfg: RealESRGANConfig, rng: np.random.Generator) -> tuple[KernelSpec, KernelSpec, KernelSpec | None]:
    """The three kernels' recipes, drawn first by :func:`draw_params` (None: no final sinc, a pulse)."""
    k1 = _round_kernel(cfg, rng, "")
    k2 = _round_kernel(cfg, rng, "2")
    final = None
    if rng.uniform() < cfg.final_sinc_prob:
        size = cfg.kernel_sizes[int(rng.integers(len(cfg.kernel_sizes)))]
        final = KernelSpec("sinc", size, omega=float(rng.uniform(math.pi / 3, math.pi)))
    return k1, k2, final


def _resize_scale(rng: np.random.Generator, probs: tuple[float, float, float], lo_hi: tuple[float, float]) -> float:
    updown = pick(rng, probs)
    return float(rng.uniform(1.0, lo_hi[1])) if updown == 0 else float(rng.uniform(lo_hi[0], 1.0)) if updown == 1 else 1.0


def draw_arrays(cfg: RealESRGANConfig, rng: np.random.Generator, patch_size: int) -> dict[str, np.ndarray]:
    """One sample's parameters (table above) as numpy arrays, every draw from ``rng``; the kernels are
    built here (``degrader.draw_params`` makes them tensors; the stream keeps them numpy until the batch).
    ``patch_size`` is a multiple of ``cfg.scale`` (``degrader.draw_arrays`` checks it)."""
    check_realesrgan_patch(cfg, patch_size)
    specs = draw_kernel_specs(cfg, rng)
    size = cfg.blur_kernel_size
    kernels = [build_kernel(s, size) if s is not None else pad_kernel(np.ones((1, 1)), size) for s in specs]
    scales = [_resize_scale(rng, cfg.resize_prob, cfg.resize_range), _resize_scale(rng, cfg.resize_prob2, cfg.resize_range2)]
    rounds = []
    for sfx in ("", "2"):
        rounds.append(
            (
                rng.uniform() < getattr(cfg, "gaussian_noise_prob" + sfx),
                rng.uniform(*getattr(cfg, "noise_range" + sfx)),
                rng.uniform(*getattr(cfg, "poisson_scale_range" + sfx)),
                rng.uniform() < getattr(cfg, "gray_noise_prob" + sfx),
                rng.uniform(*getattr(cfg, "jpeg_range" + sfx)),
            )
        )
    gaussian, sigma, pscale, gray, quality = zip(*rounds, strict=True)
    return {
        "kernel1": kernels[0].astype(np.float32),
        "kernel2": kernels[1].astype(np.float32),
        "sinc_kernel": kernels[2].astype(np.float32),
        "resize_scale": np.array(scales, dtype=np.float64),
        "resize_mode": rng.integers(0, len(ops.RESIZE_MODES), size=3),
        "gaussian": np.array(gaussian, dtype=bool),
        "noise_sigma": np.array(sigma, dtype=np.float32),
        "poisson_scale": np.array(pscale, dtype=np.float32),
        "gray_noise": np.array(gray, dtype=bool),
        "jpeg_quality": np.array(quality, dtype=np.float32),
        "second_blur": np.array(rng.uniform() < cfg.second_blur_prob),
        "sinc_first": np.array(rng.uniform() < cfg.final_order_prob),
        "noise_seed": rng.integers(0, 2**63 - 1, size=2, dtype=np.int64),
    }


class RealESRGANPipeline(torch.nn.Module):
    """``forward(gt, p, granularity) -> (lr, hr)`` on float ``gt`` [B, 3, H, W]: kernels, sigmas, grey
    flags and JPEG qualities per sample; scales, modes, noise kind, blur/order flags and seeds from row 0
    of each group degraded together (the batch: Real-ESRGAN's per-batch draws; or each sample)."""

    def __init__(self, cfg: RealESRGANConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.usm = ops.USMSharp()
        self.jpeg = DiffJPEG()

    def _noise(self, x: torch.Tensor, p: Params, r: int, gaussian: bool, gen: torch.Generator) -> torch.Tensor:
        gray = p["gray_noise"][:, r]
        if gaussian:
            color, gray_map = ops.normal_draws(x, gray, gen)
            return ops.gaussian_noise(x, p["noise_sigma"][:, r], gray, color, gray_map)
        return ops.poisson_noise(x, p["poisson_scale"][:, r], gray, gen)

    def forward(self, gt: torch.Tensor, p: Params, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lr, hr)`` of float ``gt``: the sharpening and the first blur (a kernel per sample) run on
        the whole batch, as in ``feed_data``; the rest once (``"batch"``) or per sample."""
        check_param("resize_scale", p["resize_scale"], 1e-6, MAX_RESIZE)  # the only up-sampling steps
        hr = self.usm(gt) if self.cfg.gt_usm else gt
        out = ops.filter2d(hr, p["kernel1"].to(gt.device))
        if granularity == "batch":
            return self._rest(out, p, hr.shape[-2:]), hr
        rows = [self._rest(out[i : i + 1], {k: v[i : i + 1] for k, v in p.items()}, hr.shape[-2:]) for i in range(len(out))]
        return torch.cat(rows), hr

    def _rest(self, out: torch.Tensor, p: Params, hr_size: tuple[int, ...]) -> torch.Tensor:
        """Everything after the first blur, with row 0's per-batch draws."""
        s, (h, w), dev = self.cfg.scale, hr_size, out.device
        scale = p["resize_scale"][0].tolist()
        mode = [ops.RESIZE_MODES[m] for m in p["resize_mode"][0].tolist()]
        gaussian = p["gaussian"][0].tolist()
        gens = [torch.Generator(device=dev).manual_seed(int(sd)) for sd in p["noise_seed"][0].tolist()]
        quality = p["jpeg_quality"].to(dev)
        # round 1 (after the blur): resize, noise, JPEG
        out = ops.resize(out, mode[0], scale=scale[0])
        out = self._noise(out, p, 0, gaussian[0], gens[0])
        out = self.jpeg(torch.clamp(out, 0, 1), quality[:, 0])
        # round 2: blur (maybe), resize relative to the LR size, noise
        if bool(p["second_blur"][0]):
            out = ops.filter2d(out, p["kernel2"].to(dev))
        out = ops.resize(out, mode[1], size=(int(h / s * scale[1]), int(w / s * scale[1])))
        out = self._noise(out, p, 1, gaussian[1], gens[1])
        # [resize back + sinc] and the last JPEG, in either order
        sinc = p["sinc_kernel"].to(dev)
        if bool(p["sinc_first"][0]):
            out = ops.filter2d(ops.resize(out, mode[2], size=(h // s, w // s)), sinc)
            out = self.jpeg(torch.clamp(out, 0, 1), quality[:, 1])
        else:
            out = self.jpeg(torch.clamp(out, 0, 1), quality[:, 1])
            out = ops.filter2d(ops.resize(out, mode[2], size=(h // s, w // s)), sinc)
        return ops.clamp_round(out)
