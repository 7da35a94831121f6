"""The field checks of the degradation configs (``wdsr.degrade.config``) and their limits: every number
finite, every range two ordered numbers, every integer exact (not a bool, not a float), every list bounded,
each error a ValueError naming the field; and the check of a hand-made batch's parameters that size an image.
The checks normalise what they accept (YAML lists become tuples, so a config stays hashable)."""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from shardmaker.errors import brief
from wdsr.bounds import check_multiple, check_number

MAX_SCALE = 64  # the dataset's scale range (wdsr.config)
MAX_GT_SIZE = 1 << 16  # the dataset's patch_size range
MAX_RESIZE = 4.0  # Real-ESRGAN's resize_range / resize_range2 upper end: an intermediate is at most 4x the patch side
RESIZE_WHY = " (an up-sampled intermediate is at most MAX_RESIZE x the patch side: docs/degrade.md)"
MAX_NOISE = 255.0  # Gaussian sigma and Poisson scale (0-255 units / a multiple of the shot noise): all saturate above
MAX_CHOICES = 256  # entries of kernel_sizes, blur_sizes, kernel_list


def check_param(name: str, values: Any, lo: float, hi: float) -> None:
    """A hand-made batch's parameter (``Degrader(hr, params)``) in ``[lo, hi]`` and finite, as the configs'
    draws are: what sizes an intermediate image is never taken on trust (a ValueError naming it)."""
    t = torch.as_tensor(values, dtype=torch.float64)
    if t.numel() and not (bool(torch.isfinite(t).all()) and lo <= float(t.min()) and float(t.max()) <= hi):
        got = f"[{float(t.min())}, {float(t.max())}]"
        raise ValueError(f"params[{name!r}] must be finite and in [{lo:g}, {hi:g}], got values in {got}")


def set_field(cfg: object, name: str, value: object) -> None:
    object.__setattr__(cfg, name, value)


def _int(cfg: object, name: str, lo: int, hi: int) -> int:
    """The field ``name`` as an exact int in ``[lo, hi]`` (not a bool, not a float): a ValueError naming it."""
    value = check_number(name, getattr(cfg, name), lo, hi, integer=True)
    set_field(cfg, name, value)
    return int(value)


def check_prob(cfg: object, name: str) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} is a probability, a number in [0, 1], got {brief(value)}")
    set_field(cfg, name, float(value))


def check_flag(cfg: object, name: str) -> None:
    if not isinstance(getattr(cfg, name), bool):
        raise ValueError(f"{name} must be true or false, got {brief(getattr(cfg, name))}")


def check_items(name: str, value: object, most: int = MAX_CHOICES) -> tuple:
    if not isinstance(value, (tuple, list)) or not 1 <= len(value) <= most:
        raise ValueError(f"{name} must be a list of 1 to {most} entries, got {brief(value)}")
    return tuple(value)


def check_probs(cfg: object, name: str, n: int) -> None:
    ps = getattr(cfg, name)
    bad = ValueError(f"{name} must be {n} non-negative probabilities summing to 1, got {brief(ps)}")
    if not isinstance(ps, (tuple, list)) or len(ps) != n:
        raise bad
    if any(isinstance(p, bool) or not isinstance(p, (int, float)) for p in ps):
        raise bad
    ps = tuple(check_number(f"{name} entry", p, 0.0, 1.0, integer=False) for p in ps)
    if not math.isclose(math.fsum(ps), 1.0, abs_tol=1e-6):
        raise ValueError(f"{name} must be {n} non-negative probabilities summing to 1, got {ps} (sum {math.fsum(ps):g})")
    set_field(cfg, name, ps)


def check_range(
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
    set_field(cfg, name, r)


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


def check_odd(name: str, size: object, hi: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or size % 2 != 1 or size > hi:
        raise ValueError(f"{name} must be odd, an integer in [1, {hi}] (a centred kernel), got {brief(size)}")
    return size


def check_sizes(cfg: object, name: str, hi: int) -> tuple[int, ...]:
    sizes = tuple(check_odd(f"{name} entry {brief(k)}", k, hi) for k in check_items(name, getattr(cfg, name)))
    set_field(cfg, name, sizes)
    return sizes


def check_scale(cfg: object) -> None:
    """``scale`` and ``gt_size``: exact ints, ``gt_size`` a positive multiple of ``scale``."""
    scale = _int(cfg, "scale", 1, MAX_SCALE)
    check_multiple(_int(cfg, "gt_size", 1, MAX_GT_SIZE), scale, "gt_size")
