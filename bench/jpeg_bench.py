"""JPEG 4K decode: libjpeg-turbo through simplejpeg (what wdsr uses for JPEG members) vs Pillow, side by side.

    .venv/bin/python -m bench.jpeg_bench [--frames 8] [--repeats 5] [--out bench/out]

The stream bench's 4K frames (real-photo mosaics) encoded as JPEG quality 95 (4:2:0); each decoder
decodes every frame ``--repeats`` times, alternating, in one process; the medians per frame.
"""

from __future__ import annotations

import io
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from bench.common import machine_line, md_table, parser, report, source_frames
from shardmaker.imaging.codecs import _decode_pillow, decode


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    head = machine_line()
    srcs = sorted(source_frames(Path(args.out), 128).glob("*.png"))[: args.frames]
    jpegs = []
    for p in srcs:
        b = io.BytesIO()
        Image.open(p).save(b, "JPEG", quality=95)
        jpegs.append(b.getvalue())
    times: dict[str, list[float]] = {"simplejpeg (libjpeg-turbo)": [], "Pillow": []}
    for _ in range(args.repeats):
        for data in jpegs:
            t0 = time.perf_counter()
            a = decode(data, "jpg")
            times["simplejpeg (libjpeg-turbo)"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = _decode_pillow(data)
            times["Pillow"].append(time.perf_counter() - t0)
            assert a.shape == b.shape and int(np.abs(a.astype(int) - b).max()) <= 2
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    size = np.mean([len(j) for j in jpegs]) / 1e6
    lines = [
        f"{head}; {len(jpegs)} 4K JPEG frames (quality 95, {size:.1f} MB each), {args.repeats} rounds, median ms per decode:",
        "",
        md_table(
            ["decoder", "ms per 4K frame", "Pillow / it"],
            [(k, f"{v:.1f}", f"**{med['Pillow'] / v:.2f}x**") for k, v in med.items()],
        ),
    ]
    report(Path(args.out), "jpeg_bench", "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
