"""wdsr.degrade against BasicSR 1.4.2's own functions, given identical parameters and draws.

torchvision is a stub here: the registry's torchvision wheels need a CUDA torch and this machine has
torch+cpu. basicsr imports torchvision at module level; the functions compared use none of it except
``rgb_to_grayscale`` (grey Poisson noise), which the stub implements with torchvision's published formula
(ITU-R 601-2 luma, weights 0.2989/0.587/0.114); every other stub function raises. The stub lives in
``sys.modules`` only while basicsr is imported, and numpy's error state, which basicsr's import changes
for the whole process, is restored.

Exactness: kernels ``np.array_equal``, torch ops ``torch.equal`` on CPU with TF32 off. ``allclose``
(1e-12) only for BSRGAN's kernels against SciPy (BSRGAN itself is not installable here): its spline
evaluation and pdf compute the same values with their float operations in another order."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import sys
import types
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import photos
from wdsr import BSRGANConfig, Degrader, RealESRGANConfig
from wdsr.degrade import collate_params, draw_params, kernels, ops, realesrgan
from wdsr.degrade.bsrgan import anisotropic_gaussian, fspecial_gaussian, shift_kernel
from wdsr.degrade.jpeg import DiffJPEG

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("basicsr") is None, reason="basicsr: the Makefile installs it (--no-deps)"),
    # BasicSR's own noise: its sinc kernel divides by zero at the centre (then overwrites it), and
    # basicsr.metrics imports a deprecated scipy namespace
    pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:Please import `convolve`:DeprecationWarning"),
]


def _stub_rgb_to_grayscale(img: torch.Tensor, num_output_channels: int = 1) -> torch.Tensor:
    r, g, b = img.unbind(dim=-3)
    return (0.2989 * r + 0.587 * g + 0.114 * b).to(img.dtype).unsqueeze(dim=-3)


def _raise(*a: object, **k: object) -> None:
    raise NotImplementedError("torchvision stub")


@contextlib.contextmanager
def _torchvision_stub() -> Iterator[None]:
    names = ["torchvision", "torchvision.transforms", "torchvision.transforms.functional",
             "torchvision.transforms.functional_tensor", "torchvision.models", "torchvision.models.vgg",
             "torchvision.utils"]  # fmt: skip
    mods = {n: types.ModuleType(n) for n in names}
    mods["torchvision"].__version__ = "0.0+stub"  # type: ignore[attr-defined]
    mods["torchvision.transforms.functional"].normalize = _raise  # type: ignore[attr-defined]
    mods["torchvision.transforms.functional_tensor"].rgb_to_grayscale = _stub_rgb_to_grayscale  # type: ignore[attr-defined]
    mods["torchvision.utils"].make_grid = _raise  # type: ignore[attr-defined]
    mods["torchvision.models"].vgg = mods["torchvision.models.vgg"]  # type: ignore[attr-defined]
    saved = {n: sys.modules[n] for n in names if n in sys.modules}
    err = np.geterr()
    sys.modules.update(mods)
    try:
        yield
    finally:
        np.seterr(**err)
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def ref() -> types.SimpleNamespace:
    """BasicSR's degradation functions, imported with the torchvision stub."""
    with _torchvision_stub():
        from basicsr.data import degradations
        from basicsr.utils.diffjpeg import DiffJPEG as RefJPEG
        from basicsr.utils.img_process_util import USMSharp as RefUSM
        from basicsr.utils.img_process_util import filter2D
    return types.SimpleNamespace(deg=degradations, jpeg=RefJPEG, usm=RefUSM, filter2D=filter2D)


