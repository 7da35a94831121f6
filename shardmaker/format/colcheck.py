"""The column index's values checked as a whole before any entry is made (:mod:`.colread`): what
the JSON reader checks field by field (:meth:`ShardInfo.from_json`), as vectorised passes over
groups of whole shards of about a million samples, so the temporary memory stays at tens of MB."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from shardmaker.format.files import MAX_FILE_BYTES
from shardmaker.format.schema import BLOCK, MAX_SAMPLES, MAX_SHARD_BYTES, MAX_SIDE, ManifestError, check_shard_name
from shardmaker.format.tiles import MAX_TILE, MIN_TILE

CHUNK = 1 << 20  # samples per pass (a group is whole shards: at most max(CHUNK, the largest shard))
MAX_KEY_BYTES = 32 * 256 * 4  # 32 segments of 255 characters of up to 4 UTF-8 bytes, and the '/'s


def _fail(c: dict[str, np.ndarray], where: str, pos: int, field: str, reason: str, per_sample: bool = True) -> None:
    """A ManifestError naming the shard (and the sample's place in it) of row ``pos``."""
    starts = c["starts"]
    s = int(np.searchsorted(starts, pos, side="right")) - 1 if per_sample else pos
    at = c["name_at"]
    name = c["names"][int(at[s]) : int(at[s + 1])].tobytes().decode(errors="replace")
    place = f"[{pos - int(starts[s])}]" if per_sample else ""
    raise ManifestError(where, f"shards[{s}] ({name}).{field}{place}", reason)


def _first_bad(c: dict[str, np.ndarray], where: str, bad: Any, a: int, field: str, reason: str) -> None:
    if bool(bad.any()):
        _fail(c, where, a + int(np.flatnonzero(bad)[0]), field, reason)


def check_shards(c: dict[str, np.ndarray], where: str, indexed: bool) -> None:
    """Per-shard columns: sample counts, sizes, names (one file name each, unique), flags."""
    samples = np.diff(c["starts"].astype(np.int64))
    if int(samples.max()) > MAX_SAMPLES:
        raise ManifestError(where, f"shards[{int(samples.argmax())}].samples", f"must be at most {MAX_SAMPLES}")
    size = c["shard_bytes"]
    bad = (size < 1024) | (size > MAX_SHARD_BYTES)
    if bool(bad.any()):
        raise ManifestError(where, f"shards[{int(np.flatnonzero(bad)[0])}].bytes", f"must be in [1024, {MAX_SHARD_BYTES}]")
    at = c["name_at"].astype(np.int64)
    step = np.diff(at)
    if at[0] != 0 or at[-1] != len(c["names"]) or bool(np.any((step < 1) | (step > 255))):
        raise ManifestError(where, "columns.name_at", "shard names must be 1-255 bytes, one after another")
    allowed = 1 | (2 if "tiles" in c and not indexed else 0)  # bit 0: a probe; bit 1: a tiles column
    bad = (c["flags"] & ~np.uint8(allowed)) != 0
    if bool(bad.any()):
        _fail(c, where, int(np.flatnonzero(bad)[0]), "flags", "says tiles or fields the index does not have", False)
    _check_names(c, where, at)


_NAME_BYTES = np.zeros(256, dtype=bool)
_NAME_BYTES[np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-", np.uint8)] = True
_FIRST_BYTES = _NAME_BYTES.copy()
_FIRST_BYTES[np.frombuffer(b"_.-", np.uint8)] = False


def _check_names(c: dict[str, np.ndarray], where: str, at: np.ndarray) -> None:
    """Every shard name one file name (:data:`SHARD_NAME`, no ``..``), each listed once: byte-class
    checks over all names at once, the pattern itself only to name a bad one."""
    blob = c["names"]
    ends = at[1:]
    ok = bool(_NAME_BYTES[blob].all()) and bool(_FIRST_BYTES[blob[at[:-1]]].all()) and bool(np.all(ends - at[:-1] >= 5))
    if ok:
        tails = blob[(ends[:, None] - np.arange(4, 0, -1)).ravel()].reshape(-1, 4)
        ok = bool((tails == np.frombuffer(b".tar", np.uint8)).all()) and not bool(((blob[1:] == 46) & (blob[:-1] == 46)).any())
    names = blob.tobytes().decode("latin-1")  # ASCII when ok; else only to find the bad name
    listed = [names[int(x) : int(y)] for x, y in zip(at[:-1], ends, strict=True)]
    if not ok:
        for i, name in enumerate(listed):
            check_shard_name(name, where, f"shards[{i}].name")
    if len(set(listed)) != len(listed):
        seen: set[str] = set()
        twice = next(x for x in listed if x in seen or seen.add(x))  # type: ignore[func-returns-value]
        raise ManifestError(where, "shards", f"shard {twice} is listed twice")


def _pairs_rise(c: dict[str, np.ndarray], where: str, col: np.ndarray, starts: np.ndarray, field: str) -> None:
    """``col`` increases within every shard (a shard's first row need not exceed the one before)."""
    n = len(col)
    gaps = starts[1:-1] - 1  # rows whose successor starts another shard
    for a in range(0, max(n - 1, 0), CHUNK):
        b = min(a + CHUNK, n - 1)
        up = col[a + 1 : b + 1] > col[a:b]
        up[gaps[np.searchsorted(gaps, a) : np.searchsorted(gaps, b)] - a] = True
        if not bool(up.all()):
            _fail(c, where, a + 1 + int(np.flatnonzero(~up)[0]), field, "must increase within the shard")


def check_samples(c: dict[str, np.ndarray], where: str, members: list[str]) -> None:
    """Per-sample columns: offsets (tar blocks, increasing, inside the shard, from 0 in our shards),
    HR sizes, tile sides, key lengths, and each foreign member inside its shard. Whole-column
    reductions first; a mask (one byte a sample) only to name the first bad row."""
    starts = c["starts"].astype(np.int64)
    first, last = starts[:-1], starts[1:] - 1
    o = c["offsets"]
    if int(np.bitwise_or.reduce(o)) % BLOCK:
        _first_bad(c, where, o % BLOCK != 0, 0, "offsets", "must be multiples of 512 (tar blocks)")
    _pairs_rise(c, where, o, starts, "offsets")
    if not members and bool(np.any(o[first] != 0)):
        _fail(c, where, int(first[np.flatnonzero(o[first] != 0)[0]]), "offsets", "must start at 0")
    beyond = o[last] >= c["shard_bytes"]
    if bool(beyond.any()):
        _fail(c, where, int(last[np.flatnonzero(beyond)[0]]), "offsets", "must lie inside the shard")
    hr = c["hr_sizes"]
    if int(hr.min()) < 1 or int(hr.max()) > MAX_SIDE:
        _first_bad(c, where, ((hr < 1) | (hr > MAX_SIDE)).any(axis=1), 0, "hr_sizes", f"sides must be in [1, {MAX_SIDE}]")
    if "tiles" in c:
        t = c["tiles"]
        _first_bad(c, where, (t != 0) & ((t < MIN_TILE) | (t > MAX_TILE)), 0, "tiles", "must be 0 or a tile side")
    at = c["key_at"]
    if int(at[0]) != 0 or int(at[-1]) != len(c["keys"]):
        raise ManifestError(where, "columns.key_at", "key boundaries must run from 0 to the end of the keys")
    for a in range(0, len(at) - 1, CHUNK):
        step = np.diff(at[a : a + CHUNK + 1])  # unsigned: a boundary that goes back wraps to a huge step
        if int(step.min()) < 1 or int(step.max()) > MAX_KEY_BYTES:
            _first_bad(c, where, (step < 1) | (step > MAX_KEY_BYTES), a, "keys", f"a key must be 1-{MAX_KEY_BYTES} bytes")
    if members:
        _check_members(c, where, members, starts)


def _check_members(c: dict[str, np.ndarray], where: str, members: list[str], starts: np.ndarray) -> None:
    """Each foreign member in whole tar blocks inside its shard; a sample's offset its first member's."""
    for s, e in groups(starts):
        a, b = int(starts[s]), int(starts[e])
        size = np.repeat(c["shard_bytes"][s:e].astype(np.int64), np.diff(starts[s : e + 1]))
        lowest = None
        for j, name in enumerate(members):
            mo, mb = c[f"m{j}.offsets"][a:b].astype(np.int64), c[f"m{j}.bytes"][a:b].astype(np.int64)
            bad = (mo % BLOCK != 0) | (mb % BLOCK != 0) | (mb < BLOCK) | (mo + mb > size)
            _first_bad(c, where, bad, a, f"members.{name}", "a member must lie in whole 512-byte tar blocks inside the shard")
            lowest = mo if lowest is None else np.minimum(lowest, mo)
        if lowest is not None:
            _first_bad(c, where, lowest != c["offsets"][a:b], a, "offsets", "a sample's offset must be that of its first member")


def check_files(c: dict[str, np.ndarray], where: str, members: list[str]) -> None:
    """An index of image files: each member's path boundaries run from 0 to the end of its paths, each
    path 1-MAX_KEY_BYTES bytes (its rules are checked as it is read), each size 1..MAX_FILE_BYTES."""
    for j, name in enumerate(members):
        at = c[f"f{j}.path_at"]
        if int(at[0]) != 0 or int(at[-1]) != len(c[f"f{j}.paths"]):
            raise ManifestError(where, f"columns.f{j}.path_at", "path boundaries must run from 0 to the end of the paths")
        for a in range(0, len(at) - 1, CHUNK):
            step = np.diff(at[a : a + CHUNK + 1])  # unsigned: a boundary that goes back wraps to a huge step
            if int(step.min()) < 1 or int(step.max()) > MAX_KEY_BYTES:
                _first_bad(
                    c,
                    where,
                    (step < 1) | (step > MAX_KEY_BYTES),
                    a,
                    f"files.{name}.paths",
                    f"a path must be 1-{MAX_KEY_BYTES} bytes",
                )
        size = c[f"f{j}.bytes"]
        if len(size) and (int(size.min()) < 1 or int(size.max()) > MAX_FILE_BYTES):
            _first_bad(c, where, (size < 1) | (size > MAX_FILE_BYTES), 0, f"files.{name}.bytes", "must be 1 byte or more")


def groups(starts: np.ndarray) -> Iterator[tuple[int, int]]:
    """Runs of whole shards ``[s, e)`` of about :data:`CHUNK` samples (at least one shard)."""
    s, n = 0, len(starts) - 1
    while s < n:
        e = min(max(int(np.searchsorted(starts, starts[s] + CHUNK, side="right")) - 1, s + 1), n)
        yield s, e
        s = e
