"""An index of image files in place (``shardmaker index DIR --lr DIR | --hr-only``): the manifest's
``files`` object (format version, the folder each side's files are under, the digest kept) and, per
group of samples, each member's file columns (path under its root, byte size, xxh3_64).

A file index is a ``wdsr-shards/1`` manifest whose shard entries are *groups* of samples read from
files, not tar shards: a group's ``offsets`` are where its samples would start if their files were
laid end to end in 512-byte blocks (what ``bytes`` sums), its ``sha256`` is that of its listing.
Readers that know no ``files`` refuse the manifest by its ``files`` field, never misread it."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from shardmaker.format.schema import BLOCK, XXH3, ManifestError, int_field, key_problem, list_field, str_field

# 3: a side may mix formats (member hr.img: each file of the format its path's extension names);
# 2: digest "stamp"; 1: "xxh3_64" or "none" (both still read)
FILES_VERSION = 3
FILES_VERSIONS = (1, 2, 3)
# xxh3_64: each file's digest; stamp (--no-digest): the xxh3_64 column holds that of each file's stamp, its
# mtime_ns (local) or ETag (remote) as indexed (stamp_digest); none (version 1): sizes alone
DIGESTS = ("xxh3_64", "stamp", "none")
MAX_FILE_BYTES = 1 << 40


CHANGED = "(changed since it was indexed)"
MISSING = "missing (removed since it was indexed)"


@dataclasses.dataclass(frozen=True)
class FileRoots:
    """Where an index's files are: the HR root and one root per LR scale (URLs or absolute paths), and
    what was recorded of each file besides its size (``digest``: its xxh3_64, its stamp, or nothing)."""

    hr: str
    lr: dict[int, str]
    digest: str = "xxh3_64"
    version: int = FILES_VERSION

    def __post_init__(self) -> None:
        if self.digest not in DIGESTS:
            raise ValueError(f"digest must be one of {', '.join(DIGESTS)}, got {self.digest!r}")
        for root in (self.hr, *self.lr.values()):
            if not isinstance(root, str) or not root:
                raise ValueError("a file root must be a non-empty URL or path")

    @property
    def digested(self) -> bool:
        return self.digest == "xxh3_64"

    @property
    def stamped(self) -> bool:
        """The xxh3_64 column holds each file's :func:`stamp_digest` (``--no-digest``)."""
        return self.digest == "stamp"

    def mismatch(self, want: tuple[int, int], size: int, xxh3: int | None = None, stamp: str | None = None) -> str | None:
        """Why a file read is not the one indexed (None: it is): ``want`` its ``(bytes, xxh3_64 column)``;
        its ``size``, then its ``xxh3`` (a digested index), then its ``stamp`` (mtime_ns or ETag, ``--no-digest``)."""
        if size != want[0]:
            return f"{size} bytes, the index says {want[0]} {CHANGED}"
        if self.digested and xxh3 is not None and xxh3 != want[1]:
            return f"its xxh3_64 differs from the index's {CHANGED}"
        if self.stamped and stamp is not None and stamp_digest(stamp) != want[1]:
            return f"its ETag/mtime differs from the index's {CHANGED}"
        return None

    @property
    def checked_by(self) -> str:
        """What a file is checked by, in words."""
        return {"xxh3_64": "size and xxh3_64", "stamp": "size and ETag/mtime (--no-digest)"}.get(self.digest, "size alone")

    def root(self, side: int | None) -> str:
        """The HR root (``side`` None) or the x``side`` LR root."""
        return self.hr if side is None else self.lr[side]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "hr": self.hr,
            "lr": {str(s): self.lr[s] for s in sorted(self.lr)},
            "digest": self.digest,
        }

    @classmethod
    def from_json(cls, d: Any, where: str) -> FileRoots:
        if type(d) is not dict or {"version", "hr", "lr", "digest"} - set(d):
            raise ManifestError(where, "files", 'must be {"version", "hr", "lr", "digest"}')
        version = int_field(d["version"], where, "files.version", 1, 1 << 30)
        if version not in FILES_VERSIONS:
            raise ManifestError(where, "files.version", f"file index version {version}; this reader knows {FILES_VERSIONS}")
        if type(d["lr"]) is not dict:
            raise ManifestError(where, "files.lr", "must be an object: scale -> root")
        lr: dict[int, str] = {}
        for s, root in d["lr"].items():
            if not (isinstance(s, str) and s.isdigit() and 2 <= int(s) <= 16):
                raise ManifestError(where, "files.lr", f"scale {s!r} must be a whole number 2..16")
            lr[int(s)] = str_field(root, where, f"files.lr.{s}")
        try:
            return cls(str_field(d["hr"], where, "files.hr"), lr, str_field(d["digest"], where, "files.digest"), version)
        except ValueError as exc:
            raise ManifestError(where, "files", str(exc)) from None


