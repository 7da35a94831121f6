"""Benchmark ``shardmaker build`` on 4K images made from real photos; prints a Markdown table.

    .venv/bin/python bench/build_bench.py [--images 8] [--out bench/out]

Measured side by side in one run: build images/s with 1 and 2 workers, PNG vs QOI; the cost of
MATLAB-exact x4 LR generation against the PNG encode of the same HR image; decode times.
The 4K frames are mosaics of native-resolution crops of real photos (scikit-image's bundled
photos, plus McMaster from ../shared/refdata when present), so they have real-photo entropy.
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyspng
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardmaker.build import BuildConfig, build  # noqa: E402
from shardmaker.build.sample import SampleConfig  # noqa: E402
from shardmaker.imaging import codecs  # noqa: E402
from shardmaker.imaging.codecs import Codec  # noqa: E402
from shardmaker.imaging.resize import ResizeMethod, downscale  # noqa: E402

W, H, TILE = 3840, 2160, 480


def real_photos() -> list[np.ndarray]:
    from skimage import data

    pics = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(), data.retina(), data.hubble_deep_field(),
            data.motorcycle_left() if hasattr(data, "motorcycle_left") else data.astronaut()]
    ref = Path(__file__).resolve().parents[2] / "shared/refdata/mcmaster"
    if ref.is_dir():
        pics += [np.asarray(Image.open(p).convert("RGB")) for p in sorted(ref.glob("*.tif"))]
    return [np.ascontiguousarray(p[..., :3]) for p in pics if min(p.shape[:2]) >= TILE]


def mosaic_4k(pics: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    out = np.empty((H, W, 3), np.uint8)
    for y in range(0, H, TILE):
        for x in range(0, W, TILE):
            p = pics[rng.integers(len(pics))]
            oy, ox = rng.integers(p.shape[0] - TILE + 1), rng.integers(p.shape[1] - TILE + 1)
            tile = p[oy : oy + TILE, ox : ox + TILE]
            if rng.integers(2):
                tile = tile[:, ::-1]
            out[y : y + TILE, x : x + TILE] = tile[: min(TILE, H - y), : min(TILE, W - x)]
    return out


def timed(fn, repeat: int = 3) -> float:
    fn()  # warm-up: first touches of large buffers cost page faults
    return statistics.median(_once(fn) for _ in range(repeat))


def _once(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    work = Path(args.out) / "build"  # only this benchmark's own folder is cleared
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src4k"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    pics = real_photos()
    frames = [mosaic_4k(pics, rng) for _ in range(args.images)]
    for i, f in enumerate(frames):
        Image.fromarray(f).save(src / f"frame{i:03d}.png", compress_level=1)

    img = frames[0]
    t_png1 = timed(lambda: codecs.encode(img, Codec.PNG, 1))
    t_png6 = timed(lambda: codecs.encode(img, Codec.PNG, 6))
    t_qoi = timed(lambda: codecs.encode(img, Codec.QOI))
    t_lr = timed(lambda: downscale(img, 4, ResizeMethod.MATLAB))
    t_lr8 = timed(lambda: downscale(img, 4, ResizeMethod.MATLAB_UINT8))
    png, qoi_b = codecs.encode(img, Codec.PNG, 1), codecs.encode(img, Codec.QOI)
    png6 = codecs.encode(img, Codec.PNG, 6)
    t_dpng = timed(lambda: codecs.decode(png, "png"))
    t_dspng = timed(lambda: pyspng.load(png))
    t_dpil = timed(lambda: np.asarray(Image.open(io.BytesIO(png)).convert("RGB")))

    def pillow_png() -> bytes:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="PNG", compress_level=1)
        return buf.getvalue()

    t_pil1 = timed(pillow_png)
    pil_png = pillow_png()
    t_dpilpng = timed(lambda: codecs.decode(pil_png, "png"))
    t_dqoi = timed(lambda: codecs.decode(qoi_b, "qoi"))

    rows = []
    for codec in (Codec.PNG, Codec.QOI):
        for workers in (1, 2):
            out = work / f"shards-{codec.value}-w{workers}"
            opts = BuildConfig(hr_src=str(src), out=str(out), sample=SampleConfig(scales=(4,), codec=codec),
                                workers=workers, progress=False, shard_size=10**9)
            t = time.perf_counter()
            res = build(opts)
            dt = time.perf_counter() - t
            rows.append((codec.value, workers, res.samples / dt, res.bytes / 1e6 / dt, res.bytes / res.samples / 1e6))

    lines = [
        f"4K (3840x2160) frames from real photos, {args.images} images, x4 LR generated (matlab), one run:",
        "",
        "| codec | workers | images/s | MB/s written | MB/sample |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {c} | {w} | {ips:.2f} | {mbs:.1f} | {mbps:.1f} |" for c, w, ips, mbs, mbps in rows]
    lines += [
        "",
        "| per 4K image (median of 3) | ms |",
        "|---|---|",
        f"| x4 LR, `--lr-method matlab` (double, bit-exact) | {t_lr * 1e3:.0f} |",
        f"| x4 LR, `--lr-method matlab-uint8` (bit-exact) | {t_lr8 * 1e3:.0f} |",
        f"| HR PNG encode, level 1 | {t_png1 * 1e3:.0f} |",
        f"| HR PNG encode, level 6 | {t_png6 * 1e3:.0f} |",
        f"| HR PNG encode, Pillow level 1 (for comparison) | {t_pil1 * 1e3:.0f} |",
        f"| HR PNG decode (wdsr: libdeflate + libspng) of Pillow's level-1 file | {t_dpilpng * 1e3:.0f} |",
        f"| HR QOI encode | {t_qoi * 1e3:.0f} |",
        f"| HR PNG decode, wdsr (libdeflate + libspng) / libspng alone / Pillow | {t_dpng * 1e3:.0f} / {t_dspng * 1e3:.0f} / {t_dpil * 1e3:.0f} |",
        f"| HR QOI decode | {t_dqoi * 1e3:.0f} |",
        "",
        f"LR generation / HR PNG encode (level 1): **{t_lr / t_png1:.2f}** (matlab), {t_lr8 / t_png1:.2f} (matlab-uint8); "
        f"PNG level 6 / level 1 encode time: {t_png6 / t_png1:.1f}x; sizes PNG-1 {len(png) / 1e6:.1f} MB, PNG-6 {len(png6) / 1e6:.1f} MB, Pillow PNG-1 {len(pil_png) / 1e6:.1f} MB, QOI {len(qoi_b) / 1e6:.1f} MB.",
    ]
    text = "\n".join(lines)
    print(text)
    (work.parent / "build_bench.md").write_text(text + "\n")
    (work.parent / "build_bench.json").write_text(json.dumps({
        "build": [dict(zip(("codec", "workers", "images_per_s", "mb_per_s", "mb_per_sample"), r)) for r in rows],
        "ms": {"lr_matlab": t_lr * 1e3, "lr_matlab_uint8": t_lr8 * 1e3, "png1_encode": t_png1 * 1e3,
               "png6_encode": t_png6 * 1e3, "qoi_encode": t_qoi * 1e3, "png_decode": t_dpng * 1e3, "png_decode_pyspng": t_dspng * 1e3,
               "png_decode_pillow": t_dpil * 1e3, "qoi_decode": t_dqoi * 1e3},
        "lr_over_png_encode": t_lr / t_png1,
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
