"""``wdsr bench``: patches/s, MB/s read, decode share, memory; optionally against a naive Dataset.

The naive baseline is the popular map-style Dataset that decodes the whole HR/LR pair for every
patch it returns (BasicSR-style ``PairedImageDataset`` on the same shards, same decoder).
"""

from __future__ import annotations

import dataclasses
import io
import os
import random
import time
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from shardmaker import deprecation
from shardmaker import format as fmt
from wdsr.dataset import SRDataset
from wdsr.loader import make_loader
from wdsr.pipeline.checks import Verify
from wdsr.pipeline.decode import decode_pair, wanted_members
from wdsr.pipeline.plan import Span
from wdsr.pipeline.read import ShardReader
from wdsr.pipeline.worker import worker_init


@dataclasses.dataclass
class BenchResult:
    name: str
    patches_per_s: float
    mb_per_s: float
    decode_share: float
    decode_ms: float  # per sample (HR + LR), image decoding alone
    verify_ms: float  # per sample, digest check
    patch_ms: float  # per patch: its crop, transform and copy into the batch
    ceiling: float  # decode-bound patches/s for this many workers
    peak_rss_mb: float
    peak_private_mb: float
    seconds: float
    batches: int
    first_batch_s: float = float("nan")  # loader made -> first batch (workers start, buffers fill, first reads)
    cache_hit_rate: float = float("nan")  # shard opens served by the local cache (remote datasets with cache_dir)
    retries: int = 0

    @property
    def efficiency(self) -> float:
        return self.patches_per_s / self.ceiling if self.ceiling else float("nan")


def fill_decoded_cache(url: str, scale: int, root: str, limit: int | None, workers: int = 2) -> tuple[int, float]:
    """Decode every image once (a val pass) into the decoded cache at ``root``: (pairs written, seconds)."""
    t0 = time.perf_counter()
    ds = SRDataset(url, scale=scale, split="val", decoded_cache=root, decoded_cache_limit=limit)
    for _ in make_loader(ds, num_workers=workers):
        pass
    return ds.stats.totals()["decoded_stores"], time.perf_counter() - t0


