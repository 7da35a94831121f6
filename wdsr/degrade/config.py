"""The degradation models' settings as frozen dataclasses, checked at construction (one ValueError each).

``RealESRGANConfig()`` is Real-ESRGAN's ``options/train_realesrnet_x4plus.yml`` (option names kept);
``BSRGANConfig()`` is BSRGAN's ``degradation_bsrgan`` (Zhang et al. 2021) without the camera-ISP branch;
``ArbitraryScaleConfig()`` is arbitrary-scale SR's bicubic down-sampling at a float scale (LIIF, LTE)."""

from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any

import torch

from shardmaker.errors import brief
from wdsr.bounds import check_multiple, check_number
from wdsr.degrade.kernels import KERNEL_TYPES

Range = tuple[float, float]
SHIFT_SIZE = 25  # the shifted Gaussian of BSRGAN's blur-and-subsample down-sampling
_KPROB = (0.45, 0.25, 0.12, 0.03, 0.12, 0.03)
MAX_SCALE = 64  # the dataset's scale range (wdsr.config)
MAX_GT_SIZE = 1 << 16  # the dataset's patch_size range
MAX_RESIZE = 4.0  # Real-ESRGAN's resize_range / resize_range2 upper end: an intermediate is at most 4x the patch side
_RESIZE_WHY = " (an up-sampled intermediate is at most MAX_RESIZE x the patch side: docs/degrade.md)"
MAX_NOISE = 255.0  # Gaussian sigma and Poisson scale (0-255 units / a multiple of the shot noise): all saturate above
MAX_CHOICES = 256  # entries of kernel_sizes, blur_sizes, kernel_list


def check_param(name: str, values: Any, lo: float, hi: float) -> None:
    """A hand-made batch's parameter (``Degrader(hr, params)``) in ``[lo, hi]`` and finite, as the configs'
    draws are: what sizes an intermediate image is never taken on trust (a ValueError naming it)."""
    t = torch.as_tensor(values, dtype=torch.float64)
    if t.numel() and not (bool(torch.isfinite(t).all()) and lo <= float(t.min()) and float(t.max()) <= hi):
        got = f"[{float(t.min())}, {float(t.max())}]"
        raise ValueError(f"params[{name!r}] must be finite and in [{lo:g}, {hi:g}], got values in {got}")


def _set(cfg: object, name: str, value: object) -> None:
    object.__setattr__(cfg, name, value)


def _int(cfg: object, name: str, lo: int, hi: int) -> int:
    """The field ``name`` as an exact int in ``[lo, hi]`` (not a bool, not a float): a ValueError naming it."""
    value = check_number(name, getattr(cfg, name), lo, hi, integer=True)
    _set(cfg, name, value)
    return int(value)


def _prob(cfg: object, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} is a probability, a number in [0, 1], got {brief(value)}")
    _set(cfg, name, float(value))


def _flag(cfg: object, name: str) -> None:
    if not isinstance(getattr(cfg, name), bool):
        raise ValueError(f"{name} must be true or false, got {brief(getattr(cfg, name))}")


def _items(name: str, value: object, most: int = MAX_CHOICES) -> tuple:
    if not isinstance(value, (tuple, list)) or not 1 <= len(value) <= most:
        raise ValueError(f"{name} must be a list of 1 to {most} entries, got {brief(value)}")
    return tuple(value)


def _probs(cfg: object, name: str, n: int) -> None:
    ps = getattr(cfg, name)
    bad = ValueError(f"{name} must be {n} non-negative probabilities summing to 1, got {brief(ps)}")
    if not isinstance(ps, (tuple, list)) or len(ps) != n:
        raise bad
    if any(isinstance(p, bool) or not isinstance(p, (int, float)) for p in ps):
        raise bad
    ps = tuple(check_number(f"{name} entry", p, 0.0, 1.0, integer=False) for p in ps)
    if not math.isclose(math.fsum(ps), 1.0, abs_tol=1e-6):
        raise ValueError(f"{name} must be {n} non-negative probabilities summing to 1, got {ps} (sum {math.fsum(ps):g})")
    _set(cfg, name, ps)


