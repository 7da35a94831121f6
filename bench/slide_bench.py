"""A gigapixel slide against a 10k^2 image: built region by region, streamed tile by tile.

    .venv/bin/python -m bench.slide_bench [--side 40960] [--seconds 20] [--out bench/out]

Two JPEG-tiled BigTIFFs (1024 px tiles, quality 90, as whole-slide scanners write them), made of 4K
mosaics of real photos (``bench.common.mosaic_4k``): a ``--side`` x ``--side`` slide (default 40960^2,
1.68 Gpx, 5 GB of pixels) and ``--images`` 10240^2 images (6: 24 region samples, about the slide's 25). Each is built by ``shardmaker build --codec qoi
--scale 4 --tiles auto`` with the default ``--region 8192`` (one worker, in its own process: build
seconds and peak RSS reported) and streamed by ``wdsr bench``'s ``bench_stream`` with 1 worker,
k = 16, HR patch 192, batch 16, shuffle buffer 256: patches/s and the worker's peak RSS. The targets:
the slide's patches/s within 80% of the 10k^2 image's, the worker under 300 MB.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import machine_line, md_table, mosaic_4k, parser, real_photos, report
from shardmaker import format as fmt
from wdsr.tools.bench import bench_stream

TIFF_TILE = 1024

_BUILD = """
import sys
from shardmaker.cli import main
rc = main(sys.argv[1:])
print(next(x.split()[1] for x in open("/proc/self/status") if x.startswith("VmHWM:")))  # kB; --workers 1: in-process
sys.exit(rc)
"""


def write_slide(path: Path, side: int, seed: int) -> None:
    """A ``side``^2 JPEG-tiled BigTIFF of 4K mosaics, written tile by tile (never whole in memory)."""
    import tifffile

    if path.exists():
        return
    rng = np.random.default_rng(seed)
    pics = real_photos()
    frame = mosaic_4k(pics, rng)
    n = side // TIFF_TILE

    def tiles():
        for i in range(n * n):
            if i % 16 == 0:  # a new 4K mosaic now and then: the slide is not one picture repeated
                frame[:] = mosaic_4k(pics, rng)
            y = int(rng.integers(0, frame.shape[0] - TIFF_TILE + 1))
            x = int(rng.integers(0, frame.shape[1] - TIFF_TILE + 1))
            yield np.ascontiguousarray(frame[y : y + TIFF_TILE, x : x + TIFF_TILE])

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    tifffile.imwrite(
        tmp,
        tiles(),
        shape=(side, side, 3),
        dtype=np.uint8,
        tile=(TIFF_TILE, TIFF_TILE),
        compression="jpeg",
        compressionargs={"level": 90},
        bigtiff=True,
    )
    tmp.rename(path)


def build(src: Path, out: Path) -> tuple[float, float]:
    """(seconds, peak RSS MB) of the build, one worker, in its own process."""
    shutil.rmtree(out, ignore_errors=True)
    args = ["-q", "build", str(src), str(out), "--codec", "qoi", "--scale", "4", "--tiles", "auto", "--workers", "1"]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _BUILD, *args], check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, int(proc.stdout.split()[-1]) / 1024


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--side", type=int, default=40960, help="the slide's side in pixels (a multiple of 1024)")
    ap.add_argument("--seconds", type=float, default=20.0, help="streaming time per row")
    ap.add_argument("--images", type=int, default=6, help="10240^2 images (4 region samples each): epochs as long as the slide's")
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    args = ap.parse_args()
    work = args.out / "slide"
    rows, data = [], {}
    rates = {}
    for name, side, count in (("10240^2", 10240, args.images), (f"{args.side}^2", args.side, 1)):
        src = work / f"src-{side}"
        t0 = time.perf_counter()
        for i in range(count):
            write_slide(src / f"slide{side}-{i}.tif", side, 10 * side + i)
        write_s = time.perf_counter() - t0
        count = len(list(src.glob("*.tif")))  # what the build reads (a folder left from another run may hold more)
        out = work / f"ds-{side}"
        build_s, build_mb = build(src, out)
        m = fmt.load(str(out))
        r = bench_stream(str(out), workers=1, patches_per_image=16, seconds=args.seconds, shuffle_buffer=256)
        rates[side] = r.patches_per_s
        rows.append(
            [
                name if count == 1 else f"{count} x {name}",
                f"{count * side * side / 1e9:.2f}",
                f"{m.samples} x {max(max(int(w), int(h)) for sh in m.shards for w, h in sh.hr_sizes)}",
                f"{m.bytes / 1e9:.2f}",
                f"{build_s:.0f}",
                f"{build_mb:.0f}",
                f"{r.patches_per_s:.0f}",
                f"{r.peak_rss_mb:.0f} / {r.peak_private_mb:.0f}",
            ]
        )
        data[name] = {
            "gigapixels": count * side * side / 1e9,
            "samples": m.samples,
            "shard_bytes": m.bytes,
            "tiff_write_s": write_s,
            "build_s": build_s,
            "build_peak_rss_mb": build_mb,
            "patches_per_s": r.patches_per_s,
            "worker_peak_rss_mb": r.peak_rss_mb,
            "worker_peak_private_mb": r.peak_private_mb,
        }
        print(rows[-1], flush=True)
    ratio = rates[args.side] / rates[10240]
    rows.append([f"**{args.side}^2 / 10240^2**", "", "", "", "", "", f"**{ratio:.2f}**", ""])
    data["ratio"] = ratio
    head = ["image", "Gpx", "region samples x side", "shards GB", "build s", "build peak RSS MB", "patches/s", "worker peak RSS / private MB"]
    text = "\n".join([machine_line(), "", md_table(head, rows)])
    report(args.out, "slide_bench", text, data)


if __name__ == "__main__":
    main()
