"""Counters shared between DataLoader workers and the trainer process (one row per worker)."""

from __future__ import annotations

import resource
import time
from typing import Any

import torch

FIELDS = (
    "samples",
    "patches",
    "batches",
    "skipped",
    "bytes_read",
    "read_ns",
    "verify_ns",
    "decode_ns",
    "patch_ns",
    "busy_ns",
    "rejected",
    "retries",
    "cache_hits",
    "cache_misses",
    "decoded_hits",
    "decoded_stores",
    "decoded_rejected",
    "peak_rss_kb",
    "peak_private_kb",
)


class SharedStats:
    """Lock-free per-worker counters in shared memory; made before the workers start."""

    def __init__(self, slots: int = 64) -> None:
        self.slots = slots
        # torch shared memory rather than multiprocessing's heap, whose arenas slowed worker exit here
        self._tensor = torch.zeros(slots * len(FIELDS), dtype=torch.int64).share_memory_()
        self._arr = self._tensor.numpy()
        self._next_mark = -1e9

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_arr"]  # rebuilt from the shared tensor on the other side
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._arr = self._tensor.numpy()

    def add(self, worker: int, **values: int) -> None:
        base = (worker % self.slots) * len(FIELDS)
        for name, v in values.items():
            self._arr[base + FIELDS.index(name)] += int(v)

    def mark_rss(self, worker: int, every_s: float = 1.0, max_share: float = 0.01) -> None:
        """Record peak RSS (shared pages included) and private memory (what this worker adds).

        Reading /proc/self/smaps_rollup walks every page this process maps: milliseconds with
        torch mapped, ~47 ms with 3.3 GB of decoded-cache pairs mapped (more the more it maps).
        So this samples at most once per ``every_s`` seconds, and at most ``max_share`` of the
        time: after a read that took c seconds, the next waits at least c / ``max_share``.
        """
        now = time.monotonic()
        if now < self._next_mark:
            return
        base = (worker % self.slots) * len(FIELDS)
        i = base + FIELDS.index("peak_rss_kb")
        self._arr[i] = max(self._arr[i], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        i = base + FIELDS.index("peak_private_kb")
        self._arr[i] = max(self._arr[i], private_kb())
        self._next_mark = now + max(every_s, (time.monotonic() - now) / max_share)

    def rows(self) -> list[dict[str, int]]:
        n = len(FIELDS)
        rows = [dict(zip(FIELDS, map(int, self._arr[i * n : (i + 1) * n]), strict=True)) for i in range(self.slots)]
        return [r for r in rows if any(r.values())]

    def totals(self) -> dict[str, Any]:
        rows = self.rows()
        out: dict[str, Any] = {f: sum(r[f] for r in rows) for f in FIELDS if not f.startswith("peak_")}
        out["peak_rss_kb_per_worker"] = max((r["peak_rss_kb"] for r in rows), default=0)
        out["peak_private_kb_per_worker"] = max((r["peak_private_kb"] for r in rows), default=0)
        out["workers"] = len(rows)
        return out

    def reset(self) -> None:
        self._arr[:] = 0


def private_kb() -> int:
    """Private (unshared) memory of this process in KiB, from /proc (0 where unavailable)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Clean:", "Private_Dirty:")))
    except (OSError, ValueError, IndexError):
        return 0
