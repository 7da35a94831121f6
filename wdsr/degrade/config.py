"""The degradation models' settings as frozen dataclasses, checked at construction (one ValueError each).

``RealESRGANConfig()`` is Real-ESRGAN's ``options/train_realesrnet_x4plus.yml`` (option names kept);
``BSRGANConfig()`` is BSRGAN's ``degradation_bsrgan`` (Zhang et al. 2021) without the camera-ISP branch;
``ArbitraryScaleConfig()`` is arbitrary-scale SR's bicubic down-sampling at a float scale (LIIF, LTE)."""

from __future__ import annotations

import dataclasses
import math

from shardmaker.errors import brief
from wdsr.degrade.fields import (
    MAX_GT_SIZE,
    MAX_NOISE,
    MAX_RESIZE,
    RESIZE_WHY,
    check_flag,
    check_items,
    check_odd,
    check_prob,
    check_probs,
    check_range,
    check_scale,
    check_sizes,
    set_field,
)
from wdsr.degrade.kernels import KERNEL_TYPES

__all__ = [
    "MAX_RESIZE",
    "ArbitraryScaleConfig",
    "BSRGANConfig",
    "RealESRGANConfig",
    "check_bsrgan_patch",
    "check_realesrgan_patch",
]

Range = tuple[float, float]
SHIFT_SIZE = 25  # the shifted Gaussian of BSRGAN's blur-and-subsample down-sampling
_KPROB = (0.45, 0.25, 0.12, 0.03, 0.12, 0.03)


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
        check_scale(self)
        check_flag(self, "gt_usm")
        if self.granularity not in ("sample", "batch"):
            raise ValueError(f"granularity must be 'sample' or 'batch', got {brief(self.granularity)}")
        size = check_odd("blur_kernel_size", self.blur_kernel_size, 2 * MAX_GT_SIZE + 1)
        for k in check_sizes(self, "kernel_sizes", 2 * MAX_GT_SIZE + 1):
            if k > size:
                raise ValueError(f"kernel size {k} exceeds blur_kernel_size {size}")
        for suffix in ("", "2"):
            self._round(suffix)
        for p in ("final_sinc_prob", "second_blur_prob", "final_order_prob"):
            check_prob(self, p)
        check_realesrgan_patch(self, self.gt_size)

    def _round(self, suffix: str) -> None:
        """The settings of one round (``suffix`` "" or "2")."""
        kinds = check_items("kernel_list" + suffix, getattr(self, "kernel_list" + suffix))
        unknown = sorted({k for k in kinds if not isinstance(k, str) or k not in KERNEL_TYPES}, key=str)
        if unknown:
            raise ValueError(f"kernel_list{suffix}: unknown kernel types {unknown}; known: {KERNEL_TYPES}")
        set_field(self, "kernel_list" + suffix, kinds)
        check_probs(self, "kernel_prob" + suffix, len(kinds))
        check_probs(self, "resize_prob" + suffix, 3)
        check_range(self, "blur_sigma" + suffix, 1e-6, math.inf)
        check_range(self, "betag_range" + suffix, 1e-6, math.inf, through=1.0)
        check_range(self, "betap_range" + suffix, 1e-6, math.inf, through=1.0)
        check_range(self, "resize_range" + suffix, 1e-6, MAX_RESIZE, through=1.0, why=RESIZE_WHY)
        check_range(self, "noise_range" + suffix, 0.0, MAX_NOISE)
        check_range(self, "poisson_scale_range" + suffix, 0.0, MAX_NOISE)
        check_range(self, "jpeg_range" + suffix, 1.0, 100.0)
        for p in ("sinc_prob", "gaussian_noise_prob", "gray_noise_prob"):
            check_prob(self, p + suffix)


def check_realesrgan_patch(cfg: RealESRGANConfig, patch_size: int) -> None:
    """A ``patch_size`` HR patch survives every step: each blurred image is wider than the kernel's reflect
    padding, and round 2's resize (relative to the LR side) leaves a pixel."""
    smallest = min(int(patch_size * cfg.resize_range[0]), patch_size // cfg.scale)  # what a kernel may blur
    if smallest <= cfg.blur_kernel_size // 2:
        k = cfg.blur_kernel_size
        raise ValueError(
            f"patch_size {patch_size} is too small: blurred at {smallest} px, under a {k}-tap kernel's reflect padding"
        )
    if int(patch_size // cfg.scale * cfg.resize_range2[0]) < 1:
        raise ValueError(f"resize_range2 {cfg.resize_range2} shrinks the {patch_size // cfg.scale} px LR side to 0 px")


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
        check_scale(self)
        check_sizes(self, "blur_sizes", 2 * MAX_GT_SIZE + 1)
        for p in ("scale2_prob", "down2_prob", "jpeg_prob"):
            check_prob(self, p)
        check_range(self, "noise_range", 0, int(MAX_NOISE), integer=True)
        check_range(self, "jpeg_range", 1, 100, integer=True)
        check_bsrgan_patch(self, self.gt_size)


def check_bsrgan_patch(cfg: BSRGANConfig, patch_size: int) -> None:
    """A ``patch_size`` HR patch at 1/(2 scale) is still wider than the largest kernel's reflect padding."""
    pad = max(max(cfg.blur_sizes), SHIFT_SIZE)
    if patch_size // (2 * cfg.scale) <= pad // 2:
        least = 2 * cfg.scale * (pad // 2 + 1)
        raise ValueError(f"patch_size {patch_size} is too small for {pad}-tap kernels at 1/{2 * cfg.scale}: at least {least}")


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
        check_scale(self)
        check_flag(self, "quantize")
        check_range(self, "scale_range", 1.0, math.inf)
        r = self.scale_range
        if r[1] > self.gt_size:
            raise ValueError(f"scale_range {r} goes above gt_size {self.gt_size}: an LR patch needs a pixel")
