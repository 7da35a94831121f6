"""A run's ``metrics.jsonl`` read for ``wdsr plot`` in bounded memory: streamed a line at a time, only the
plotted series kept, each decimated to at most ``BUCKETS`` step buckets.

Decimation is min/max: a bucket keeps the lowest and the highest value of its steps (so a spike stays
visible); the bucket width (in steps) starts at 1 and doubles whenever a series has more than ``BUCKETS``
buckets. Non-finite values (NaN, inf, ints past a float) stay off the axes and are counted per bucket, to be
marked. Bad lines (not JSON, not an object, no step that is an int in [0, 2^53], over ``MAX_LINE``) are
skipped and counted. A step at or before one already read starts the history over from it: a resumed
attempt's replayed steps replace the earlier attempt's (in histories written before runs carried them over).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import posixpath
from collections import Counter
from typing import Any, BinaryIO

from shardmaker import storage
from wdsr.jsonl import MAX_LINE, lines

log = logging.getLogger("wdsr")
PANELS = ("loss", "lr", "psnr_y", "ssim_y", "patches_per_s", "data_wait")
REFERENCES = {"psnr_y": "bicubic_psnr_y", "ssim_y": "bicubic_ssim_y"}  # a panel's baseline (wdsr train, step 0)
BUCKETS = 2000  # per series: at most 2 x BUCKETS points are drawn
MAX_STEP = 1 << 53  # steps are exact as floats up to here
Point = tuple[int, float]


class _Bucket:
    """The steps ``key * width`` .. ``(key + 1) * width - 1`` of a series: their lowest and highest finite
    points, and how many values were not finite (between the steps ``bad_first`` and ``bad_last``)."""

    __slots__ = ("bad", "bad_first", "bad_last", "hi", "key", "lo")

    def __init__(self, key: int) -> None:
        self.key = key
        self.lo: Point | None = None
        self.hi: Point | None = None
        self.bad = self.bad_first = self.bad_last = 0

    def add(self, step: int, value: float) -> None:
        if not math.isfinite(value):
            self.bad_first = step if not self.bad else self.bad_first
            self.bad, self.bad_last = self.bad + 1, step
        elif self.lo is None or self.hi is None:
            self.lo = self.hi = (step, value)
        elif value < self.lo[1]:
            self.lo = (step, value)
        elif value > self.hi[1]:
            self.hi = (step, value)

    def merge(self, other: _Bucket) -> None:
        """Take in ``other``, a bucket of later steps."""
        for p in (other.lo, other.hi):
            if p is not None:
                self.add(*p)
        if other.bad:
            self.bad_first = other.bad_first if not self.bad else self.bad_first
            self.bad, self.bad_last = self.bad + other.bad, other.bad_last

    def cut(self, step: int) -> bool:
        """Forget what is at ``step`` or later (the finite points exactly, the non-finite count roughly);
        whether anything is left."""
        self.lo = self.lo if self.lo is not None and self.lo[0] < step else None
        self.hi = self.hi if self.hi is not None and self.hi[0] < step else None
        self.lo, self.hi = self.lo or self.hi, self.hi or self.lo
        if self.bad and self.bad_first >= step:
            self.bad = 0
        elif self.bad and self.bad_last >= step:
            self.bad, self.bad_last = 1, self.bad_first
        return self.lo is not None or self.bad > 0


class Curve:
    """One metric's values over steps, in at most ``cap`` buckets (see the module)."""

    def __init__(self, cap: int = BUCKETS) -> None:
        self.cap, self.width = cap, 1
        self.buckets: list[_Bucket] = []
        self.last = -1  # the last step added

    def add(self, step: int, value: float) -> None:
        if step <= self.last:
            self.rewind(step)
        key = step // self.width
        if not self.buckets or self.buckets[-1].key != key:
            self.buckets.append(_Bucket(key))
        self.buckets[-1].add(step, value)
        self.last = step
        while len(self.buckets) > self.cap:
            self._coarsen()

    def rewind(self, step: int) -> None:
        """Forget the values of ``step`` and later."""
        key = step // self.width
        while self.buckets and (self.buckets[-1].key > key or not self.buckets[-1].cut(step)):
            self.buckets.pop()
        self.last = min(self.last, step - 1)

    def _coarsen(self) -> None:
        self.width *= 2
        merged: list[_Bucket] = []
        for b in self.buckets:
            b.key //= 2
            if merged and merged[-1].key == b.key:
                merged[-1].merge(b)
            else:
                merged.append(b)
        self.buckets = merged

    def points(self) -> list[Point]:
        """The finite points kept, in step order."""
        out: list[Point] = []
        for b in self.buckets:
            if b.lo is not None and b.hi is not None:
                out.extend(sorted({b.lo, b.hi}))
        return out

    def bad_steps(self) -> list[int]:
        """Steps at which values were not finite (one or two per bucket that had any)."""
        return sorted({s for b in self.buckets if b.bad for s in (b.bad_first, b.bad_last)})

    @property
    def nonfinite(self) -> int:
        return sum(b.bad for b in self.buckets)


