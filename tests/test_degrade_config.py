"""Degradation configs: Real-ESRGAN's defaults, one clear error per bad setting, and ``draw_params``'
distributions against the configured ones (chi-square for choices, Kolmogorov-Smirnov for ranges;
fixed seeds, so each p-value is a fixed number: the 1e-3 floor is far below what they give and far
above what a wrong distribution gives at these sample counts)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from wdsr import BSRGANConfig, Degrader, RealESRGANConfig
from wdsr.degrade import draw_params, realesrgan

stats = pytest.importorskip("scipy.stats")
N = 3000
P_MIN = 1e-3

# options/train_realesrnet_x4plus.yml of Real-ESRGAN (v0.3.0), transcribed
YML = {
    "scale": 4, "gt_size": 256, "gt_usm": True, "blur_kernel_size": 21,
    "kernel_list": ("iso", "aniso", "generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso"),
    "kernel_prob": (0.45, 0.25, 0.12, 0.03, 0.12, 0.03), "sinc_prob": 0.1, "blur_sigma": (0.2, 3),
    "betag_range": (0.5, 4), "betap_range": (1, 2), "kernel_prob2": (0.45, 0.25, 0.12, 0.03, 0.12, 0.03),
    "sinc_prob2": 0.1, "blur_sigma2": (0.2, 1.5), "betag_range2": (0.5, 4), "betap_range2": (1, 2),
    "final_sinc_prob": 0.8, "resize_prob": (0.2, 0.7, 0.1), "resize_range": (0.15, 1.5),
    "gaussian_noise_prob": 0.5, "noise_range": (1, 30), "poisson_scale_range": (0.05, 3), "gray_noise_prob": 0.4,
    "jpeg_range": (30, 95), "second_blur_prob": 0.8, "resize_prob2": (0.3, 0.4, 0.3), "resize_range2": (0.3, 1.2),
    "gaussian_noise_prob2": 0.5, "noise_range2": (1, 25), "poisson_scale_range2": (0.05, 2.5),
    "gray_noise_prob2": 0.4, "jpeg_range2": (30, 95),
}  # fmt: skip


def test_defaults_are_train_realesrnet_x4plus() -> None:
    cfg = RealESRGANConfig()
    for name, want in YML.items():
        assert getattr(cfg, name) == want, name
    assert cfg.kernel_sizes == (7, 9, 11, 13, 15, 17, 19, 21) and cfg.final_order_prob == 0.5


BAD_REALESRGAN = [
    ({"kernel_prob": (0.45, 0.25, 0.12, 0.03, 0.12, 0.02)}, "kernel_prob must be 6 non-negative probabilities summing to 1"),
    ({"kernel_prob2": (0.5, 0.5)}, "kernel_prob2 must be 6"),
    ({"resize_prob": (0.2, 0.7, 0.2)}, "resize_prob must be 3 non-negative probabilities summing to 1"),
    ({"kernel_sizes": (7, 8, 9)}, "kernel_sizes entry 8 must be odd"),
    ({"blur_kernel_size": 20}, "blur_kernel_size must be odd"),
    ({"kernel_sizes": (7, 23)}, "kernel size 23 exceeds blur_kernel_size 21"),
    ({"blur_sigma": (3.0, 0.2)}, r"blur_sigma must be \(low, high\) with low <= high"),
    ({"noise_range2": (25.0, 1.0)}, r"noise_range2 must be \(low, high\)"),
    ({"jpeg_range": (95.0, 30.0)}, r"jpeg_range must be \(low, high\)"),
    ({"jpeg_range2": (30.0, 101.0)}, r"jpeg_range2 must lie within \[1.0, 100.0\]"),
    ({"resize_range": (1.1, 1.5)}, "resize_range must contain 1.0"),
    ({"betag_range": (1.5, 4.0)}, "betag_range must contain 1.0"),
    ({"sinc_prob": 1.5}, "sinc_prob is a probability"),
    ({"kernel_list": ("iso", "box", "aniso", "plateau_iso", "plateau_aniso", "generalized_iso")}, "unknown kernel types"),
    ({"gt_size": 250}, "gt_size 250 must be a positive multiple of scale 4"),
    ({"granularity": "pool"}, "granularity must be 'sample' or 'batch'"),
]


@pytest.mark.parametrize(("change", "message"), BAD_REALESRGAN)
def test_bad_realesrgan_config_is_one_clear_error(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RealESRGANConfig(**change)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"blur_sizes": (7, 10)}, "blur_sizes entry 10 must be odd"),
        ({"noise_range": (25, 2)}, r"noise_range must be \(low, high\)"),
        ({"jpeg_prob": -0.1}, "jpeg_prob is a probability"),
        ({"scale": 3, "gt_size": 128}, "gt_size 128 must be a positive multiple of scale 3"),
    ],
)
def test_bad_bsrgan_config_is_one_clear_error(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BSRGANConfig(**change)


def test_bad_degrader_use() -> None:
    with pytest.raises(ValueError, match="granularity must be one of"):
        Degrader(RealESRGANConfig(), granularity="pool")
    with pytest.raises(ValueError, match="granularity='batch' is Real-ESRGAN's"):
        Degrader(BSRGANConfig(), granularity="batch")
    with pytest.raises(ValueError, match="patch_size 66 must be a positive multiple of scale 4"):
        draw_params(RealESRGANConfig(), np.random.default_rng(0), 66)
    with pytest.raises(ValueError, match="uint8"):
        Degrader(RealESRGANConfig())(torch.zeros(1, 3, 64, 64), {})


def test_a_config_names_its_degraders_granularity() -> None:
    """``RealESRGANConfig(granularity="batch")`` (a YAML or a data module passes a config, not a Degrader):
    what ``Degrader(cfg)`` applies unless told otherwise."""
    assert Degrader(RealESRGANConfig()).granularity == "sample"
    assert Degrader(RealESRGANConfig(granularity="batch")).granularity == "batch"
    assert Degrader(RealESRGANConfig(granularity="batch"), granularity="sample").granularity == "sample"


@pytest.fixture(scope="module")
def drawn() -> list[dict[str, torch.Tensor]]:
    """N samples' parameters, each from its own generator as the pipeline seeds them."""
    cfg = RealESRGANConfig()
    return [draw_params(cfg, np.random.default_rng([2024, 0, i, 0]), 256) for i in range(N)]


