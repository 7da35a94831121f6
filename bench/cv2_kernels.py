"""The byte shuffles of the per-patch path: numpy (wdsr's fallback) against OpenCV's SIMD kernels (what it uses).

    .venv/bin/python bench/cv2_kernels.py

One HR patch, 192 x 192 x 3 uint8, hot in the cache, one thread: the C x H x W deinterleave of an
H x W x C crop, the same with H and W swapped, and a 192 x 192 plane transposed: the measurement
that made opencv-python-headless a dependency of wdsr (``wdsr.pipeline.augment`` uses cv2 for these copies).
"""

from __future__ import annotations

import time

import cv2
import numpy as np


def us(f, n: int = 5000) -> float:
    f()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
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
    print("| copy | numpy (us) | cv2 (us) | numpy / cv2 |\n|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.1f}x |")


if __name__ == "__main__":
    main()
