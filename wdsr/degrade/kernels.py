"""Blur kernels of Real-ESRGAN's degradation model, as numpy functions of explicit parameters.

The shapes (Gaussian, generalized Gaussian, plateau; isotropic or rotated) and the circular low-pass
("sinc") kernel follow the formulas of Wang et al. 2021 (Real-ESRGAN, section 3.1); the float operations
are ordered like BasicSR's ``basicsr/data/degradations.py`` so the kernels are bit-identical to its
(tests/test_degrade_equivalence.py). Random draws take an explicit ``numpy.random.Generator``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

KERNEL_TYPES = ("iso", "aniso", "generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso")

# Cephes' rational approximations of the Bessel function J1 (Moshier, Cephes Math Library 2.8, j1.c),
# which SciPy's scipy.special.j1 evaluates too: the sinc kernel needs J1, and scipy is no runtime dependency.
_RP = (-8.99971225705559398224e8, 4.52228297998194034323e11, -7.27494245221818276015e13, 3.68295732863852883286e15)
_RQ = (6.20836478118054335476e2, 2.56987256757748830383e5, 8.35146791431949253037e7, 2.21511595479792499675e10,
       4.74914122079991414898e12, 7.84369607876235854894e14, 8.95222336184627338078e16, 5.32278620332680085395e18)  # fmt: skip
_PP = (7.62125616208173112003e-4, 7.31397056940917570436e-2, 1.12719608129684925192e0, 5.11207951146807644818e0,
       8.42404590141772420927e0, 5.21451598682361504063e0, 1.00000000000000000254e0)  # fmt: skip
_PQ = (5.71323128072548699714e-4, 6.88455908754495404082e-2, 1.10514232634061696926e0, 5.07386386128601488557e0,
       8.39985554327604159757e0, 5.20982848682361821619e0, 9.99999999999999997461e-1)  # fmt: skip
_QP = (5.10862594750176621635e-2, 4.98213872951233449420e0, 7.58238284132545283818e1, 3.66779609360150777800e2,
       7.10856304998926107277e2, 5.97489612400613639965e2, 2.11688757100572135698e2, 2.52070205858023719784e1)  # fmt: skip
_QQ = (7.42373277035675149943e1, 1.05644886038262816351e3, 4.98641058337653607651e3, 9.56231892404756170795e3,
       7.99704160447350683650e3, 2.82619278517639096600e3, 3.36093607810698293419e2)  # fmt: skip
_Z1, _Z2 = 1.46819706421238932572e1, 4.92184563216946036703e1
_THPIO4, _SQ2OPI = 2.35619449019234492885, 0.79788456080286535588


def _horner(z: np.ndarray, coef: tuple[float, ...], monic: bool = False) -> np.ndarray:
    """Polynomial in ``z`` with coefficients highest power first (``monic``: an implicit leading 1)."""
    acc = z + coef[0] if monic else np.full_like(z, coef[0])
    for c in coef[1:]:
        acc = acc * z + c
    return acc


def bessel_j1(x: np.ndarray) -> np.ndarray:
    """Bessel function of the first kind, order one, for ``x >= 0`` (float64)."""
    x = np.asarray(x, dtype=np.float64)
    small = x <= 5.0
    xs = np.where(small, x, 0.0)
    z = xs * xs
    near = _horner(z, _RP) / _horner(z, _RQ, monic=True) * xs * (z - _Z1) * (z - _Z2)
    xl = np.where(small, 5.0, x)
    w = 5.0 / xl
    z = w * w
    p = _horner(z, _PP) / _horner(z, _PQ)
    q = _horner(z, _QP) / _horner(z, _QQ, monic=True)
    xn = xl - _THPIO4
    far = (p * np.cos(xn) - w * q * np.sin(xn)) * _SQ2OPI / np.sqrt(xl)
    return np.where(small, near, far)


@lru_cache(maxsize=32)
def _grid(size: int) -> np.ndarray:
    """(size, size, 2) offsets from the centre, x then y (read-only, cached per size)."""
    ax = np.arange(-size // 2 + 1.0, size // 2 + 1.0)
    xx, yy = np.meshgrid(ax, ax)
    grid = np.stack([xx, yy], axis=-1)
    grid.flags.writeable = False
    return grid


def _covariance(sig_x: float, sig_y: float, theta: float, isotropic: bool) -> np.ndarray:
    if isotropic:
        return np.array([[sig_x**2, 0], [0, sig_x**2]])
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    return np.dot(rot, np.dot(np.array([[sig_x**2, 0], [0, sig_y**2]]), rot.T))


def _mahalanobis2(size: int, sig_x: float, sig_y: float, theta: float, isotropic: bool) -> np.ndarray:
    """Squared Mahalanobis distance of every kernel tap from the centre."""
    grid = _grid(size)
    inv = np.linalg.inv(_covariance(sig_x, sig_y, theta, isotropic))
    return np.sum(np.dot(grid, inv) * grid, 2)


def _check_size(size: int) -> None:
    if size % 2 != 1 or size < 1:
        raise ValueError(f"kernel size must be odd and positive, got {size}")


def bivariate_gaussian(size: int, sig_x: float, sig_y: float, theta: float, isotropic: bool = True) -> np.ndarray:
    """Normalised Gaussian kernel; isotropic uses ``sig_x`` alone, else rotated by ``theta`` radians."""
    _check_size(size)
    k = np.exp(-0.5 * _mahalanobis2(size, sig_x, sig_y, theta, isotropic))
    return k / np.sum(k)


def bivariate_generalized_gaussian(
    size: int, sig_x: float, sig_y: float, theta: float, beta: float, isotropic: bool = True
) -> np.ndarray:
    """exp(-0.5 d^(2 beta)), normalised; beta = 1 is the Gaussian (Pascal et al. 2013)."""
    _check_size(size)
    k = np.exp(-0.5 * np.power(_mahalanobis2(size, sig_x, sig_y, theta, isotropic), beta))
    return k / np.sum(k)


def bivariate_plateau(size: int, sig_x: float, sig_y: float, theta: float, beta: float, isotropic: bool = True) -> np.ndarray:
    """1 / (1 + d^(2 beta)), normalised: a flat top with heavy tails."""
    _check_size(size)
    k = np.reciprocal(np.power(_mahalanobis2(size, sig_x, sig_y, theta, isotropic), beta) + 1)
    return k / np.sum(k)


def circular_lowpass_kernel(cutoff: float, size: int, pad_to: int = 0) -> np.ndarray:
    """2-D circularly symmetric ideal low-pass ("sinc") kernel, cutoff in radians (pi = Nyquist),
    normalised, zero-padded to ``pad_to`` when that is larger."""
    _check_size(size)
    c = (size - 1) / 2
    i, j = np.meshgrid(np.arange(size, dtype=np.float64), np.arange(size, dtype=np.float64), indexing="ij")
    r = np.sqrt((i - c) ** 2 + (j - c) ** 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        k = cutoff * bessel_j1(cutoff * r) / (2 * np.pi * r)
    k[(size - 1) // 2, (size - 1) // 2] = cutoff**2 / (4 * np.pi)
    return pad_kernel(k / np.sum(k), pad_to)


@dataclass(frozen=True)
class KernelSpec:
    """One drawn kernel: ``kind`` is a KERNEL_TYPES name or "sinc" (then ``omega`` is its cutoff)."""

    kind: str
    size: int
    sig_x: float = 0.0
    sig_y: float = 0.0
    theta: float = 0.0
    beta: float = 1.0
    omega: float = 0.0


def build_kernel(spec: KernelSpec, pad_to: int) -> np.ndarray:
    """The float64 kernel of ``spec``, centred and zero-padded to ``pad_to`` x ``pad_to``."""
    iso = spec.kind.endswith("iso") and not spec.kind.endswith("aniso")
    if spec.kind == "sinc":
        k = circular_lowpass_kernel(spec.omega, spec.size)
    elif spec.kind in ("iso", "aniso"):
        k = bivariate_gaussian(spec.size, spec.sig_x, spec.sig_y, spec.theta, isotropic=iso)
    elif spec.kind.startswith("generalized"):
        k = bivariate_generalized_gaussian(spec.size, spec.sig_x, spec.sig_y, spec.theta, spec.beta, isotropic=iso)
    elif spec.kind.startswith("plateau"):
        k = bivariate_plateau(spec.size, spec.sig_x, spec.sig_y, spec.theta, spec.beta, isotropic=iso)
    else:
        raise ValueError(f"unknown kernel kind {spec.kind!r}; expected one of {KERNEL_TYPES + ('sinc',)}")
    return pad_kernel(k, pad_to)


def pad_kernel(k: np.ndarray, size: int) -> np.ndarray:
    """``k`` centred in a ``size`` x ``size`` array of zeros (no copy when it has that size)."""
    if k.shape[0] >= size:
        return k
    out = np.zeros((size, size), dtype=k.dtype)
    p = (size - k.shape[0]) // 2
    out[p : p + k.shape[0], p : p + k.shape[1]] = k
    return out


def pick(rng: np.random.Generator, probs: tuple[float, ...]) -> int:
    """An index drawn with probabilities ``probs`` (inverse CDF of one uniform; ~20x cheaper than
    ``rng.choice(p=...)`` for a handful of options, which matters at ~10 draws per sample)."""
    u, acc = rng.uniform() * math.fsum(probs), 0.0
    for i, p in enumerate(probs):
        acc += p
        if u < acc:
            return i
    return max(i for i, p in enumerate(probs) if p > 0)  # u rounded onto the total


def _beta(rng: np.random.Generator, lo: float, hi: float) -> float:
    """Real-ESRGAN's shape draw: half the mass below 1 (uniform on [lo, 1]), half above (uniform on [1, hi])."""
    return float(rng.uniform(lo, 1.0) if rng.uniform() < 0.5 else rng.uniform(1.0, hi))


