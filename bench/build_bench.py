"""Benchmark ``shardmaker build`` on 4K images made from real photos; prints Markdown tables.

    .venv/bin/python -m bench.build_bench [--images 8] [--out bench/out]

Measured side by side in one run: build images/s with 1 and 2 workers, PNG vs QOI; the cost of
MATLAB-exact x4 LR generation against the PNG encode of the same HR image; encode and decode times.
"""

from __future__ import annotations

import io
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyspng
from PIL import Image

from bench.common import machine_line, md_table, median_s, mosaic_4k, parser, real_photos, report
from shardmaker.builder import BuildConfig, build
from shardmaker.builder.sample import SampleConfig
from shardmaker.imaging import codecs
from shardmaker.imaging.codecs import Codec
from shardmaker.imaging.resize import ResizeMethod, downscale


def pillow_png(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def per_image_ms(img: np.ndarray) -> dict[str, float]:
    """Median ms of each step on one 4K frame."""
    png, png6 = codecs.encode(img, Codec.PNG, 1), codecs.encode(img, Codec.PNG, 6)
    qoi_b, pil_png = codecs.encode(img, Codec.QOI), pillow_png(img)
    steps = {
        "lr_matlab": lambda: downscale(img, 4, ResizeMethod.MATLAB),
        "lr_matlab_uint8": lambda: downscale(img, 4, ResizeMethod.MATLAB_UINT8),
        "png1_encode": lambda: codecs.encode(img, Codec.PNG, 1),
        "png6_encode": lambda: codecs.encode(img, Codec.PNG, 6),
        "pillow_png1_encode": lambda: pillow_png(img),
        "qoi_encode": lambda: codecs.encode(img, Codec.QOI),
        "png_decode": lambda: codecs.decode(png, "png"),
        "png_decode_pyspng": lambda: pyspng.load(png),
        "png_decode_pillow": lambda: np.asarray(Image.open(io.BytesIO(png)).convert("RGB")),
        "pillow_png_decode": lambda: codecs.decode(pil_png, "png"),
        "qoi_decode": lambda: codecs.decode(qoi_b, "qoi"),
    }
    ms = {k: median_s(f) * 1e3 for k, f in steps.items()}
    ms["mb"] = {"png1": len(png) / 1e6, "png6": len(png6) / 1e6, "pillow_png1": len(pil_png) / 1e6, "qoi": len(qoi_b) / 1e6}
    return ms


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    head = machine_line()
    work = Path(args.out) / "build"  # only this benchmark's own folder is cleared
    shutil.rmtree(work, ignore_errors=True)
    src = work / "src4k"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    pics = real_photos()
    frames = [mosaic_4k(pics, rng) for _ in range(args.images)]
    for i, f in enumerate(frames):
        Image.fromarray(f).save(src / f"frame{i:03d}.png", compress_level=1)
    ms = per_image_ms(frames[0])

    rows = []
    for codec in (Codec.PNG, Codec.QOI):
        for workers in (1, 2):
            opts = BuildConfig(
                hr_src=str(src),
                out=str(work / f"shards-{codec.value}-w{workers}"),
                sample=SampleConfig(scales=(4,), codec=codec),
                workers=workers,
                progress=False,
                shard_size=10**9,
            )
            t = time.perf_counter()
            res = build(opts)
            dt = time.perf_counter() - t
            rows.append((codec.value, workers, res.samples / dt, res.bytes / 1e6 / dt, res.bytes / res.samples / 1e6))

    mb = ms["mb"]
    lines = [
        f"{head}; {args.images} 4K frames, x4 LR generated (`--lr-method matlab`):",
        "",
        md_table(
            ["codec", "workers", "images/s", "MB/s written", "MB/sample"],
            [(c, w, f"{ips:.2f}", f"{mbs:.1f}", f"{mbps:.1f}") for c, w, ips, mbs, mbps in rows],
        ),
        "",
        "Per 4K image, ms (median of 3):",
        "",
        md_table(
            ["step", "ms", "MB"],
            [
                ("x4 LR, `--lr-method matlab`", f"{ms['lr_matlab']:.0f}", ""),
                ("x4 LR, `--lr-method matlab-uint8`", f"{ms['lr_matlab_uint8']:.0f}", ""),
                ("PNG encode, level 1 (ours)", f"{ms['png1_encode']:.0f}", f"{mb['png1']:.1f}"),
                ("PNG encode, level 6 (ours)", f"{ms['png6_encode']:.0f}", f"{mb['png6']:.1f}"),
                ("PNG encode, Pillow level 1", f"{ms['pillow_png1_encode']:.0f}", f"{mb['pillow_png1']:.1f}"),
                ("QOI encode", f"{ms['qoi_encode']:.0f}", f"{mb['qoi']:.1f}"),
                ("PNG decode (ours) of our level 1: wdsr (libdeflate + libspng)", f"{ms['png_decode']:.0f}", ""),
                ("... libspng alone", f"{ms['png_decode_pyspng']:.0f}", ""),
                ("... Pillow", f"{ms['png_decode_pillow']:.0f}", ""),
                ("PNG decode (wdsr) of Pillow's level 1", f"{ms['pillow_png_decode']:.0f}", ""),
                ("QOI decode", f"{ms['qoi_decode']:.0f}", ""),
            ],
        ),
        "",
        f"- LR generation / PNG level-1 encode: **{ms['lr_matlab'] / ms['png1_encode']:.2f}** (matlab), "
        f"**{ms['lr_matlab_uint8'] / ms['png1_encode']:.2f}** (matlab-uint8)",
        f"- our PNG level 1 / Pillow's level 1 encode time: {ms['png1_encode'] / ms['pillow_png1_encode']:.2f}; "
        f"level 6 / level 1: {ms['png6_encode'] / ms['png1_encode']:.1f}x",
    ]
    keys = ("codec", "workers", "images_per_s", "mb_per_s", "mb_per_sample")
    report(Path(args.out), "build_bench", "\n".join(lines), {"build": [dict(zip(keys, r, strict=True)) for r in rows], "ms": ms})
    return 0


if __name__ == "__main__":
    sys.exit(main())