def _chi2(counts: np.ndarray, probs: tuple[float, ...] | np.ndarray) -> float:
    exp = np.asarray(probs, dtype=np.float64) * counts.sum()
    keep = exp > 0
    assert counts[~keep].sum() == 0  # nothing drawn where the probability is 0
    return float(stats.chisquare(counts[keep], exp[keep]).pvalue)


def _bernoulli(flags: np.ndarray, p: float) -> float:
    return _chi2(np.bincount(flags.astype(int), minlength=2), (1 - p, p))


def _uniform(x: np.ndarray, lo: float, hi: float) -> float:
    return float(stats.kstest(x, stats.uniform(lo, hi - lo).cdf).pvalue)


def test_resize_draws(drawn: list) -> None:
    cfg = RealESRGANConfig()
    scale = np.stack([p["resize_scale"].numpy() for p in drawn])
    for r, probs, (lo, hi) in ((0, cfg.resize_prob, cfg.resize_range), (1, cfg.resize_prob2, cfg.resize_range2)):
        s = scale[:, r]
        kind = np.where(s > 1, 0, np.where(s < 1, 1, 2))  # up, down, keep
        assert _chi2(np.bincount(kind, minlength=3), probs) > P_MIN
        assert _uniform(s[s > 1], 1.0, hi) > P_MIN and _uniform(s[s < 1], lo, 1.0) > P_MIN
    modes = np.stack([p["resize_mode"].numpy() for p in drawn])
    for r in range(3):
        assert _chi2(np.bincount(modes[:, r], minlength=3), (1 / 3,) * 3) > P_MIN


def test_noise_jpeg_and_flag_draws(drawn: list) -> None:
    cfg = RealESRGANConfig()
    col = {k: np.stack([p[k].numpy() for p in drawn]) for k in drawn[0] if not k.startswith(("kernel", "sinc_k"))}
    for r, sfx in ((0, ""), (1, "2")):
        assert _bernoulli(col["gaussian"][:, r], getattr(cfg, "gaussian_noise_prob" + sfx)) > P_MIN
        assert _bernoulli(col["gray_noise"][:, r], getattr(cfg, "gray_noise_prob" + sfx)) > P_MIN
        assert _uniform(col["noise_sigma"][:, r], *getattr(cfg, "noise_range" + sfx)) > P_MIN
        assert _uniform(col["poisson_scale"][:, r], *getattr(cfg, "poisson_scale_range" + sfx)) > P_MIN
        assert _uniform(col["jpeg_quality"][:, r], *getattr(cfg, "jpeg_range" + sfx)) > P_MIN
    assert _bernoulli(col["second_blur"], cfg.second_blur_prob) > P_MIN
    assert _bernoulli(col["sinc_first"], cfg.final_order_prob) > P_MIN
    assert len(np.unique(col["noise_seed"])) == 2 * N  # every round of every sample seeds its own noise


def _beta_ok(betas: np.ndarray, lo: float, hi: float) -> bool:
    """Real-ESRGAN's shape draw: half U(lo, 1) (all 1.0 when lo = 1, as betap's default), half U(1, hi)."""
    low, high = betas[betas <= 1], betas[betas > 1]
    low_ok = np.all(low == 1) if lo == 1 else _uniform(low, lo, 1.0) > P_MIN
    return bool(_bernoulli(betas <= 1, 0.5) > P_MIN and low_ok and _uniform(high, 1.0, hi) > P_MIN)