def draw_mixed_kernel(
    rng: np.random.Generator,
    kinds: tuple[str, ...],
    probs: tuple[float, ...],
    size: int,
    sigma: tuple[float, float],
    betag: tuple[float, float],
    betap: tuple[float, float],
    rotation: tuple[float, float] = (-math.pi, math.pi),
) -> KernelSpec:
    """``random_mixed_kernels``' distribution (no multiplicative kernel noise, as Real-ESRGAN trains):
    a kind by ``probs``, sigma_x (and sigma_y, theta when anisotropic) uniform, beta as ``_beta``."""
    kind = kinds[pick(rng, probs)]
    sig_x = float(rng.uniform(*sigma))
    sig_y, theta = sig_x, 0.0
    if kind.endswith("aniso"):
        sig_y, theta = float(rng.uniform(*sigma)), float(rng.uniform(*rotation))
    beta = 1.0
    if kind.startswith("generalized"):
        beta = _beta(rng, *betag)
    elif kind.startswith("plateau"):
        beta = _beta(rng, *betap)
    return KernelSpec(kind, size, sig_x, sig_y, theta, beta)


def random_mixed_kernel(rng: np.random.Generator, *args: object, **kwargs: object) -> np.ndarray:
    """``random_mixed_kernels`` with explicit randomness: :func:`draw_mixed_kernel`, built unpadded."""
    spec = draw_mixed_kernel(rng, *args, **kwargs)  # type: ignore[arg-type]
    return build_kernel(spec, spec.size)
