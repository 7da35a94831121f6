"""LR made per patch (``lr="bicubic"``) against stored LR, streamed side by side.

    .venv/bin/python -m bench.bicubic_bench [--seconds 15] [--rounds 2] [--out bench/out]

The stream bench's 4K shards (``bench.common.shards``: 128 frames of real-photo mosaics, x4, PNG and
QOI), streamed by ``wdsr bench``'s harness with 1 worker, k = 16, HR patch 192, batch 16: with the
stored x4 LR (``lr="stored"``), and with each LR patch made from the HR patch MATLAB-exactly
(``lr="bicubic"``; the stored LR is then not read). Rounds alternate which goes first; medians. Then
the LR of one 192^2 HR patch alone (``BicubicPair.lr_patch`` at 256 random x4 positions of the first
4K frame), best of 5 rounds, for both MATLAB methods.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
from PIL import Image

from bench.common import best_s, machine_line, md_table, parser, report, shards
from shardmaker.imaging import ResizeMethod
from wdsr.pipeline.bicubic import BicubicPair
from wdsr.tools.bench import bench_stream


def patch_ms(frame: Path, method: ResizeMethod, n: int = 256) -> float:
    """Milliseconds per 48^2 LR patch made from its 192^2 HR patch (x4) of ``frame``."""
    hr = np.asarray(Image.open(frame).convert("RGB"))
    pair = BicubicPair("bench", frame.stem, 0, hr, 4, method, 0, 0)
    rng = np.random.default_rng(0)
    at = [(int(rng.integers(pair.lr_hw[0] - 47)), int(rng.integers(pair.lr_hw[1] - 47))) for _ in range(n)]

    def run() -> None:
        for y, x in at:
            pair.lr_patch(y, x, 48, 48)

    run()
    return best_s(run) / n * 1e3


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    args = ap.parse_args()
    head = machine_line()  # the load before this bench's own runs
    urls = shards(args.out, args.frames)
    rows, data = [], {}
    for codec in ("png", "qoi"):
        got: dict[str, list[float]] = {"stored": [], "bicubic": []}
        for r in range(args.rounds):
            for mode in ("stored", "bicubic") if r % 2 == 0 else ("bicubic", "stored"):
                res = bench_stream(urls[codec], workers=1, patches_per_image=16, seconds=args.seconds, lr=mode)
                got[mode].append(res.patches_per_s)
        stored, bicubic = statistics.median(got["stored"]), statistics.median(got["bicubic"])
        rows.append([codec.upper(), f"{stored:.0f}", f"{bicubic:.0f}", f"**{bicubic / stored:.2f}**"])
        data[codec] = got
    frame = args.out / "src4k_stream" / "f000.png"
    per_patch = {m.value: patch_ms(frame, m) for m in ResizeMethod}
    data["lr_patch_ms"] = per_patch
    text = "\n".join(
        [
            head,
            "",
            md_table(["4K x4 shards", "stored LR patches/s", "lr='bicubic' patches/s", "bicubic / stored"], rows),
            "",
            md_table(["one LR patch (192^2 HR, x4)", *per_patch], [["ms", *(f"{v:.2f}" for v in per_patch.values())]]),
        ]
    )
    report(args.out, "bicubic_bench", text, data)


if __name__ == "__main__":
    main()
