"""LitData's raw path as an SR user would pair it: ``StreamingRawDataset`` over the HR and LR files.

The folder (or S3 prefix) holds ``hr/NAME.png`` and ``lr/NAMEx4.png``; ``setup`` groups each HR file
with its LR file (LitData's documented way to make multi-file items), and the transform does what
BasicSR's ``PairedImageDataset`` does with the two byte strings: decode both with OpenCV, cut ONE
aligned random patch, flip/transpose it at random, make uint8 CHW tensors. One decode per patch,
so the rate is about ``workers / decode time``: the k-patches factor is what wdsr adds over it.

A plain ``torch.utils.data.DataLoader`` with a sampler drawing indexes with replacement (BasicSR's
``dataset_enlarge_ratio`` in another form), 2 workers, batch 16. ``max_prefetch=0``: LitData's
look-ahead keeps *transformed* items in an LRU keyed by index, so on a small set a repeated index
would be handed the same patch again without a decode; its look-ahead only runs for sequential
indexes anyway, which a shuffled sampler never asks for.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import zstd  # noqa: F401  litdata's raw path needs it to cache its listing, and does not list it as a requirement
from litdata import StreamingRawDataset
from litdata.raw.indexer import FileMetadata
from torch.utils.data import DataLoader, RandomSampler

from bench.basicsr_crop import paired_crop
from wdsr.pipeline.worker import tune_malloc
from wdsr.tools.bench import BenchResult

SCALE, PATCH = 4, 192


def _stem(path: str) -> str:
    return path.rsplit("/", 1)[-1].rsplit(".", 1)[0]


class PairedRaw(StreamingRawDataset):
    """Items are ``[hr_file, lr_file]``: ``hr/NAME.png`` with ``lr/NAMEx4.png``."""

    def setup(self, files: list[FileMetadata]) -> list[list[FileMetadata]]:
        hr = {_stem(f.path): f for f in files if "/hr/" in f.path and f.path.endswith(".png")}
        lr = {_stem(f.path).removesuffix(f"x{SCALE}"): f for f in files if "/lr/" in f.path and f.path.endswith(".png")}
        return [[hr[k], lr[k]] for k in sorted(hr) if k in lr]


def paired_patch(data: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode HR and LR (cv2, as BasicSR does), cut one aligned random patch, flip, CHW uint8 RGB."""
    gt, lq = (cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR) for b in data)
    return paired_crop(gt, lq)


def _tuned(_worker_id: int) -> None:
    tune_malloc()  # what every wdsr worker does first: the same malloc thresholds for both loaders


def bench_litdata(
    url: str,
    cache_dir: Path,
    name: str = "LitData raw",
    seconds: float = 15.0,
    workers: int = 2,
    batch_size: int = 16,
    warm_batches: int = 4,
    storage_options: dict[str, Any] | None = None,
) -> BenchResult:
    """patches/s and time to the first batch (dataset made -> first batch) of LitData's raw path."""
    t_start = time.perf_counter()
    ds = PairedRaw(
        url.rstrip("/") + "/",
        cache_dir=str(cache_dir),
        transform=paired_patch,
        max_prefetch=0,
        storage_options=storage_options,
    )
    if not ds.items:
        raise ValueError(f"{url}: no hr/NAME.png + lr/NAMEx{SCALE}.png pairs")
    pair_bytes = sum(f.size for item in ds.items for f in item) / len(ds.items)
    sampler = RandomSampler(ds, replacement=True, num_samples=len(ds) * 10_000)
    loader = DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=workers, drop_last=True, worker_init_fn=_tuned)
    it = iter(loader)
    next(it)
    first_batch_s = time.perf_counter() - t_start
    for _ in range(warm_batches):
        next(it)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        next(it)
        n += 1
    dt = time.perf_counter() - t0
    del it, loader  # workers shut down
    nan = float("nan")
    rate = n * batch_size / dt
    return BenchResult(name, rate, rate * pair_bytes / 1e6, nan, nan, nan, nan, nan, nan, nan, dt, n, first_batch_s)
