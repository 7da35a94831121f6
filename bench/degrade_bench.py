"""Real-world degradations: what a worker pays per sample, and what the Degrader costs per batch.

    .venv/bin/python -m bench.degrade_bench [--device cpu|cuda] [--batches 3] [--stream SECONDS]

Worker: ``draw_params`` for one 256^2 sample (every draw and the three 21 x 21 kernels; target <= 1 ms),
alone and with the per-sample ``numpy.random.default_rng([seed, epoch, key, j])`` the pipeline makes.
Device: ``Degrader`` on a batch of 12 x 256^2 real-photo patches (Real-ESRGAN per sample and per batch,
BSRGAN, arbitrary scale at row 0's draw), then the Real-ESRGAN ops one by one on the same batch; the best of
``--batches`` after a warm-up (robust to a shared machine), CUDA synchronised.
Stream (``--stream S``): the stream bench's 4K x4 QOI shards through ``wdsr bench``'s harness, 1 worker,
k = 16, HR patch 256, batch 12, S seconds each: stored LR against ``degrade=`` (HR patches + parameters
per patch; the Degrader is the device's, not run here), alternating twice, medians.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import machine_line, md_table, parser, real_photos, report, shards
from wdsr.degrade import ArbitraryScaleConfig, BSRGANConfig, Degrader, RealESRGANConfig, collate_params, draw_params, ops
from wdsr.degrade.jpeg import DiffJPEG

B, SIZE = 12, 256


def worker_us(cfg: RealESRGANConfig | BSRGANConfig | ArbitraryScaleConfig, n: int = 2000) -> tuple[float, float]:
    """Mean us per sample: draw_params given a generator, and generator creation + draw_params."""
    rngs = [np.random.default_rng([0, 1, i, 0]) for i in range(n)]
    t0 = time.perf_counter()
    for r in rngs:
        draw_params(cfg, r, SIZE)
    given = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for i in range(n):
        draw_params(cfg, np.random.default_rng([0, 1, i, 0]), SIZE)
    return given, (time.perf_counter() - t0) / n * 1e6


def stream_rows(out: Path, seconds: float) -> str:
    """patches/s of the loader alone (1 worker): stored LR, and degrade= of Real-ESRGAN and BSRGAN."""
    import statistics

    from wdsr.tools.bench import bench_stream

    url = shards(out, 128)["qoi"]
    modes: dict[str, Any] = {"stored LR": None, "Real-ESRGAN": RealESRGANConfig(), "BSRGAN": BSRGANConfig()}
    got: dict[str, list[float]] = {name: [] for name in modes}
    for r in range(2):
        for name in list(modes) if r % 2 == 0 else list(modes)[::-1]:
            extra = {} if modes[name] is None else {"degrade": modes[name]}
            res = bench_stream(url, workers=1, batch_size=B, patches_per_image=16, patch_size=SIZE, seconds=seconds, **extra)
            got[name].append(res.patches_per_s)
    stored = statistics.median(got["stored LR"])
    rows = [(n, f"{statistics.median(v):.0f}", f"{statistics.median(v) / stored:.2f}") for n, v in got.items()]
    return md_table(["4K x4 QOI, 1 worker, k=16, 256^2", "patches/s", "/ stored LR"], rows)


def batch() -> torch.Tensor:
    rng = np.random.default_rng(0)
    pics = real_photos()
    out = []
    for i in range(B):
        img = pics[i % len(pics)]
        y, x = (int(v) for v in rng.integers(0, [img.shape[0] - SIZE, img.shape[1] - SIZE]))
        out.append(torch.from_numpy(np.ascontiguousarray(img[y : y + SIZE, x : x + SIZE])).permute(2, 0, 1))
    return torch.stack(out)


def best_ms(fn: Callable[[], Any], device: torch.device, repeat: int) -> float:
    def once() -> float:
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    once()
    return min(once() for _ in range(repeat))


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--stream", type=float, default=0.0, metavar="SECONDS", help="also stream: seconds per loader")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    real, bsr, arb = RealESRGANConfig(), BSRGANConfig(), ArbitraryScaleConfig(gt_size=SIZE)
    work = [(name, *worker_us(cfg)) for name, cfg in (("Real-ESRGAN", real), ("BSRGAN", bsr), ("arbitrary scale", arb))]
    wtable = md_table(
        ["model", "draw_params, us/sample", "+ default_rng, us/sample"], [(n, f"{a:.0f}", f"{b:.0f}") for n, a, b in work]
    )

    hr = batch().to(dev)
    p_real = {
        k: v.to(dev)
        for k, v in collate_params([draw_params(real, np.random.default_rng([0, 1, i, 0]), SIZE) for i in range(B)]).items()
    }
    p_bsr = {
        k: v.to(dev)
        for k, v in collate_params([draw_params(bsr, np.random.default_rng([0, 1, i, 0]), SIZE) for i in range(B)]).items()
    }
    p_arb = collate_params([draw_params(arb, np.random.default_rng([0, 1, i, 0]), SIZE) for i in range(B)])
    x = hr.float() / 255
    usm, jpeg = ops.USMSharp().to(dev), DiffJPEG().to(dev)
    gray = torch.zeros(B, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    per_sample, per_batch = Degrader(real).to(dev), Degrader(real, "batch").to(dev)
    bsrgan, arbitrary = Degrader(bsr).to(dev), Degrader(arb).to(dev)
    rows = [
        ("Degrader Real-ESRGAN, per sample", lambda: per_sample(hr, p_real)),
        ("Degrader Real-ESRGAN, per batch", lambda: per_batch(hr, p_real)),
        ("Degrader BSRGAN (per sample)", lambda: bsrgan(hr, p_bsr)),
        (f"Degrader arbitrary scale (x{float(p_arb['scale'][0]):.2f}, Pillow-exact)", lambda: arbitrary(hr, p_arb)),
        ("op: USM sharpening (51 x 51)", lambda: usm(x)),
        ("op: filter2d, 21 x 21 per sample", lambda: ops.filter2d(x, p_real["kernel1"])),
        ("op: DiffJPEG", lambda: jpeg(x, p_real["jpeg_quality"][:, 0])),
        (
            "op: Gaussian noise (draws + add)",
            lambda: ops.gaussian_noise(x, p_real["noise_sigma"][:, 0], gray, *ops.normal_draws(x, gray, gen)),
        ),
        ("op: Poisson noise", lambda: ops.poisson_noise(x, p_real["poisson_scale"][:, 0], gray, gen)),
        ("op: resize bicubic x0.5", lambda: ops.resize(x, "bicubic", scale=0.5)),
    ]
    dtable = md_table(
        ["12 x 256^2 batch", f"ms ({dev.type}, {torch.get_num_threads()} threads)"],
        [(n, f"{best_ms(f, dev, args.batches):.0f}") for n, f in rows],
    )
    stream = f"\n\nstream (the loader alone):\n\n{stream_rows(Path(args.out), args.stream)}" if args.stream else ""
    report(
        Path(args.out),
        "degrade_bench",
        f"{machine_line()}\n\nworker, one 256^2 sample, one thread:\n\n{wtable}\n\ndevice:\n\n{dtable}{stream}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
