"""Tiled members against whole-image members, at the decode and cut stage (one process, one core).

    .venv/bin/python -m bench.tiles_bench [--rounds 5] [--k 16] [--out bench/out]

Images made of real photos (``bench.common.mosaic_4k``): a 4K frame, an 8192 x 8192 and a 10240 x
10240 image (4K mosaics side by side), x4 LR made MATLAB-exactly, all stored as QOI. Per sample:

* **whole**: the HR and LR members decoded whole, then ``k`` patches cut (HR 192, the stream's
  ``cut_patches``) and written out C x H x W, as the stream does today;
* **tiled**: the same pixels as tiled members (T = 256 HR, 64 LR), read through
  ``shardmaker.imaging.TiledImage``: each patch decodes the tiles it touches, each tile once.

Rounds alternate which goes first; the table has medians. The patches are asserted equal. Also
the bound checks' cost: the header, index and per-tile header checks of a sample, against the
decode of one tile.

Then **the stream** (``--stream``, on by default): 24 4K frames and 6 8192 x 8192 images of the same
mosaics as PNG sources, built as QOI shards by ``shardmaker build`` whole and with ``--tiles 256``
(build time and peak RSS of the build process reported), streamed by ``wdsr bench``'s
``bench_stream`` with 1 worker, k = 16, HR patch 192, batch 16: patches/s and the worker's peak RSS.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import machine_line, md_table, mosaic_4k, parser, real_photos, report
from shardmaker.format import tiles as tl
from shardmaker.imaging import Codec, TiledImage, decode, downscale, encode, encode_tiled, read_layout
from wdsr.pipeline.patches import PatchConfig, cut_patches
from wdsr.pipeline.whole import DecodedPair
from wdsr.tools.bench import bench_stream

SCALE, PATCH, TILE = 4, 192, 256


def _image(side_h: int, side_w: int, rng: np.random.Generator) -> np.ndarray:
    pics = real_photos()
    out = np.empty((side_h, side_w, 3), np.uint8)
    for y in range(0, side_h, 2160):
        for x in range(0, side_w, 3840):
            m = mosaic_4k(pics, rng)
            out[y : y + 2160, x : x + 3840] = m[: min(2160, side_h - y), : min(3840, side_w - x)]
    return out


def _patches(pair: DecodedPair, k: int) -> list[np.ndarray]:
    got, _ = cut_patches(pair, PatchConfig(scale=SCALE, patch_size=PATCH), 0, 0, 0, k)
    return [a for p in got for a in (p.lr, p.hr)]


def _whole(hr_b: bytes, lr_b: bytes, k: int) -> list[np.ndarray]:
    hr, lr = decode(hr_b, "qoi"), decode(lr_b, "qoi")
    return _patches(DecodedPair("b.tar", "k", 0, hr, lr, 0, 0), k)


def _tiled(hr_b: bytes, lr_b: bytes, k: int) -> list[np.ndarray]:
    hr, lr = TiledImage(hr_b), TiledImage(lr_b)
    return _patches(DecodedPair("b.tar", "k", 0, hr, lr, 0, 0), k)  # type: ignore[arg-type]


def _checks_us(member: bytes) -> tuple[float, float]:
    """(us for the header + index + every tile's header check, us to decode one inner tile)."""
    h, index = read_layout(member)
    t0 = time.perf_counter()
    for _ in range(20):
        h, index = read_layout(member)
        for i in range(h.count):
            tl.check_tile(h, i, tl.tile_view(member, h, index, i))
    checks = (time.perf_counter() - t0) / 20 / h.count * 1e6
    view = tl.tile_view(member, h, index, 0)
    t0 = time.perf_counter()
    for _ in range(50):
        decode(view, "qoi")
    return checks, (time.perf_counter() - t0) / 50 * 1e6


def _sources(work: Path, name: str, n: int, hw: tuple[int, int], seed: int) -> Path:
    src = work / name
    if len(list(src.glob("*.png"))) != n:
        src.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(seed)
        for i in range(n):
            save_png(src / f"i{i:02d}.png", _image(*hw, rng))
    return src


_BUILD = """
import sys
from shardmaker.cli import main
rc = main(sys.argv[1:])
print(next(x.split()[1] for x in open("/proc/self/status") if x.startswith("VmHWM:")))  # kB; --workers 1: in-process
sys.exit(rc)
"""


def _build(src: Path, out: Path, tiles: str) -> tuple[float, float]:
    """(seconds, peak RSS MB) of a QOI x4 build with one worker (which builds in its own process)."""
    args = ["-q", "build", str(src), str(out), "--codec", "qoi", "--workers", "1", "--tiles", tiles]
    shutil.rmtree(out, ignore_errors=True)  # built anew: its time and memory are measured
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _BUILD, *args], check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, int(proc.stdout.split()[-1]) / 1024