@dataclasses.dataclass(frozen=True)
class FileColumns:
    """One member of every sample of a group: its file (a path under the member's root), the file's
    size in bytes and its xxh3_64 (0 where the index keeps no digest)."""

    paths: Sequence[str]
    bytes: np.ndarray
    xxh3_64: np.ndarray  # uint64

    def to_json(self) -> dict[str, Any]:
        return {
            "paths": list(self.paths),
            "bytes": [int(n) for n in self.bytes],
            "xxh3_64": [f"{int(d):016x}" for d in self.xxh3_64],
        }

    @classmethod
    def from_json(cls, d: Any, where: str, field: str, samples: int) -> FileColumns:
        if type(d) is not dict or set(d) != {"paths", "bytes", "xxh3_64"}:
            raise ManifestError(where, field, 'must be {"paths": [...], "bytes": [...], "xxh3_64": [...]}')
        paths = list_field(d["paths"], where, f"{field}.paths", samples)
        sizes = list_field(d["bytes"], where, f"{field}.bytes", samples)
        digests = list_field(d["xxh3_64"], where, f"{field}.xxh3_64", samples)
        for i in range(samples):
            why = path_problem(paths[i])
            if why is not None:
                raise ManifestError(where, f"{field}.paths[{i}]", f"a file path {why}")
            int_field(sizes[i], where, f"{field}.bytes[{i}]", 1, MAX_FILE_BYTES)
            if not isinstance(digests[i], str) or not XXH3.fullmatch(digests[i]):
                raise ManifestError(where, f"{field}.xxh3_64[{i}]", "must be 16 lowercase hex digits")
        return cls(list(paths), np.asarray(sizes, dtype=np.int64), np.array([int(x, 16) for x in digests], dtype=np.uint64))


def stamp_digest(tag: str) -> int:
    """What the index keeps of a file's stamp (``--no-digest``): the xxh3_64 of its mtime_ns (local,
    in decimal) or of its ETag (remote, without quotes)."""
    return xxhash.xxh3_64_intdigest(tag.strip('"').encode())


def path_problem(path: Any) -> str | None:
    """Why ``path`` cannot name a file under a root (None: it can): relative, ``/``-separated, no
    ``.``/``..`` segment, no backslash or control character: it never leaves its root."""
    return key_problem(path, dots=True)


def group_layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """A group's ``offsets`` and ``bytes``: each sample's files (``sizes``, their sum per sample) laid end
    to end in whole 512-byte blocks (at least 1024 bytes in all, as a shard has)."""
    offsets, at = [], 0
    for n in sizes:
        offsets.append(at)
        at += max(BLOCK, -(-int(n) // BLOCK) * BLOCK)
    return offsets, max(at, 2 * BLOCK)


def group_digest(keys: Sequence[str], files: dict[str, FileColumns]) -> str:
    """A group's ``sha256``: of its keys and every member's paths, sizes and digests."""
    h = hashlib.sha256(b"wdsr-files/1\0")
    for i, k in enumerate(keys):
        h.update(k.encode() + b"\0")
        for name in sorted(files):
            c = files[name]
            h.update(f"{name}\0{c.paths[i]}\0{int(c.bytes[i])}\0{int(c.xxh3_64[i]):016x}\0".encode())
    return h.hexdigest()
