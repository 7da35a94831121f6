"""Counters shared between DataLoader workers and the trainer process (one row per worker)."""
from __future__ import annotations

import multiprocessing as mp
import resource
from typing import Any

FIELDS = ("samples", "patches", "batches", "skipped", "bytes_read", "read_ns", "decode_ns", "patch_ns",
          "busy_ns", "rejected", "peak_rss_kb")


class SharedStats:
    """Lock-free per-worker counters in shared memory; made before the workers start."""

    def __init__(self, slots: int = 64) -> None:
        self.slots = slots
        self._arr = mp.RawArray("q", slots * len(FIELDS))

    def add(self, worker: int, **values: int) -> None:
        base = (worker % self.slots) * len(FIELDS)
        for name, v in values.items():
            self._arr[base + FIELDS.index(name)] += int(v)

    def mark_rss(self, worker: int) -> None:
        base = (worker % self.slots) * len(FIELDS) + FIELDS.index("peak_rss_kb")
        self._arr[base] = max(self._arr[base], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)

    def rows(self) -> list[dict[str, int]]:
        n = len(FIELDS)
        rows = [dict(zip(FIELDS, self._arr[i * n : (i + 1) * n])) for i in range(self.slots)]
        return [r for r in rows if any(r.values())]

    def totals(self) -> dict[str, Any]:
        rows = self.rows()
        out: dict[str, Any] = {f: sum(r[f] for r in rows) for f in FIELDS if f != "peak_rss_kb"}
        out["peak_rss_kb_per_worker"] = max((r["peak_rss_kb"] for r in rows), default=0)
        out["workers"] = len(rows)
        return out

    def reset(self) -> None:
        for i in range(len(self._arr)):
            self._arr[i] = 0
