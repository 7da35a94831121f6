"""The tables of ``bench.inplace``: one row per arm (medians over the rounds and their range), and
in place against PNG shards and LitData, the ratio taken round by round."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench.common import md_table
from wdsr.tools.bench import BenchResult


def _med(xs: Sequence[float], f: str, unit: str = "") -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "-"
    one = format(statistics.median(xs), f) + unit
    return one if len(xs) == 1 else f"{one} ({format(min(xs), f)}-{format(max(xs), f)})"


def table(runs: dict[str, list[BenchResult]]) -> str:
    """One row per arm (``runs`` keyed "where: loader"): medians over the rounds, their range in brackets."""
    rows = []
    for key, rs in runs.items():
        where, name = key.split(": ", 1)
        rows.append(
            [
                where,
                name,
                _med([r.patches_per_s for r in rs], ".1f"),
                _med([r.first_batch_s for r in rs], ".2f", " s"),
                _med([r.decode_ms for r in rs], ".0f"),
                _med([r.efficiency * 100 for r in rs], ".0f", "%"),
            ]
        )
    head = ["where", "loader", "patches/s: median (range)", "first batch", "decode ms/sample", "of ceiling"]
    return md_table(head, rows)


def paired(runs: dict[str, list[BenchResult]], a: str, b: str) -> str | None:
    """Median (range) over the rounds of a's patches/s over b's in the same round."""
    if a not in runs or b not in runs:
        return None
    rs = [x.patches_per_s / y.patches_per_s for x, y in zip(runs[a], runs[b], strict=True)]
    one = f"**{statistics.median(rs):.2f}x**"
    return one if len(rs) == 1 else f"{one} (rounds: {min(rs):.2f}-{max(rs):.2f}x)"


def ratios(runs: dict[str, list[BenchResult]], ks: Sequence[int]) -> list[str]:
    """In place against PNG shards and against LitData, where and for each k, round by round."""
    lit = "LitData StreamingRawDataset, 1 patch/decode"
    lines = []
    for where in dict.fromkeys(key.split(": ", 1)[0] for key in runs):
        for k in ks:
            ours_k = f"{where}: in place (PNG files), k={k}"
            if (r := paired(runs, ours_k, f"{where}: PNG shards, k={k}")) is not None:
                lines.append(f"- {where}, k={k}: in place / PNG shards {r}")
            if (r := paired(runs, ours_k, f"{where}: {lit}")) is not None:
                lines.append(f"- {where}, k={k}: in place / LitData raw {r}")
    return lines