def test_kernel_draws() -> None:
    """The kernel recipes drawn first by draw_params: kinds, sizes, sigmas, angles, betas, cutoffs."""
    cfg = RealESRGANConfig()
    specs = [realesrgan.draw_kernel_specs(cfg, np.random.default_rng([7, i])) for i in range(N)]
    kinds = (*cfg.kernel_list, "sinc")
    for r, sfx in ((0, ""), (1, "2")):
        sp = [s[r] for s in specs]
        sinc_p = getattr(cfg, "sinc_prob" + sfx)
        probs = [q * (1 - sinc_p) for q in getattr(cfg, "kernel_prob" + sfx)] + [sinc_p]
        assert _chi2(np.bincount([kinds.index(s.kind) for s in sp], minlength=7), probs) > P_MIN
        assert _chi2(np.bincount([cfg.kernel_sizes.index(s.size) for s in sp], minlength=8), (1 / 8,) * 8) > P_MIN
        mixed = [s for s in sp if s.kind != "sinc"]
        assert _uniform(np.array([s.sig_x for s in mixed]), *getattr(cfg, "blur_sigma" + sfx)) > P_MIN
        aniso = [s for s in mixed if s.kind.endswith("aniso")]
        assert _uniform(np.array([s.sig_y for s in aniso]), *getattr(cfg, "blur_sigma" + sfx)) > P_MIN
        assert _uniform(np.array([s.theta for s in aniso]), -math.pi, math.pi) > P_MIN
        assert all(s.sig_y == s.sig_x and s.theta == 0 for s in mixed if not s.kind.endswith("aniso"))
        for prefix, rng_name in (("generalized", "betag_range"), ("plateau", "betap_range")):
            betas = np.array([s.beta for s in mixed if s.kind.startswith(prefix)])
            assert _beta_ok(betas, *getattr(cfg, rng_name + sfx)), (prefix, sfx)
    all_sinc = RealESRGANConfig(sinc_prob=1.0, sinc_prob2=1.0)  # enough sinc draws to see the cutoffs
    sp = [s for i in range(N) for s in realesrgan.draw_kernel_specs(all_sinc, np.random.default_rng([8, i]))[:2]]
    assert all(s.kind == "sinc" for s in sp)
    small = np.array([s.omega for s in sp if s.size < 13])
    large = np.array([s.omega for s in sp if s.size >= 13])
    assert _uniform(small, math.pi / 3, math.pi) > P_MIN and _uniform(large, math.pi / 5, math.pi) > P_MIN
    final = [s[2] for s in specs]
    assert _bernoulli(np.array([s is not None for s in final]), cfg.final_sinc_prob) > P_MIN
    assert _uniform(np.array([s.omega for s in final if s is not None]), math.pi / 3, math.pi) > P_MIN


def test_draws_use_only_the_given_generator() -> None:
    cfg = RealESRGANConfig()
    np.random.seed(1)
    before = np.random.get_state()[1].copy()
    a = draw_params(cfg, np.random.default_rng([1, 2]), 256)
    b = draw_params(cfg, np.random.default_rng([1, 2]), 256)
    c = draw_params(cfg, np.random.default_rng([1, 3]), 256)
    assert np.array_equal(np.random.get_state()[1], before)
    assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)
    assert dataclasses.is_dataclass(cfg) and a["kernel1"].dtype == torch.float32


def test_bsrgan_draws() -> None:
    cfg = BSRGANConfig()
    ps = [draw_params(cfg, np.random.default_rng([3, i]), 256) for i in range(N)]
    order = np.stack([p["order"].numpy() for p in ps])
    assert all(list(row).index(2) < list(row).index(3) for row in order)  # down-sampling 2 before 3
    assert all(sorted(row) == list(range(7)) for row in order)
    assert _bernoulli(np.array([int(p["pre_down"]) > 0 for p in ps]), cfg.scale2_prob) > P_MIN
    assert _bernoulli(np.array([bool(p["jpeg"]) for p in ps]), cfg.jpeg_prob) > P_MIN
    assert _bernoulli(np.array([bool(p["down2_resize"]) for p in ps]), cfg.down2_prob) > P_MIN
    q = np.stack([p["jpeg_quality"].numpy() for p in ps]).astype(int).ravel()
    assert _chi2(np.bincount(q - 30, minlength=66), (1 / 66,) * 66) > P_MIN
    f = [p["noise_factor"].numpy() for p in ps]
    kind = [
        0 if np.count_nonzero(m) == 3 and np.allclose(m, np.diag(np.diag(m))) else 1 if np.count_nonzero(m) == 3 else 2 for m in f
    ]
    assert _chi2(np.bincount(kind, minlength=3), (0.4, 0.4, 0.2)) > P_MIN  # colour, grey, correlated