def _stream_part(work: Path, seconds: float) -> tuple[str, dict]:
    sets = {
        "4K": _sources(work, "tiles-src-4k", 24, (2160, 3840), 5),
        "8192^2": _sources(work, "tiles-src-8k", 6, (8192, 8192), 6),
    }
    rows, data = [], {}
    for name, src in sets.items():
        got = {}
        for tiles in ("off", "256"):
            out = work / f"tiles-{name.replace('^', '')}-{tiles}"
            build_s, build_mb = _build(src, out, tiles)
            r = bench_stream(str(out), workers=1, patches_per_image=16, seconds=seconds, shuffle_buffer=256)
            got[tiles] = r
            rows.append(
                [
                    name,
                    "tiled 256" if tiles != "off" else "whole",
                    f"{r.patches_per_s:.0f}",
                    f"{r.peak_rss_mb:.0f}",
                    f"{build_s:.0f}",
                ]
            )
            data[f"{name} {tiles}"] = {"patches_per_s": r.patches_per_s, "worker_peak_rss_mb": r.peak_rss_mb, "build_s": build_s}
        ratio = got["256"].patches_per_s / got["off"].patches_per_s
        rows.append([name, "**tiled / whole**", f"**{ratio:.1f}x**", "", ""])
    head = ["images", "stored", "patches/s (1 worker, k=16)", "worker peak RSS MB", "build s"]
    return md_table(head, rows), data


def save_png(path: Path, img: np.ndarray) -> None:
    path.write_bytes(encode(img, Codec.PNG, 1))


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    ap.add_argument("--no-stream", dest="stream", action="store_false", help="the decode + cut table only")
    ap.add_argument("--seconds", type=float, default=15.0, help="streaming time per row")
    args = ap.parse_args()
    rng = np.random.default_rng(3)
    rows, data = [], {}
    for name, (h, w) in {"4K 3840x2160": (2160, 3840), "8192^2": (8192, 8192), "10240^2": (10240, 10240)}.items():
        hr = _image(h, w, rng)
        lr = downscale(hr[: h // SCALE * SCALE, : w // SCALE * SCALE], SCALE)
        hr_b, lr_b = encode(hr, Codec.QOI), encode(lr, Codec.QOI)
        hr_t, lr_t = encode_tiled(hr, TILE, Codec.QOI), encode_tiled(lr, TILE // SCALE, Codec.QOI)
        for a, b in zip(_whole(hr_b, lr_b, args.k), _tiled(hr_t, lr_t, args.k), strict=True):
            np.testing.assert_array_equal(a, b)
        times: dict[str, list[float]] = {"whole": [], "tiled": []}
        for r in range(args.rounds):
            order = ("whole", "tiled") if r % 2 == 0 else ("tiled", "whole")
            for which in order:
                fn, args_ = (_whole, (hr_b, lr_b)) if which == "whole" else (_tiled, (hr_t, lr_t))
                t0 = time.perf_counter()
                fn(*args_, args.k)
                times[which].append(time.perf_counter() - t0)
        whole, tiled = statistics.median(times["whole"]), statistics.median(times["tiled"])
        checks, tile_us = _checks_us(hr_t)
        rows.append(
            [
                name,
                f"{whole * 1e3:.0f}",
                f"{tiled * 1e3:.1f}",
                f"{args.k / whole:.1f}",
                f"{args.k / tiled:.0f}",
                f"**{whole / tiled:.1f}x**",
                f"{len(hr_t) / len(hr_b):.3f}",
                f"{checks:.1f} / {tile_us:.0f} = {100 * checks / tile_us:.2f}%",
            ]
        )
        data[name] = {
            "whole_s": whole,
            "tiled_s": tiled,
            "bytes_ratio": len(hr_t) / len(hr_b),
            "check_us": checks,
            "tile_us": tile_us,
        }
        print(rows[-1], flush=True)
    head = [
        "image",
        "whole ms/sample",
        "tiled ms/sample",
        "whole patches/s",
        "tiled patches/s",
        "tiled / whole",
        "bytes tiled / whole",
        "checks us per tile / tile decode",
    ]
    text = f"`.venv/bin/python -m bench.tiles_bench --k {args.k}`: {machine_line()}\n\n" + md_table(head, rows)
    if args.stream:
        table, stream = _stream_part(args.out, args.seconds)
        text += "\n\nThe stream:\n\n" + table
        data["stream"] = stream
    report(args.out, "tiles_bench", text, data)


if __name__ == "__main__":
    main()
