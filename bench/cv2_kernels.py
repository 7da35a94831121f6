"""The byte shuffles of the per-patch path: numpy (wdsr's fallback) against OpenCV's SIMD kernels (what it uses).

    .venv/bin/python -m bench.cv2_kernels

One HR patch, 192 x 192 x 3 uint8, hot in the cache, one thread: the C x H x W deinterleave of an
H x W x C crop, the same with H and W swapped, and a 192 x 192 plane transposed: the measurement
that made opencv-python-headless a dependency of wdsr (``wdsr.pipeline.augment`` uses cv2 for these copies).
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np

from bench.common import machine_line, md_table, parser, report
from bench.common import mean_us as us


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    head = machine_line()
    cv2.setNumThreads(1)
    rng = np.random.default_rng(0)
    hwc = rng.integers(0, 256, (192, 192, 3), dtype=np.uint8)
    plane = np.ascontiguousarray(hwc[..., 0])
    out = np.empty((3, 192, 192), np.uint8)
    planes = [out[0], out[1], out[2]]
    tmp = np.empty_like(hwc)
    plane_out = np.empty_like(plane)

    def swap_cv2() -> None:
        cv2.transpose(hwc, tmp)
        cv2.split(tmp, planes)

    rows = [
        ("H x W x C -> C x H x W", us(lambda: np.copyto(out, hwc.transpose(2, 0, 1))), us(lambda: cv2.split(hwc, planes))),
        ("H x W x C -> C x W x H (a swap)", us(lambda: np.copyto(out, hwc.transpose(2, 1, 0))), us(swap_cv2)),
        ("192 x 192 plane transposed", us(lambda: np.copyto(plane_out, plane.T)), us(lambda: cv2.transpose(plane, plane_out))),
    ]
    cv2.split(hwc, planes)
    assert (out == hwc.transpose(2, 0, 1)).all()  # cv2 wrote into the given planes
    table = md_table(
        ["copy", "numpy, us", "cv2, us", "numpy / cv2"], [(n, f"{a:.1f}", f"{b:.1f}", f"**{a / b:.1f}x**") for n, a, b in rows]
    )
    report(Path(args.out), "cv2_kernels", f"{head}; one 192 x 192 x 3 uint8 patch, one thread:\n\n{table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
