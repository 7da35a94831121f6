"""What the benches share: the 4K real-photo test shards, timers, page-cache warm-up, tables, reports.

The 4K frames are mosaics of native-resolution crops of real photos (scikit-image's bundled photos,
plus McMaster from ../shared/refdata when present), so they compress and decode like real photos.
``shards(work, frames)`` builds them once into ``work/stream-{png,qoi}`` (builds are deterministic:
the same sources give the same shards, so a later bench reuses them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from shardmaker.builder import BuildConfig, build
from shardmaker.builder.sample import SampleConfig
from shardmaker.imaging.codecs import Codec

if TYPE_CHECKING:  # not at run time: the spawned workers of `shardmaker build` import bench.build_bench, and would import torch
    from wdsr.tools.bench import BenchResult

W, H, TILE = 3840, 2160, 480
REPO = Path(__file__).resolve().parents[1]


# ---- the 4K test frames and shards ------------------------------------------------------------
def real_photos() -> list[np.ndarray]:
    """RGB photos at least one mosaic tile on each side."""
    from skimage import data

    pics = [
        data.astronaut(),
        data.chelsea(),
        data.coffee(),
        data.rocket(),
        data.retina(),
        data.hubble_deep_field(),
        data.motorcycle_left() if hasattr(data, "motorcycle_left") else data.astronaut(),
    ]
    ref = REPO.parent / "shared/refdata/mcmaster"
    if ref.is_dir():
        pics += [np.asarray(Image.open(p).convert("RGB")) for p in sorted(ref.glob("*.tif"))]
    return [np.ascontiguousarray(p[..., :3]) for p in pics if min(p.shape[:2]) >= TILE]


def mosaic_4k(pics: list[np.ndarray], rng: np.random.Generator, size: tuple[int, int] = (W, H)) -> np.ndarray:
    """One 3840 x 2160 frame (or ``size`` = (w, h)) of 480 px crops of ``pics`` (some mirrored)."""
    w, h = size
    out = np.empty((h, w, 3), np.uint8)
    for y in range(0, h, TILE):
        for x in range(0, w, TILE):
            p = pics[rng.integers(len(pics))]
            oy, ox = rng.integers(p.shape[0] - TILE + 1), rng.integers(p.shape[1] - TILE + 1)
            tile = p[oy : oy + TILE, ox : ox + TILE]
            if rng.integers(2):
                tile = tile[:, ::-1]
            out[y : y + TILE, x : x + TILE] = tile[: min(TILE, h - y), : min(TILE, w - x)]
    return out


def _tag(size: tuple[int, int]) -> str:
    return "" if size == (W, H) else f"-{size[0]}x{size[1]}"


def source_frames(work: Path, frames: int, size: tuple[int, int] = (W, H)) -> Path:
    """``work/src4k_stream``: ``frames`` 4K PNG frames (seed 1), made if missing; other sizes beside it."""
    src = work / f"src4k_stream{_tag(size)}"
    if not src.exists() or len(list(src.glob("*.png"))) != frames:
        src.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(1)
        pics = real_photos()
        for i in range(frames):
            Image.fromarray(mosaic_4k(pics, rng, size)).save(src / f"f{i:03d}.png", compress_level=1)
    return src


def shards(work: Path, frames: int, size: tuple[int, int] = (W, H)) -> dict[str, str]:
    """The stream bench's shards, x4, PNG and QOI: {codec: url}, built if missing (frames of ``size``)."""
    src = source_frames(work, frames, size)
    out = {}
    for codec in (Codec.PNG, Codec.QOI):
        url = str(work / f"stream-{codec.value}{_tag(size)}")
        done = Path(url) / "manifest.json"
        if not (done.exists() and json.loads(done.read_text()).get("samples") == frames):
            build(
                BuildConfig(
                    hr_src=str(src),
                    out=url,
                    sample=SampleConfig(scales=(4,), codec=codec),
                    workers=2,
                    progress=False,
                    shard_size=200 * 10**6,
                    overwrite=True,
                )
            )
        out[codec.value] = url
    return out


def warm_page_cache(files: Iterable[Path]) -> None:
    """Read ``files`` into the page cache through one reused buffer (no freed blocks that would move
    the malloc thresholds that forked workers inherit)."""
    buf = bytearray(64 << 20)
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


# ---- timers -----------------------------------------------------------------------------------
def seconds_of(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def median_s(fn: Callable[[], Any], repeat: int = 3) -> float:
    """Median seconds of ``repeat`` calls after one warm-up call (first touches of large buffers fault pages in)."""
    fn()
    return statistics.median(seconds_of(fn) for _ in range(repeat))


def best_s(fn: Callable[[], Any], repeat: int = 5) -> float:
    """Fastest of ``repeat`` calls, in seconds."""
    return min(seconds_of(fn) for _ in range(repeat))


def mean_us(fn: Callable[[], Any], n: int = 5000) -> float:
    """Mean microseconds per call over ``n`` calls after one warm-up call."""
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def cpu_idle_total() -> tuple[int, int]:
    """(idle + iowait, all) jiffies of the whole machine, from /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return v[3] + v[4], sum(v)


# ---- tables and reports -----------------------------------------------------------------------
def md_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _f(v: float, fmt: str, unit: str = "") -> str:
    return "-" if v != v else format(v, fmt) + unit


# a column of a loader table: header, cell from a BenchResult
COLUMNS: dict[str, tuple[str, Callable[[BenchResult], str]]] = {
    "patches/s": ("patches/s", lambda r: f"{r.patches_per_s:.1f}"),
    "MB/s": ("MB/s read", lambda r: _f(r.mb_per_s, ".0f")),
    "decode share": ("decode share", lambda r: _f(r.decode_share * 100, ".0f", "%")),
    "decode ms": ("decode ms/sample", lambda r: _f(r.decode_ms, ".1f")),
    "verify ms": ("verify ms/sample", lambda r: _f(r.verify_ms, ".1f")),
    "ms/patch": ("ms/patch", lambda r: _f(r.patch_ms, ".3f")),
    "of ceiling": ("of ceiling", lambda r: _f(r.efficiency * 100, ".0f", "%")),
    "private": ("private/worker", lambda r: _f(r.peak_private_mb, ".0f", " MB")),
    "first batch": ("first batch", lambda r: _f(r.first_batch_s, ".2f", " s")),
    "cache hits": ("cache hits", lambda r: _f(r.cache_hit_rate * 100, ".0f", "%")),
}
DEFAULT_COLUMNS = ("patches/s", "decode ms", "ms/patch", "of ceiling", "private")


def loader_table(results: Iterable[BenchResult], columns: Sequence[str] = DEFAULT_COLUMNS) -> str:
    """A narrow table of ``wdsr bench`` results: the loader's name and the chosen ``COLUMNS``."""
    cols = [COLUMNS[c] for c in columns]
    return md_table(["loader", *(h for h, _ in cols)], ([r.name, *(cell(r) for _, cell in cols)] for r in results))


def machine_line() -> str:
    """Date, load averages and cores, for the top of a report."""
    one, five, _ = os.getloadavg()
    return f"{time.strftime('%Y-%m-%d')}, load {one:.2f} (1 min) / {five:.2f} (5 min) at start, {os.cpu_count()} cores"


def report(out: Path, name: str, text: str, data: Any = None) -> None:
    """Print ``text`` and keep it as ``out/NAME.md`` (and ``data`` as ``out/NAME.json``)."""
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(text + "\n")
    if data is not None:
        (out / f"{name}.json").write_text(json.dumps(data, indent=1, default=lambda o: o.__dict__))


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose --help is the bench's docstring."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