@dataclasses.dataclass
class Metrics:
    """What ``read_metrics`` kept of a file: a curve per panel, and the lines it skipped and why."""

    url: str
    curves: dict[str, Curve]
    records: int = 0  # lines with a valid step
    skipped: Counter[str] = dataclasses.field(default_factory=Counter)


def _value(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        return float(v)
    except OverflowError:  # an int past the largest float
        return math.inf if v > 0 else -math.inf


def _record(raw: bytes) -> dict[str, Any] | str:
    """The line's record, or why it is skipped."""
    try:
        d = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, an int of over 4300 digits, nested too deep
        return "not JSON"
    if not isinstance(d, dict):
        return "not a JSON object"
    step = d.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        return "without a step (an integer in [0, 2^53])"
    return d


def _open(url: str) -> BinaryIO:
    """The one place ``wdsr plot`` opens the metrics file (local or any fsspec URL)."""
    fs, path = storage.open_dir(url)
    try:
        f: BinaryIO = storage.open_input(fs, path)  # a local one must be a regular file (a FIFO would hang)
    except FileNotFoundError:
        raise FileNotFoundError(f"{url}: no such file (is it a wdsr train run folder?)") from None
    return f


def read_metrics(run: str, panels: tuple[str, ...] = PANELS) -> Metrics:
    """The curves of ``RUN/metrics.jsonl`` (or of a ``.jsonl`` file named directly), in bounded memory: the
    panels' and their baselines' (``REFERENCES``: the val set's bicubic PSNR-Y/SSIM-Y)."""
    url = run if run.endswith(".jsonl") else posixpath.join(run.rstrip("/"), "metrics.jsonl")
    kept = (*panels, *(REFERENCES[p] for p in panels if p in REFERENCES))
    m = Metrics(url, {name: Curve() for name in kept})
    last = -1
    with _open(url) as f:
        for raw in lines(f):
            rec = f"over {MAX_LINE >> 20} MiB" if raw is None else _record(raw)
            if isinstance(rec, str):
                torn = raw is not None and not raw.endswith(b"\n") and rec == "not JSON"
                m.skipped["a half-written last line" if torn else rec] += 1
                continue
            m.records += 1
            step = rec["step"]
            if step < last:  # a resumed attempt starts over from here
                for curve in m.curves.values():
                    curve.rewind(step)
            last = step
            for name, curve in m.curves.items():
                if (v := _value(rec.get(name))) is not None:
                    curve.add(step, v)
    if not m.records:
        raise ValueError(f"{url}: no metric records (JSON lines with a 'step'){_skipped(m, '; ')}")
    _report(m)
    return m


def _skipped(m: Metrics, lead: str = "") -> str:
    if not m.skipped:
        return ""
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(m.skipped.items()))
    return f"{lead}skipped {sum(m.skipped.values())} lines ({why})"


def _report(m: Metrics) -> None:
    if m.skipped:
        log.warning("plot: %s: %s", m.url, _skipped(m))
    bad = {name: c.nonfinite for name, c in m.curves.items() if c.nonfinite}
    if bad:
        counts = ", ".join(f"{name} {n}" for name, n in bad.items())
        log.warning("plot: %s: non-finite values (NaN, inf) left off the axes, marked in red: %s", m.url, counts)


def series(m: Metrics, name: str) -> list[tuple[float, float]]:
    """``name``'s finite (step, value) points kept, in step order."""
    return [(float(s), v) for s, v in m.curves[name].points()]


def reference(m: Metrics, panel: str) -> float | None:
    """``panel``'s baseline (the last ``REFERENCES`` value read), or None where the run logged none."""
    name = REFERENCES.get(panel)
    points = m.curves[name].points() if name in m.curves else []
    return points[-1][1] if points else None
