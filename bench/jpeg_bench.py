"""JPEG 4K decode: libjpeg-turbo through simplejpeg (what wdsr uses for JPEG members) vs Pillow, side by side.

    .venv/bin/python bench/jpeg_bench.py [--frames 8] [--repeats 5]

The stream bench's 4K frames (real-photo mosaics) encoded as JPEG quality 95 (4:2:0); each decoder
decodes every frame ``--repeats`` times, alternating, in one process; the medians per frame.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream_bench import shards  # noqa: E402

from shardmaker.imaging.codecs import _decode_pillow, decode  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    shards(Path(args.out), 128)  # makes the 4K source frames if they are not there
    srcs = sorted((Path(args.out) / "src4k_stream").glob("*.png"))[: args.frames]
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
    lines = [f"{len(jpegs)} 4K JPEG frames (quality 95, {size:.1f} MB each), {args.repeats} rounds, median ms per decode:", "",
             "| decoder | ms per 4K frame | vs Pillow |", "|---|---|---|"]
    for k, v in med.items():
        lines.append(f"| {k} | {v:.1f} | {med['Pillow'] / v:.2f}x |")
    text = "\n".join(lines)
    print(text)
    (Path(args.out) / "jpeg_bench.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
