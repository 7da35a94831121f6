"""The degradation models' settings as frozen dataclasses, checked at construction (one ValueError each).

``RealESRGANConfig()`` is Real-ESRGAN's ``options/train_realesrnet_x4plus.yml`` (option names kept);
``BSRGANConfig()`` is BSRGAN's ``degradation_bsrgan`` (Zhang et al. 2021) without the camera-ISP branch;
``ArbitraryScaleConfig()`` is arbitrary-scale SR's bicubic down-sampling at a float scale (LIIF, LTE)."""

from __future__ import annotations

import dataclasses
import math

from wdsr.bounds import check_multiple
from wdsr.degrade.kernels import KERNEL_TYPES

Range = tuple[float, float]
_KPROB = (0.45, 0.25, 0.12, 0.03, 0.12, 0.03)


def _prob(name: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name} is a probability, got {p}")


def _probs(name: str, ps: tuple[float, ...], n: int) -> None:
    if len(ps) != n or any(p < 0 for p in ps) or not math.isclose(math.fsum(ps), 1.0, abs_tol=1e-6):
        raise ValueError(f"{name} must be {n} non-negative probabilities summing to 1, got {ps} (sum {math.fsum(ps):g})")


def _range(name: str, r: Range, lo: float = -math.inf, hi: float = math.inf, through: float | None = None) -> None:
    if len(r) != 2 or r[0] > r[1]:
        raise ValueError(f"{name} must be (low, high) with low <= high, got {r}")
    if r[0] < lo or r[1] > hi:
        raise ValueError(f"{name} must lie within [{lo}, {hi}], got {r}")
    if through is not None and not r[0] <= through <= r[1]:
        raise ValueError(f"{name} must contain {through} (draws below and above it), got {r}")


def _odd(name: str, size: int) -> None:
    if size < 1 or size % 2 != 1:
        raise ValueError(f"{name} must be odd and positive (a centred kernel), got {size}")


def _scale(scale: int, gt_size: int) -> None:
    check_multiple(gt_size, scale, "gt_size")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RealESRGANConfig:
    """Real-ESRGAN's second-order model; ``*2`` fields are the second round. ``final_order_prob`` is the
    chance of [resize back + sinc] before the final JPEG (Real-ESRGAN: 0.5, JPEG first otherwise)."""

    scale: int = 4
    gt_size: int = 256
    gt_usm: bool = True
    blur_kernel_size: int = 21  # every kernel is padded to this size
    kernel_sizes: tuple[int, ...] = tuple(range(7, 22, 2))
    kernel_list: tuple[str, ...] = KERNEL_TYPES
    kernel_prob: tuple[float, ...] = _KPROB
    sinc_prob: float = 0.1
    blur_sigma: Range = (0.2, 3.0)
    betag_range: Range = (0.5, 4.0)
    betap_range: Range = (1.0, 2.0)
    kernel_list2: tuple[str, ...] = KERNEL_TYPES
    kernel_prob2: tuple[float, ...] = _KPROB
    sinc_prob2: float = 0.1
    blur_sigma2: Range = (0.2, 1.5)
    betag_range2: Range = (0.5, 4.0)
    betap_range2: Range = (1.0, 2.0)
    final_sinc_prob: float = 0.8
    resize_prob: tuple[float, float, float] = (0.2, 0.7, 0.1)  # up, down, keep
    resize_range: Range = (0.15, 1.5)
    gaussian_noise_prob: float = 0.5
    noise_range: Range = (1.0, 30.0)
    poisson_scale_range: Range = (0.05, 3.0)
    gray_noise_prob: float = 0.4
    jpeg_range: Range = (30.0, 95.0)
    second_blur_prob: float = 0.8
    resize_prob2: tuple[float, float, float] = (0.3, 0.4, 0.3)
    resize_range2: Range = (0.3, 1.2)
    gaussian_noise_prob2: float = 0.5
    noise_range2: Range = (1.0, 25.0)
    poisson_scale_range2: Range = (0.05, 2.5)
    gray_noise_prob2: float = 0.4
    jpeg_range2: Range = (30.0, 95.0)
    final_order_prob: float = 0.5
    # what a Degrader(cfg) applies by default: each sample's own draws, or row 0's per-batch ones (Real-ESRGAN's)
    granularity: str = "sample"

    def __post_init__(self) -> None:
        _scale(self.scale, self.gt_size)
        if self.granularity not in ("sample", "batch"):
            raise ValueError(f"granularity must be 'sample' or 'batch', got {self.granularity!r}")
        _odd("blur_kernel_size", self.blur_kernel_size)
        if not self.kernel_sizes:
            raise ValueError("kernel_sizes is empty")
        for k in self.kernel_sizes:
            _odd(f"kernel_sizes entry {k}", k)
            if k > self.blur_kernel_size:
                raise ValueError(f"kernel size {k} exceeds blur_kernel_size {self.blur_kernel_size}")
        for suffix in ("", "2"):
            kinds, probs = getattr(self, "kernel_list" + suffix), getattr(self, "kernel_prob" + suffix)
            unknown = set(kinds) - set(KERNEL_TYPES)
            if unknown:
                raise ValueError(f"kernel_list{suffix}: unknown kernel types {sorted(unknown)}; known: {KERNEL_TYPES}")
            _probs("kernel_prob" + suffix, probs, len(kinds))
            _probs("resize_prob" + suffix, getattr(self, "resize_prob" + suffix), 3)
            _range("blur_sigma" + suffix, getattr(self, "blur_sigma" + suffix), lo=1e-6)
            _range("betag_range" + suffix, getattr(self, "betag_range" + suffix), lo=1e-6, through=1.0)
            _range("betap_range" + suffix, getattr(self, "betap_range" + suffix), lo=1e-6, through=1.0)
            _range("resize_range" + suffix, getattr(self, "resize_range" + suffix), lo=1e-6, through=1.0)
            _range("noise_range" + suffix, getattr(self, "noise_range" + suffix), lo=0.0)
            _range("poisson_scale_range" + suffix, getattr(self, "poisson_scale_range" + suffix), lo=0.0)
            _range("jpeg_range" + suffix, getattr(self, "jpeg_range" + suffix), lo=1.0, hi=100.0)
            for p in ("sinc_prob", "gaussian_noise_prob", "gray_noise_prob"):
                _prob(p + suffix, getattr(self, p + suffix))
        for p in ("final_sinc_prob", "second_blur_prob", "final_order_prob"):
            _prob(p, getattr(self, p))