def _range(
    cfg: object, name: str, lo: float, hi: float, through: float | None = None, integer: bool = False, why: str = ""
) -> None:
    """The field ``name`` as ``(low, high)``: two finite numbers (exact ints if ``integer``) in ``[lo, hi]``
    with low <= high (containing ``through``); normalised to a tuple. A ValueError naming it otherwise."""
    r = getattr(cfg, name)
    if not isinstance(r, (tuple, list)) or len(r) != 2:
        raise ValueError(f"{name} must be (low, high) with low <= high, got {brief(r)}")
    try:
        r = tuple(_number(v, integer) for v in r)
    except (TypeError, ValueError, OverflowError):
        kind = "integers" if integer else "finite numbers"
        raise ValueError(f"{name} must be (low, high), two {kind}, got {brief(r)}") from None
    if r[0] > r[1]:
        raise ValueError(f"{name} must be (low, high) with low <= high, got {brief(r)}")
    if r[0] < lo or r[1] > hi:
        raise ValueError(f"{name} must lie within [{lo}, {hi}]{why}, got {brief(r)}")
    if through is not None and not r[0] <= through <= r[1]:
        raise ValueError(f"{name} must contain {through} (draws below and above it), got {brief(r)}")
    _set(cfg, name, r)


def _number(v: Any, integer: bool) -> int | float:
    """``v`` as an exact int (``integer``) or a finite float; a TypeError/ValueError/OverflowError otherwise."""
    if isinstance(v, bool) or isinstance(v, str):
        raise TypeError(v)
    if integer:
        return operator.index(v)
    number = float(v)
    if not math.isfinite(number):
        raise ValueError(v)
    return number


def _odd(name: str, size: object, hi: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or size % 2 != 1 or size > hi:
        raise ValueError(f"{name} must be odd, an integer in [1, {hi}] (a centred kernel), got {brief(size)}")
    return size


def _sizes(cfg: object, name: str, hi: int) -> tuple[int, ...]:
    sizes = tuple(_odd(f"{name} entry {brief(k)}", k, hi) for k in _items(name, getattr(cfg, name)))
    _set(cfg, name, sizes)
    return sizes


def _scale(cfg: object) -> None:
    """``scale`` and ``gt_size``: exact ints, ``gt_size`` a positive multiple of ``scale``."""
    scale = _int(cfg, "scale", 1, MAX_SCALE)
    check_multiple(_int(cfg, "gt_size", 1, MAX_GT_SIZE), scale, "gt_size")


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
        _scale(self)
        _flag(self, "gt_usm")
        if self.granularity not in ("sample", "batch"):
            raise ValueError(f"granularity must be 'sample' or 'batch', got {brief(self.granularity)}")
        size = _odd("blur_kernel_size", self.blur_kernel_size, 2 * MAX_GT_SIZE + 1)
        for k in _sizes(self, "kernel_sizes", 2 * MAX_GT_SIZE + 1):
            if k > size:
                raise ValueError(f"kernel size {k} exceeds blur_kernel_size {size}")
        for suffix in ("", "2"):
            self._round(suffix)
        for p in ("final_sinc_prob", "second_blur_prob", "final_order_prob"):
            _prob(self, p)
        check_realesrgan_patch(self, self.gt_size)

    def _round(self, suffix: str) -> None:
        """The settings of one round (``suffix`` "" or "2")."""
        kinds = _items("kernel_list" + suffix, getattr(self, "kernel_list" + suffix))
        unknown = sorted({k for k in kinds if not isinstance(k, str) or k not in KERNEL_TYPES}, key=str)
        if unknown:
            raise ValueError(f"kernel_list{suffix}: unknown kernel types {unknown}; known: {KERNEL_TYPES}")
        _set(self, "kernel_list" + suffix, kinds)
        _probs(self, "kernel_prob" + suffix, len(kinds))
        _probs(self, "resize_prob" + suffix, 3)
        _range(self, "blur_sigma" + suffix, 1e-6, math.inf)
        _range(self, "betag_range" + suffix, 1e-6, math.inf, through=1.0)
        _range(self, "betap_range" + suffix, 1e-6, math.inf, through=1.0)
        _range(self, "resize_range" + suffix, 1e-6, MAX_RESIZE, through=1.0, why=_RESIZE_WHY)
        _range(self, "noise_range" + suffix, 0.0, MAX_NOISE)
        _range(self, "poisson_scale_range" + suffix, 0.0, MAX_NOISE)
        _range(self, "jpeg_range" + suffix, 1.0, 100.0)
        for p in ("sinc_prob", "gaussian_noise_prob", "gray_noise_prob"):
            _prob(self, p + suffix)


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
        _scale(self)
        _sizes(self, "blur_sizes", 2 * MAX_GT_SIZE + 1)
        for p in ("scale2_prob", "down2_prob", "jpeg_prob"):
            _prob(self, p)
        _range(self, "noise_range", 0, int(MAX_NOISE), integer=True)
        _range(self, "jpeg_range", 1, 100, integer=True)
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
        _scale(self)
        _flag(self, "quantize")
        _range(self, "scale_range", 1.0, math.inf)
        r = self.scale_range
        if r[1] > self.gt_size:
            raise ValueError(f"scale_range {r} goes above gt_size {self.gt_size}: an LR patch needs a pixel")
