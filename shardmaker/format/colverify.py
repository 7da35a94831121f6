"""The column index checked against the manifest it names, column by column (``shardmaker verify``).

An index carries its manifest's identity (size, probe, digest) and the streaming reader then trusts
its columns: an index that names the real manifest but lists fewer shards, other keys or other
offsets would stream another dataset than the one ``verify`` checks. This compares what the reader
sees (:func:`.loading.load_index`) with the JSON, field by field, and names each difference.
"""

from __future__ import annotations

from typing import Any

from shardmaker.errors import brief
from shardmaker.format.manifest import Manifest

__all__ = ["index_problems"]

MAX_PROBLEMS = 20  # listed one by one; the rest counted


def _top(m: Manifest, indexed: Manifest, where: str) -> list[str]:
    want, got = m.top_json(), indexed.top_json()
    return [
        f"{where}: {field}: {brief(got.get(field))} where the manifest has {brief(want.get(field))}"
        for field in sorted(set(want) | set(got))
        if want.get(field) != got.get(field)
    ]


def _shard(want: dict[str, Any], got: dict[str, Any], where: str) -> list[str]:
    """The fields of one shard entry that differ (a probe only where the manifest records one)."""
    fields = [f for f in want.keys() | got.keys() if f != "probe" or "probe" in want]
    return [
        f"{where}: shard {want['name']}: {field} differs from the manifest's"
        for field in sorted(fields)
        if want.get(field) != got.get(field)
    ]


def index_problems(m: Manifest, indexed: Manifest, where: str) -> list[str]:
    """Every way the index at ``where`` (read as the reader reads it) differs from the manifest ``m``:
    top fields, shards missing, extra or in another order, then each shard's columns."""
    problems = _top(m, indexed, where)
    names = [s.name for s in m.shards]
    listed = [s.name for s in indexed.shards]
    known, theirs = set(names), {s.name: s for s in indexed.shards}
    missing = [n for n in names if n not in theirs]
    extra = [n for n in listed if n not in known]
    if missing:
        problems.append(f"{where}: lists {len(listed)} shards; the manifest's {', '.join(missing[:5])} missing")
    if extra:
        problems.append(f"{where}: lists shards the manifest does not: {', '.join(extra[:5])}")
    if not missing and not extra and listed != names:
        problems.append(f"{where}: lists the manifest's shards in another order")
    for info in m.shards:
        if info.name in theirs and len(problems) <= MAX_PROBLEMS:
            problems += _shard(info.to_json(), theirs[info.name].to_json(), where)
    if len(problems) > MAX_PROBLEMS:
        problems = [*problems[:MAX_PROBLEMS], f"{where}: and more differences (first {MAX_PROBLEMS} listed)"]
    return problems
