"""LR made per patch (``lr="bicubic"``) against stored LR, streamed side by side.

    .venv/bin/python -m bench.bicubic_bench [--seconds 15] [--rounds 2] [--out bench/out]

The stream bench's 4K shards (``bench.common.shards``: 128 frames of real-photo mosaics, x4, PNG and
QOI), streamed by ``wdsr bench``'s harness with 1 worker, k = 16, HR patch 192, batch 16: with the
stored x4 LR (``lr="stored"``), and with each LR patch made from the HR patch MATLAB-exactly
(``lr="bicubic"``; the stored LR is then not read). Rounds alternate which goes first; medians.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.common import machine_line, md_table, parser, report, shards
from wdsr.tools.bench import bench_stream


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    args = ap.parse_args()
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
    text = "\n".join(
        [
            machine_line(),
            "",
            md_table(["4K x4 shards", "stored LR patches/s", "lr='bicubic' patches/s", "bicubic / stored"], rows),
        ]
    )
    report(args.out, "bicubic_bench", text, data)


if __name__ == "__main__":
    main()
