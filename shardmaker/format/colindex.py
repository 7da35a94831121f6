"""The column index beside a manifest (``manifest.json.idx``): every per-sample column in one binary
file that readers memory-map, so a dataset of 10M samples opens in a fraction of a second and its
columns are page cache shared by every process on the node, not private memory of each.

Layout, little-endian: ``WDSRCOLS``, version (u32), header length (u32), the header (JSON), then
the columns, each at a 64-byte aligned offset. The header names the manifest the index was made
from (its size, the probe of its first and last MiB, its sha256), holds the manifest's top-level
fields and lists each column's dtype, shape and offset (from the columns' start). The reader
(:mod:`.colread`) trusts none
of it: every extent, count and value is checked before use."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import fsspec
import numpy as np

from shardmaker import storage
from shardmaker.format.manifest import Manifest, ShardInfo
from shardmaker.format.schema import PROBE_BYTES, probe_of

MAGIC = b"WDSRCOLS"
VERSION = 1
SUFFIX = ".idx"  # manifest.json -> manifest.json.idx; an index's other name (-o x.json) -> x.json.idx
ALIGN = 64
PREFIX = len(MAGIC) + 8  # magic, version, header length
MAX_HEADER = 64 << 20  # the header holds build (skips, dropped lists): bounded, never per-sample data


def index_path(manifest_path: str) -> str:
    """Where the column index of the manifest at ``manifest_path`` is."""
    return manifest_path + SUFFIX


def identity_of(data: bytes) -> dict[str, Any]:
    """What names a manifest file in its index: its size, the probe of its first and last MiB
    (what a reader checks, for ~1 ms whatever the manifest's size) and its sha256 (its digest)."""
    return {
        "bytes": len(data),
        "probe": probe_of(data[:PROBE_BYTES], data[max(0, len(data) - PROBE_BYTES) :]),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def write_manifest(fs: fsspec.AbstractFileSystem, path: str, manifest: Manifest, index: bool = True) -> bytes:
    """Write ``manifest`` to ``path`` and (``index``) its column index beside it: the index first, the
    manifest (the commit marker) last, both atomically. A crash between the two leaves an index that
    names another manifest, which readers ignore. Returns the manifest's bytes."""
    data = manifest.dumps()
    if index:
        storage.write_atomic(fs, index_path(path), encode(manifest, data))
    storage.write_atomic(fs, path, data)
    return data


def _blob(items: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Variable-length byte strings as one bytes column and ``len + 1`` boundaries."""
    at = np.zeros(len(items) + 1, dtype="<u8")
    np.cumsum([len(x) for x in items], out=at[1:])
    return np.frombuffer(b"".join(items), dtype=np.uint8), at


def _narrow(a: np.ndarray, limit: int = 1 << 32) -> np.ndarray:
    return a.astype("<u4" if a.size == 0 or int(a.max()) < limit else "<u8")


def _digests(values: Sequence[str | None], rows: int) -> np.ndarray:
    return np.frombuffer(b"".join(bytes.fromhex(v or "00" * 32) for v in values), dtype=np.uint8).reshape(rows, 32)


def columns_of(m: Manifest) -> dict[str, np.ndarray]:
    """Every per-shard and per-sample column of ``m``, dataset-wide (shard ``i`` is rows
    ``starts[i]:starts[i + 1]``)."""
    shards = list(m.shards)
    counts = np.array([s.samples for s in shards], dtype=np.int64)
    cols: dict[str, np.ndarray] = {"starts": np.concatenate([[0], np.cumsum(counts)]).astype("<u8")}
    cols["shard_bytes"] = np.array([s.bytes for s in shards], dtype="<u8")
    cols["names"], cols["name_at"] = _blob([s.name.encode() for s in shards])
    cols["sha256"] = _digests([s.sha256 for s in shards], len(shards))
    cols["probe"] = _digests([s.probe for s in shards], len(shards))
    cols["flags"] = np.array([(s.probe is not None) | (s.tiles is not None) << 1 for s in shards], dtype=np.uint8)
    keys = [[k.encode() for k in s.keys] for s in shards]  # per shard: never a 10M-item list
    cols["keys"] = np.frombuffer(b"".join(b"".join(k) for k in keys), dtype=np.uint8)
    key_at = np.zeros(int(counts.sum()) + 1, dtype=np.int64)
    np.cumsum(np.fromiter((len(x) for k in keys for x in k), dtype=np.int64, count=len(key_at) - 1), out=key_at[1:])
    cols["key_at"] = _narrow(key_at)
    cols["offsets"] = _narrow(np.concatenate([np.asarray(s.offsets, dtype=np.int64) for s in shards]))
    hr = np.concatenate([np.asarray(s.hr_sizes, dtype=np.int64).reshape(-1, 2) for s in shards])
    cols["hr_sizes"] = hr.astype("<u2" if int(hr.max()) < 1 << 16 else "<u4")
    if any(s.tiles is not None for s in shards):
        cols["tiles"] = np.concatenate(
            [np.zeros(s.samples, np.int64) if s.tiles is None else np.asarray(s.tiles, np.int64) for s in shards]
        ).astype("<u2")
    if m.files is not None:
        return cols | _file_columns(m, shards)
    for j, name in enumerate(m.members.names() if m.members is not None else []):
        got = [s.members[name] for s in shards if s.members is not None]
        cols[f"m{j}.offsets"] = _narrow(np.concatenate([c.offsets.astype(np.int64) for c in got]))
        cols[f"m{j}.bytes"] = _narrow(np.concatenate([c.bytes.astype(np.int64) for c in got]))
        cols[f"m{j}.xxh3_64"] = np.concatenate([c.xxh3_64 for c in got]).astype("<u8")
    return cols


def _file_columns(m: Manifest, shards: list[ShardInfo]) -> dict[str, np.ndarray]:
    """An index of image files: each member's paths (bytes and boundaries), sizes and digests, ``f{j}.*``."""
    assert m.members is not None
    cols: dict[str, np.ndarray] = {}
    for j, name in enumerate(m.members.names()):
        got = [s.files[name] for s in shards if s.files is not None]
        cols[f"f{j}.paths"], cols[f"f{j}.path_at"] = _blob([p.encode() for c in got for p in c.paths])
        cols[f"f{j}.bytes"] = np.concatenate([c.bytes.astype(np.int64) for c in got]).astype("<u8")
        cols[f"f{j}.xxh3_64"] = np.concatenate([c.xxh3_64 for c in got]).astype("<u8")
    return cols


def encode(m: Manifest, data: bytes) -> bytes:
    """The column index of ``m``, whose file holds ``data``."""
    return encode_columns(columns_of(m), m.top_json(), m.members.names() if m.members is not None else [], data)


def encode_columns(cols: dict[str, np.ndarray], top: dict[str, Any], member_names: list[str], data: bytes) -> bytes:
    """An index file of these columns and top-level fields, naming the manifest file ``data``.
    Column offsets count from the first 64-byte boundary after the header."""
    spec: dict[str, dict[str, Any]] = {}
    at = 0
    for name, c in cols.items():
        spec[name] = {"dtype": c.dtype.str, "shape": list(c.shape), "offset": at}
        at = -(-(at + c.nbytes) // ALIGN) * ALIGN
    header = {"version": VERSION, "manifest": identity_of(data), "top": top, "member_names": member_names, "columns": spec}
    raw = json.dumps(header, separators=(",", ":")).encode()
    base = data_start(len(raw))
    out = bytearray(base + at)
    out[:PREFIX] = MAGIC + VERSION.to_bytes(4, "little") + len(raw).to_bytes(4, "little")
    out[PREFIX : PREFIX + len(raw)] = raw
    for name, c in cols.items():
        o = base + int(spec[name]["offset"])
        out[o : o + c.nbytes] = np.ascontiguousarray(c).tobytes()
    return bytes(out)


def data_start(header_len: int) -> int:
    """Where the columns begin: the first 64-byte boundary after the header."""
    return -(-(PREFIX + header_len) // ALIGN) * ALIGN


__all__ = [
    "ALIGN",
    "MAGIC",
    "MAX_HEADER",
    "PREFIX",
    "SUFFIX",
    "VERSION",
    "columns_of",
    "data_start",
    "encode",
    "encode_columns",
    "identity_of",
    "index_path",
    "write_manifest",
]