@dataclasses.dataclass(frozen=True, kw_only=True)
class BSRGANConfig:
    """BSRGAN's degradation: two blurs, two down-samplings, Gaussian noise and JPEG in a random order
    (the final down-sampling after the first), a final JPEG; an optional x2 pre-down-sampling at x4."""

    scale: int = 4
    gt_size: int = 256
    scale2_prob: float = 0.25  # x4 only: first halve with cv2/bicubic, then degrade at x2
    blur_sizes: tuple[int, ...] = tuple(range(7, 26, 2))  # 2 * randint(2, 11) + 3
    down2_prob: float = 0.75  # resize by 1/sf1, sf1 ~ U(1, 2 sf); else shifted-Gaussian blur + nearest
    noise_range: tuple[int, int] = (2, 25)  # integer sigma levels, 0-255 units
    jpeg_prob: float = 0.9
    jpeg_range: tuple[int, int] = (30, 95)  # integer qualities

    def __post_init__(self) -> None:
        _scale(self.scale, self.gt_size)
        if not self.blur_sizes:
            raise ValueError("blur_sizes is empty")
        for k in self.blur_sizes:
            _odd(f"blur_sizes entry {k}", k)
        for p in ("scale2_prob", "down2_prob", "jpeg_prob"):
            _prob(p, getattr(self, p))
        _range("noise_range", self.noise_range, lo=0.0)
        _range("jpeg_range", self.jpeg_range, lo=1.0, hi=100.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArbitraryScaleConfig:
    """Arbitrary-scale SR (LIIF, LTE): a float scale per batch, uniform on ``scale_range``; the LR is
    Pillow's BICUBIC down-sampling of the fixed ``gt_size`` HR patch to ``floor(gt_size / s + 0.5)``
    (``quantize=False``: the same filter without 8-bit rounding). ``scale`` is only the integer grid the
    HR patches are cut on: give the SRDataset the same ``scale`` (and ``patch_size=gt_size``)."""

    scale_range: Range = (1.0, 4.0)
    gt_size: int = 192
    scale: int = 1
    quantize: bool = True

    def __post_init__(self) -> None:
        _scale(self.scale, self.gt_size)
        r = self.scale_range
        if len(r) == 2 and not all(math.isfinite(v) for v in r):
            raise ValueError(f"scale_range must be finite, got {r}")
        _range("scale_range", r, lo=1.0)
        if r[1] > self.gt_size:
            raise ValueError(f"scale_range {r} goes above gt_size {self.gt_size}: an LR patch needs a pixel")