def bench_stream(
    url: str,
    workers: int = 2,
    batch_size: int = 16,
    patches_per_image: int = 16,
    patch_size: int = 192,
    scale: int = 4,
    seconds: float = 20.0,
    verify: str = "xxh3_64",
    shuffle_buffer: int = 256,
    storage_options: dict[str, Any] | None = None,
    name: str = "wdsr",
    prefetch_factor: int | None = None,
    **read: Any,
) -> BenchResult:
    """Stream ``url`` for ``seconds`` after a warm-up; ``read`` goes to SRDataset (read_ahead, cache_dir, ...)."""
    if "k" in read:
        deprecation.warn("bench_stream(k=...)", "bench_stream(patches_per_image=...)")
        patches_per_image = read.pop("k")
    t_start = time.perf_counter()
    ds = SRDataset(
        url,
        scale=scale,
        patch_size=patch_size,
        patches_per_image=patches_per_image,
        batch_size=batch_size,
        shuffle_buffer=shuffle_buffer,
        verify=verify,
        storage_options=storage_options,
        **read,
    )
    loader = make_loader(ds, num_workers=workers, pin_memory=False, prefetch_factor=prefetch_factor)
    first_batch_s = float("nan")
    # Warm up past the shuffle-buffer fill: until then workers decode without emitting, and
    # their buffered patches would arrive "for free" inside the measured window.
    warm = -(-max(1, workers) * shuffle_buffer // batch_size) + 2 * max(1, workers)
    n, t0, before, epoch = 0, None, None, 0
    while True:
        for _ in loader:
            n += 1
            if n == 1 and epoch == 0:
                first_batch_s = time.perf_counter() - t_start
            if n == warm:
                t0, before = time.perf_counter(), ds.stats.totals()
            if t0 is not None and time.perf_counter() - t0 >= seconds:
                break
        else:
            epoch += 1
            ds.set_epoch(epoch)
            continue
        break
    assert t0 is not None and before is not None  # the loop above ran past its warm-up
    dt = time.perf_counter() - t0
    after = ds.stats.totals()
    d = {key: after[key] - before[key] for key in ("samples", "bytes_read", "decode_ns", "patch_ns", "patches", "verify_ns")}
    batches = n - warm
    # per-sample and per-patch costs over the measured window, as the rates are (the warm-up's
    # first epoch maps a decoded cache's pages in); over the whole run when the window saw none
    w = d if d["samples"] and d["patches"] else after
    decode_ms = w["decode_ns"] / max(w["samples"], 1) / 1e6
    verify_ms = w["verify_ns"] / max(w["samples"], 1) / 1e6
    patch_ms = w["patch_ns"] / max(w["patches"], 1) / 1e6
    cores = min(max(1, workers), os.cpu_count() or 1)
    ceiling = cores * 1000.0 / (decode_ms / patches_per_image + patch_ms)
    opens = after["cache_hits"] + after["cache_misses"]
    res = BenchResult(
        name,
        batches * batch_size / dt,
        d["bytes_read"] / 1e6 / dt,
        d["decode_ns"] / 1e9 / (dt * max(1, workers)),
        decode_ms,
        verify_ms,
        patch_ms,
        ceiling,
        after["peak_rss_kb_per_worker"] / 1024,
        after["peak_private_kb_per_worker"] / 1024,
        dt,
        batches,
        first_batch_s,
        after["cache_hits"] / opens if opens else float("nan"),
        after["retries"],
    )
    del loader
    return res


class NaiveDataset(Dataset):
    """Decode the whole pair for every patch it returns: one random aligned patch per item.

    ``len`` is samples x ``enlarge`` (BasicSR's ``dataset_enlarge_ratio``) so that epochs are
    long. ``decoder="pillow"`` decodes with Pillow, as most SR repositories do;
    ``decoder="same"`` uses wdsr's own decoders (libspng / QOI).
    """

    def __init__(
        self,
        url: str,
        scale: int,
        patch_size: int,
        decoder: str = "pillow",
        enlarge: int = 100,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.manifest = fmt.load(url, storage_options)
        self.reader = ShardReader(url, self.manifest, storage_options)
        self.index = [(s, i) for s, sh in enumerate(self.manifest.shards) for i in range(sh.samples)]
        self.scale, self.patch_size, self.decoder, self.enlarge = scale, patch_size, decoder, enlarge
        self.wanted = wanted_members(self.manifest, scale)
        self.names = self.manifest.member_names(scale)

    def __len__(self) -> int:
        return len(self.index) * self.enlarge

    def _pair(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        shard, i = self.index[n % len(self.index)]
        raw = next(self.reader.span(Span(shard, i, i + 1), self.wanted))
        if self.decoder == "same":
            pair = decode_pair(raw, self.names, self.scale, verify=Verify.NONE)
            return pair.hr, pair.lr
        hr = np.asarray(Image.open(io.BytesIO(raw.members[self.names[0]])))
        lr = np.asarray(Image.open(io.BytesIO(raw.members[self.names[1]])))
        return hr, lr

    def __getitem__(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        hr_img, lr_img = self._pair(n)
        p, s = self.patch_size // self.scale, self.scale
        lh, lw = lr_img.shape[:2]
        y, x = random.randint(0, lh - p), random.randint(0, lw - p)
        lr = np.ascontiguousarray(lr_img[y : y + p, x : x + p].transpose(2, 0, 1))
        hr = np.ascontiguousarray(hr_img[s * y : s * (y + p), s * x : s * (x + p)].transpose(2, 0, 1))
        return torch.from_numpy(lr), torch.from_numpy(hr)


def bench_naive(
    url: str,
    workers: int = 2,
    batch_size: int = 16,
    patch_size: int = 192,
    scale: int = 4,
    seconds: float = 20.0,
    decoder: str = "pillow",
    storage_options: dict[str, Any] | None = None,
) -> BenchResult:
    ds = NaiveDataset(url, scale, patch_size, decoder, storage_options=storage_options)
    extra: dict[str, Any] = {"persistent_workers": True, "worker_init_fn": worker_init} if workers else {}
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True, **extra)
    warm = max(1, workers)
    n, t0 = 0, None
    while True:
        for _ in loader:
            n += 1
            if n == warm:
                t0 = time.perf_counter()
            if t0 is not None and time.perf_counter() - t0 >= seconds:
                break
        else:
            continue
        break
    dt = time.perf_counter() - t0
    batches = n - warm
    name = f"naive decode-per-patch ({'Pillow' if decoder == 'pillow' else 'same decoders'})"
    return BenchResult(
        name,
        batches * batch_size / dt,
        float("nan"),
        float("nan"),
        float("nan"),
        float("nan"),
        float("nan"),
        float("nan"),
        float("nan"),
        float("nan"),
        dt,
        batches,
    )


def table(results: list[BenchResult], patches_per_image: int) -> str:
    head = (
        "| loader | patches/s | MB/s read | decode share | decode ms/sample | verify ms/sample | ms/patch "
        "| ceiling | of ceiling | peak RSS/worker | private/worker | first batch | cache hits | retries |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in results:

        def f(v: float, fmt: str) -> str:
            return "-" if v != v else format(v, fmt)

        lines.append(
            f"| {r.name} | {r.patches_per_s:.1f} | {f(r.mb_per_s, '.1f')} | {f(r.decode_share * 100, '.0f')}% | "
            f"{f(r.decode_ms, '.1f')} | {f(r.verify_ms, '.1f')} | {f(r.patch_ms, '.2f')} | "
            f"{f(r.ceiling, '.1f')} | {f(r.efficiency * 100, '.0f')}% | "
            f"{f(r.peak_rss_mb, '.0f')} MB | {f(r.peak_private_mb, '.0f')} MB | {f(r.first_batch_s, '.2f')} s | "
            f"{f(r.cache_hit_rate * 100, '.0f')}% | {r.retries} |"
        )
    return "\n".join(lines)
