"""The Degrader on a device against the CPU, for ``bench.gpu_check``: outputs within the documented bound,
and the time of each model and op on both.

The documented bound: the arbitrary-scale Degrader gives on CUDA exactly what it gives on the CPU
(``torch.equal``: ``tests/test_degrade_arbitrary.py::test_cuda_equals_cpu``). Real-ESRGAN's and
BSRGAN's noise comes from torch generators, whose draws on CUDA differ from the CPU's by design
(``docs/degrade.md``), and the deterministic ops have no documented bound: their largest difference is
reported, not judged.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

import numpy as np
import torch

from bench.common import real_photos
from bench.degrade_bench import best_ms
from wdsr.degrade import ArbitraryScaleConfig, BSRGANConfig, Degrader, RealESRGANConfig, collate_params, draw_params, ops
from wdsr.degrade.jpeg import DiffJPEG

log = logging.getLogger("gpu_check")

EXACT = "0 (tests/test_degrade_arbitrary.py::test_cuda_equals_cpu)"
DRAWS = "none: noise draws differ on CUDA by design (docs/degrade.md)"
NONE = "none documented"

Call = Callable[[], torch.Tensor]
Maker = Callable[[torch.device], Call]  # the op made on a device, its inputs there: the call to time
Op = tuple[str, float | None, str, Maker]  # name, the bound or None, what the bound column says, the maker


@dataclasses.dataclass(frozen=True)
class OpResult:
    """One row: milliseconds on each device (best of the repeats, synchronised) and max |device - cpu|."""

    name: str
    cpu_ms: float
    device_ms: float
    max_abs_diff: float
    bound: float | None
    bound_note: str

    @property
    def within(self) -> bool | None:
        """Within the documented bound; None where there is none."""
        return None if self.bound is None else self.max_abs_diff <= self.bound


def photo_batch(n: int, size: int, seed: int = 0) -> torch.Tensor:
    """``n`` uint8 ``[3, size, size]`` crops of the real photos the 4K frames are made of."""
    rng = np.random.default_rng(seed)
    pics = real_photos()
    out = []
    for i in range(n):
        img = pics[i % len(pics)]
        y, x = (int(v) for v in rng.integers(0, [img.shape[0] - size + 1, img.shape[1] - size + 1]))
        out.append(torch.from_numpy(np.ascontiguousarray(img[y : y + size, x : x + size])).permute(2, 0, 1))
    return torch.stack(out)


def _params(cfg: RealESRGANConfig | BSRGANConfig | ArbitraryScaleConfig, n: int, size: int) -> dict[str, torch.Tensor]:
    return collate_params([draw_params(cfg, np.random.default_rng([0, 1, i, 0]), size) for i in range(n)])


def op_table(hr: torch.Tensor) -> list[Op]:
    """The models and the Real-ESRGAN ops, each made for a device from the same CPU inputs."""
    n, size = hr.shape[0], hr.shape[-1]
    real, bsr, arb = RealESRGANConfig(), BSRGANConfig(), ArbitraryScaleConfig(gt_size=size)
    p_real, p_bsr, p_arb = _params(real, n, size), _params(bsr, n, size), _params(arb, n, size)
    x = hr.float() / 255

    def on(dev: torch.device, p: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(dev) for k, v in p.items()}

    def degrader(cfg: RealESRGANConfig | BSRGANConfig | ArbitraryScaleConfig, p: dict[str, torch.Tensor]) -> Maker:
        def make(dev: torch.device) -> Call:
            deg, h, q = Degrader(cfg).to(dev), hr.to(dev), on(dev, p)
            return lambda: deg(h, q)[0]

        return make

    def op(fn: Callable[[torch.device, torch.Tensor], Call]) -> Maker:
        return lambda dev: fn(dev, x.to(dev))

    def jpeg(dev: torch.device, xd: torch.Tensor) -> Call:
        j, q = DiffJPEG().to(dev), p_real["jpeg_quality"][:, 0].to(dev)
        return lambda: j(xd, q)

    def usm(dev: torch.device, xd: torch.Tensor) -> Call:
        sharpen = ops.USMSharp().to(dev)
        return lambda: sharpen(xd)

    def noise(dev: torch.device, xd: torch.Tensor) -> Call:
        sigma, gray = p_real["noise_sigma"][:, 0].to(dev), torch.zeros(n, device=dev)

        def run() -> torch.Tensor:
            gen = torch.Generator(device=dev).manual_seed(0)
            return ops.gaussian_noise(xd, sigma, gray, *ops.normal_draws(xd, gray, gen))

        return run

    return [
        (f"Degrader arbitrary scale (x{float(p_arb['scale'][0]):.2f})", 0.0, EXACT, degrader(arb, p_arb)),
        ("Degrader Real-ESRGAN, per sample", None, DRAWS, degrader(real, p_real)),
        ("Degrader BSRGAN", None, DRAWS, degrader(bsr, p_bsr)),
        ("op: USM sharpening (51 x 51)", None, NONE, op(usm)),
        ("op: filter2d, 21 x 21 per sample", None, NONE, op(lambda d, xd: lambda: ops.filter2d(xd, p_real["kernel1"].to(d)))),
        ("op: DiffJPEG", None, NONE, op(jpeg)),
        ("op: resize bicubic x0.5", None, NONE, op(lambda d, xd: lambda: ops.resize(xd, "bicubic", scale=0.5))),
        ("op: Gaussian noise (draws + add)", None, DRAWS, op(noise)),
    ]


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    return float((a.detach().cpu().double() - b.detach().cpu().double()).abs().max()) if a.numel() else 0.0


def check(device: torch.device, n: int, size: int, repeat: int) -> list[OpResult]:
    """Every op of :func:`op_table` on the CPU and on ``device`` (TF32 off, as the equivalence tests run)."""
    hr = photo_batch(n, size)
    cpu = torch.device("cpu")
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    rows = []
    try:
        for name, bound, note, make in op_table(hr):
            on_cpu, on_dev = make(cpu), make(device)
            diff = _max_diff(on_dev(), on_cpu())
            rows.append(OpResult(name, best_ms(on_cpu, cpu, repeat), best_ms(on_dev, device, repeat), diff, bound, note))
            log.info("degrader: %s: max |%s - cpu| %.3g", name, device.type, diff)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
    return rows
