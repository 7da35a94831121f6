"""The data of ``bench.gpu_check``, made on the machine itself (it may have no network): frames cut from the
4K real-photo mosaics of ``bench/common.py``, in parallel, and x4 PNG shards built from them by
``shardmaker build``; a place for the decoded cache. Both are reused when a later run finds them."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from bench.common import REPO, H, W, mosaic_4k, real_photos
from shardmaker import format as fmt
from wdsr.store.decoded import pair_bytes

log = logging.getLogger("gpu_check")
FRAME_WH = (W, H)  # the mosaics' size: frames are cut from it
_PICS: list[np.ndarray] = []  # the photos, loaded before the frame makers fork


@dataclasses.dataclass
class Data:
    url: str
    frames: int
    frame_wh: tuple[int, int]
    build_s: float
    decoded_bytes: int
    cache: Path
    cache_fill_s: float = float("nan")


def _frame(job: tuple[Path, int, int, int]) -> None:
    """Frame ``i``: a 4K mosaic (seeded by ``i``) cut to ``w`` x ``h``, written under a temporary name."""
    src, i, w, h = job
    frame = mosaic_4k(_PICS, np.random.default_rng([1, i]))[:h, :w]
    tmp = src / f".f{i:04d}.png"
    Image.fromarray(np.ascontiguousarray(frame)).save(tmp, compress_level=1)
    tmp.rename(src / f"f{i:04d}.png")


def frames(work: Path, n: int, wh: tuple[int, int], procs: int) -> Path:
    """``work/frames-WxH-N``: ``n`` PNG frames of ``wh`` (at most 3840 x 2160), made where missing."""
    w, h = wh
    src = work / f"frames-{w}x{h}-{n}"
    src.mkdir(parents=True, exist_ok=True)
    todo = [(src, i, w, h) for i in range(n) if not (src / f"f{i:04d}.png").exists()]
    if not todo:
        return src
    _PICS[:] = real_photos()
    if procs <= 1 or len(todo) == 1:
        for job in todo:
            _frame(job)
    else:
        with multiprocessing.get_context("fork").Pool(min(procs, len(todo))) as pool:
            pool.map(_frame, todo)
    return src


def shards(src: Path, n: int, scale: int, procs: int) -> str:
    """x``scale`` PNG shards of the frames in ``src`` (``shardmaker build``, its own process: its spawned
    workers then import shardmaker, not this script and torch); built unless complete."""
    out = src.with_name(f"shards-x{scale}-{src.name}")
    if (out / "manifest.json").exists() and fmt.load(str(out)).samples == n:
        return str(out)
    cmd = [sys.executable, "-m", "shardmaker", "-q", "build", str(src), str(out), "--scale", str(scale)]
    cmd += ["--workers", str(procs), "--shard-size", "200MB", "--overwrite"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"shardmaker build {src} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return str(out)


def cache_place(work: Path, need: int, given: str | None) -> Path:
    """The decoded cache: ``given``, else under /dev/shm when it has twice ``need`` bytes free, else in ``work``."""
    if given:
        return Path(given)
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 2 * need:
        return shm / f"wdsr-gpu-check-{os.getpid()}"
    return work / "decoded"


def prepare(work: Path, n: int, wh: tuple[int, int], scale: int, cache: str | None) -> Data:
    """Frames and shards (every core), and where the decoded cache goes."""
    t0, procs = time.perf_counter(), os.cpu_count() or 1
    url = shards(frames(work, n, wh, procs), n, scale, procs)
    built = time.perf_counter() - t0
    m = fmt.load(url)
    need = int(sum(pair_bytes(size, scale, 3) for sh in m.shards for size in sh.hr_sizes))
    log.info("data: %d frames of %d x %d, x%d PNG shards at %s (%.1f s)", n, *wh, scale, url, built)
    return Data(url, n, wh, built, need, cache_place(work, need, cache))