@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _batch(b: int, size: int, seed: int = 0) -> torch.Tensor:
    """uint8 [b, 3, size, size] crops of real photos."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(b):
        img = photos()[i % 4]
        y, x = (int(v) for v in rng.integers(0, [img.shape[0] - size, img.shape[1] - size]))
        out.append(torch.from_numpy(np.ascontiguousarray(img[y : y + size, x : x + size])).permute(2, 0, 1))
    return torch.stack(out)


def test_kernels_bit_equal(ref: types.SimpleNamespace) -> None:
    rng = np.random.default_rng(11)
    for _ in range(60):
        size = int(rng.choice(np.arange(7, 22, 2)))
        sx, sy, th, beta = rng.uniform(0.2, 3), rng.uniform(0.2, 3), rng.uniform(-math.pi, math.pi), rng.uniform(0.5, 4)
        for iso in (True, False):
            assert np.array_equal(
                kernels.bivariate_gaussian(size, sx, sy, th, iso), ref.deg.bivariate_Gaussian(size, sx, sy, th, isotropic=iso)
            )
            assert np.array_equal(
                kernels.bivariate_generalized_gaussian(size, sx, sy, th, beta, iso),
                ref.deg.bivariate_generalized_Gaussian(size, sx, sy, th, beta, isotropic=iso),
            )
            assert np.array_equal(
                kernels.bivariate_plateau(size, sx, sy, th, beta, iso),
                ref.deg.bivariate_plateau(size, sx, sy, th, beta, isotropic=iso),
            )
        omega = rng.uniform(math.pi / 5, math.pi)
        assert np.array_equal(kernels.circular_lowpass_kernel(omega, size, 21), ref.deg.circular_lowpass_kernel(omega, size, 21))


def test_bessel_j1_equals_scipy() -> None:
    """Our Cephes J1 (the sinc kernel's) is bit-equal to scipy.special.j1 over both branches."""
    special = pytest.importorskip("scipy.special")
    x = np.concatenate([np.linspace(0, 5, 20001), np.random.default_rng(0).uniform(5, 80, 20000)])
    assert np.array_equal(kernels.bessel_j1(x), special.j1(x))


def test_draw_params_kernels_are_the_references(ref: types.SimpleNamespace) -> None:
    """The kernels draw_params ships are BasicSR's builders applied to the drawn recipes, padded to 21."""
    cfg = RealESRGANConfig()
    builders = {"iso": ref.deg.bivariate_Gaussian, "aniso": ref.deg.bivariate_Gaussian}
    for j in range(40):
        specs = realesrgan.draw_kernel_specs(cfg, np.random.default_rng([5, j]))
        p = draw_params(cfg, np.random.default_rng([5, j]), 256)
        for spec, key in zip(specs, ("kernel1", "kernel2", "sinc_kernel"), strict=True):
            if spec is None:
                want = np.zeros((21, 21))
                want[10, 10] = 1
            elif spec.kind == "sinc":
                want = ref.deg.circular_lowpass_kernel(spec.omega, spec.size, pad_to=21)
            else:
                iso = not spec.kind.endswith("aniso")
                if spec.kind in builders:
                    k = builders[spec.kind](spec.size, spec.sig_x, spec.sig_y, spec.theta, isotropic=iso)
                elif spec.kind.startswith("generalized"):
                    k = ref.deg.bivariate_generalized_Gaussian(
                        spec.size, spec.sig_x, spec.sig_y, spec.theta, spec.beta, isotropic=iso
                    )
                else:
                    k = ref.deg.bivariate_plateau(spec.size, spec.sig_x, spec.sig_y, spec.theta, spec.beta, isotropic=iso)
                pad = (21 - spec.size) // 2
                want = np.pad(k, ((pad, pad), (pad, pad)))
            assert torch.equal(p[key], torch.FloatTensor(want)), (j, key, spec)


@pytest.mark.parametrize("shape", [(3, 64, 64), (2, 37, 50)])
def test_filter2d_and_jpeg_equal(ref: types.SimpleNamespace, shape: tuple[int, int, int]) -> None:
    g = torch.Generator().manual_seed(1)
    b, h, w = shape
    x = torch.rand(b, 3, h, w, generator=g)
    k = torch.rand(b, 21, 21, generator=g)
    k /= k.sum((1, 2), keepdim=True)
    assert torch.equal(ops.filter2d(x, k), ref.filter2D(x, k))  # a kernel per sample
    assert torch.equal(ops.filter2d(x, k[:1]), ref.filter2D(x, k[:1]))  # one shared kernel
    quality = torch.tensor([30.0, 49.5, 95.0][:b])
    assert torch.equal(DiffJPEG()(x, quality), ref.jpeg(differentiable=False)(x, quality=quality.clone()))


@pytest.mark.parametrize(("b", "size"), [(1, 64), (3, 80), (2, 96)])
def test_usm_equal(ref: types.SimpleNamespace, b: int, size: int) -> None:
    """Ours runs the 51 x 51 blur as a kernel per sample (the faster depthwise path), BasicSR as one
    shared kernel: the sums come out bit-equal on CPU, at every batch size."""
    x = _batch(b, size).float() / 255.0
    assert torch.equal(ops.USMSharp()(x), ref.usm()(x))


@pytest.mark.parametrize("gray", [(0.0, 0.0, 0.0), (1.0, 0.0, 1.0), (1.0, 1.0, 1.0)])
def test_noise_equal(ref: types.SimpleNamespace, gray: tuple[float, ...]) -> None:
    """Same draws: our explicit generator against BasicSR's global RNG seeded alike."""
    x = _batch(3, 48).float() / 255.0
    g = torch.tensor(gray)
    sigma, scale = torch.tensor([1.0, 12.5, 30.0]), torch.tensor([0.05, 1.0, 3.0])
    torch.manual_seed(7)
    want = ref.deg.add_gaussian_noise_pt(x, sigma=sigma, gray_noise=g, clip=True, rounds=False)
    color, gray_map = ops.normal_draws(x, g, torch.Generator().manual_seed(7))
    assert torch.equal(ops.gaussian_noise(x, sigma, g, color, gray_map), want)
    torch.manual_seed(8)
    want = ref.deg.add_poisson_noise_pt(x, scale=scale, gray_noise=g, clip=True, rounds=False)
    assert torch.equal(ops.poisson_noise(x, scale, g, torch.Generator().manual_seed(8)), want)


def _replay_head(ref: types.SimpleNamespace, gt: torch.Tensor, p: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``RealESRNetModel.feed_data`` (gt_usm: True) up to the first blur, with BasicSR's functions."""
    gt = ref.usm()(gt)
    return ref.filter2D(gt, p["kernel1"]), gt


def _replay_tail(ref: types.SimpleNamespace, out: torch.Tensor, p: dict[str, torch.Tensor], h: int, w: int) -> torch.Tensor:
    """The rest of ``feed_data``'s order, BasicSR's functions, our per-batch draws (row 0) in place of
    its ``random``/``np.random``/``torch.rand`` calls; no crop, no pool. DiffJPEG returns a channels-last
    view (kept by the later resizes), which BasicSR's filter2D cannot ``view`` on CPU: it gets contiguous
    copies (same values)."""
    mode = [ops.RESIZE_MODES[m] for m in p["resize_mode"][0].tolist()]
    scale, seeds = p["resize_scale"][0].tolist(), p["noise_seed"][0].tolist()
    jpeger = ref.jpeg(differentiable=False)

    def noise(out: torch.Tensor, r: int) -> torch.Tensor:
        torch.manual_seed(seeds[r])
        gray = p["gray_noise"][:, r].float()
        if bool(p["gaussian"][0, r]):
            return ref.deg.add_gaussian_noise_pt(out, sigma=p["noise_sigma"][:, r], gray_noise=gray, clip=True, rounds=False)
        return ref.deg.add_poisson_noise_pt(out, scale=p["poisson_scale"][:, r], gray_noise=gray, clip=True, rounds=False)

    out = F.interpolate(out, scale_factor=scale[0], mode=mode[0])
    out = noise(out, 0)
    out = jpeger(torch.clamp(out, 0, 1), quality=p["jpeg_quality"][:, 0].clone())
    if bool(p["second_blur"][0]):
        out = ref.filter2D(out.contiguous(), p["kernel2"])
    out = F.interpolate(out, size=(int(h / 4 * scale[1]), int(w / 4 * scale[1])), mode=mode[1])
    out = noise(out, 1)
    if bool(p["sinc_first"][0]):
        out = F.interpolate(out, size=(h // 4, w // 4), mode=mode[2])
        out = ref.filter2D(out.contiguous(), p["sinc_kernel"])
        out = jpeger(torch.clamp(out, 0, 1), quality=p["jpeg_quality"][:, 1].clone())
    else:
        out = jpeger(torch.clamp(out, 0, 1), quality=p["jpeg_quality"][:, 1].clone())
        out = F.interpolate(out, size=(h // 4, w // 4), mode=mode[2])
        out = ref.filter2D(out.contiguous(), p["sinc_kernel"])
    return torch.clamp((out * 255.0).round(), 0, 255) / 255.0


# per-batch draws forced in row 0: (scales, modes, gaussian per round, second blur, sinc first)
BRANCHES = [
    ((1.37, 0.61), (0, 1, 2), (True, False), True, True),
    ((0.23, 1.0), (2, 0, 1), (False, True), False, False),
    ((1.0, 1.13), (1, 2, 0), (True, True), True, False),
    ((0.8, 0.35), (2, 2, 2), (False, False), False, True),
]


@pytest.mark.parametrize("branch", BRANCHES)
def test_batch_pipeline_equals_feed_data(ref: types.SimpleNamespace, branch: tuple) -> None:
    cfg = RealESRGANConfig()
    hr = _batch(3, 96, seed=3)
    params = collate_params([draw_params(cfg, np.random.default_rng([9, j]), 96) for j in range(3)])
    scales, modes, gaussian, blur2, sinc_first = branch
    params["resize_scale"][0] = torch.tensor(scales, dtype=torch.float64)
    params["resize_mode"][0] = torch.tensor(modes)
    params["gaussian"][0] = torch.tensor(gaussian)
    params["second_blur"][0], params["sinc_first"][0] = blur2, sinc_first
    params["gray_noise"][:, 0] = torch.tensor([True, False, True])
    params["gray_noise"][:, 1] = torch.tensor([False, False, True])
    lr, hr_out = Degrader(cfg, granularity="batch")(hr, params)
    blurred, want_hr = _replay_head(ref, hr.float() / 255.0, params)
    want_lr = _replay_tail(ref, blurred, params, 96, 96)
    assert lr.dtype == hr_out.dtype == torch.float32 and lr.shape == (3, 3, 24, 24)
    assert torch.equal(hr_out, want_hr)
    assert torch.equal(lr, want_lr)


def test_sample_mode_is_each_sample_alone(ref: types.SimpleNamespace) -> None:
    """Per-sample granularity: feed_data's sharpening and first blur on the batch (a kernel per sample,
    as it does), then the rest on each sample alone with its own draws; an LR does not depend on the
    batch it travels in (order, neighbours)."""
    cfg = RealESRGANConfig()
    hr = _batch(3, 80, seed=4)
    params = collate_params([draw_params(cfg, np.random.default_rng([2, j]), 80) for j in range(3)])
    lr, _ = Degrader(cfg)(hr, params)
    blurred, _ = _replay_head(ref, hr.float() / 255.0, params)
    for i in range(3):
        row = {k: v[i : i + 1] for k, v in params.items()}
        assert torch.equal(lr[i : i + 1], _replay_tail(ref, blurred[i : i + 1], row, 80, 80))
    perm = torch.tensor([2, 0, 1])
    lr_perm, _ = Degrader(cfg)(hr[perm], {k: v[perm] for k, v in params.items()})
    assert torch.equal(lr_perm, lr[perm])


def test_degrader_fp32_under_autocast() -> None:
    cfg = RealESRGANConfig()
    hr = _batch(2, 80)
    params = collate_params([draw_params(cfg, np.random.default_rng([1, j]), 80) for j in range(2)])
    plain = Degrader(cfg)(hr, params)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = Degrader(cfg)(hr, params)
    assert all(t.dtype == torch.float32 for t in cast) and all(torch.equal(a, b) for a, b in zip(plain, cast, strict=True))


def test_bsrgan_shift_is_scipys_interp2d_replacement() -> None:
    """interp2d(x, y, k)(x + s, y + s) as SciPy's transition guide rewrites it: RectBivariateSpline
    on the transposed grid, linear (kx = ky = 1)."""
    interpolate = pytest.importorskip("scipy.interpolate")
    k = fspecial_gaussian(25, 1.7)
    n = np.arange(25.0)
    for sf in (2, 3, 4):
        s = np.clip(n + (sf - 1) * 0.5, 0, 24)
        want = interpolate.RectBivariateSpline(n, n, k.T, kx=1, ky=1)(s, s).T
        np.testing.assert_allclose(shift_kernel(k, sf), want, rtol=0, atol=1e-12)


def test_bsrgan_anisotropic_is_the_gaussian_pdf() -> None:
    """BSRGAN's ``gm_blur_kernel``: the normalised N(0, V D V^-1) density at the taps (allclose: the
    pdf's normalising constant and log-space evaluation order differ from our direct exp)."""
    stats = pytest.importorskip("scipy.stats")
    theta, l1, l2 = 0.7, 6.0, 1.5
    v = np.array([math.cos(theta), math.sin(theta)])
    basis = np.array([[v[0], v[1]], [v[1], -v[0]]])
    cov = basis @ np.diag([l1, l2]) @ np.linalg.inv(basis)
    r = np.arange(15) - 7.0
    want = np.array([[stats.multivariate_normal.pdf([cx, cy], mean=[0, 0], cov=cov) for cx in r] for cy in r])
    np.testing.assert_allclose(anisotropic_gaussian(15, theta, l1, l2), want / want.sum(), rtol=0, atol=1e-12)


def test_bsrgan_degrader_shapes_and_determinism() -> None:
    cfg = BSRGANConfig()
    hr = _batch(3, 128, seed=5)
    params = collate_params([draw_params(cfg, np.random.default_rng([3, j]), 128) for j in range(3)])
    lr, hr_out = Degrader(cfg)(hr, params)
    assert lr.shape == (3, 3, 32, 32) and lr.dtype == torch.float32 and torch.equal(hr_out, hr.float() / 255.0)
    assert torch.equal(Degrader(cfg)(hr, params)[0], lr)
    assert torch.equal(lr * 255, (lr * 255).round())  # the last step is an 8-bit JPEG
