"""A node-wide cache of decoded pairs: decode once per node, map everywhere.

``SRDataset(..., decoded_cache="/dev/shm/wdsr", decoded_cache_limit=bytes)``: the first process on
a node that decodes a sample writes its HR (cropped to ``scale`` x LR) and LR arrays to one file
there; every DataLoader worker of every rank on the node then maps that file read-only and cuts
patches from it without reading the shard or decoding. On tmpfs (``/dev/shm``) the mapped pages
are the file's own, so the node holds one copy of each pair, whatever the number of processes.

* Files are named by the dataset's identity (the sha256 of its manifest), the sample key and the
  scale, so two datasets, or a rebuilt one, never share an entry.
* A file appears under its name complete or not at all: it is written to a temp name and then
  hard-linked into place (``link`` fails if another process got there first: one file, whoever
  wins). A writer killed mid-write leaves only a temp name, which no reader opens; ``wdsr cache
  clear`` removes those too. A reader also checks the magic, the header and the length.
* ``decoded_cache_limit``: the samples that are cached are a fixed subset, the same in every
  process and epoch: keys in the order of their hash, taken while their decoded sizes (from the
  manifest's HR sizes) fit the limit. The others are decoded as without a cache.
* A full filesystem (ENOSPC) or any other write error: one warning, the process stops writing and
  goes on decoding; nothing crashes.
* Each process keeps the pairs it mapped mapped (up to ``MAX_MAPPED`` pairs / ``MAX_MAPPED_BYTES``,
  least recently used dropped): mapping a 25 MB pair afresh costs ~10 ms of page faults, a kept
  mapping none. Kept pages are still the file's (they count in each process's RSS and, while only
  one process maps them, as its "private clean" memory, but they are the one copy on tmpfs; Pss
  summed over the processes is that copy once).
* Batches are byte-identical with and without the cache: patches are cut from the same pixels.
  The file holds them planar (C x H x W), so a patch is cut with plain copies, where a decoded
  H x W x C image needs a transposing copy. Only the pages a crop touches are mapped in (mapping a
  whole pair up front, ``MAP_POPULATE``, cost more per sample than that at k=16: 2.1k vs 7.6k patches/s).

File layout: ``b"WDSRPAIR"``, a little-endian uint32 header length, a JSON header (``hr``/``lr``
shape and dtype, key, scale), zero padding to 4096 bytes, the HR bytes, the LR bytes (C order).
Nothing in it is ever unpickled.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import hashlib
import json
import logging
import mmap
import os
import re
import shutil
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from shardmaker.format import ShardInfo

log = logging.getLogger("wdsr")
SUBDIR = "wdsr-decoded-cache"
MAGIC = b"WDSRPAIR"
_ALIGN = 4096
MAX_MAPPED = 4096  # pairs kept mapped per process (well under vm.max_map_count, 65530 by default)
MAX_MAPPED_BYTES = 16 << 30  # and bytes: the page tables cost ~2 MB per GB kept mapped
_DTYPES = {"uint8": np.uint8, "uint16": np.uint16}
_FILE = re.compile(r"[0-9a-f]{32}-x[0-9]{1,2}\.pair")
_TEMP = re.compile(r"[0-9a-f]{32}-x[0-9]{1,2}\.pair\.tmp\.[0-9]+\.[0-9a-f]+")
_DATASET = re.compile(r"[0-9a-f]{64}")


def _name(key: str, scale: int) -> str:
    return f"{hashlib.sha256(key.encode()).hexdigest()[:32]}-x{scale}.pair"


def pair_bytes(hr_size: Any, scale: int, bytes_per_pixel: int) -> Any:
    """Decoded bytes of a pair from its HR ``(w, h)``: HR cropped to ``scale`` x LR, and LR (also
    for ``(w, h)`` columns of numpy arrays)."""
    lw, lh = np.asarray(hr_size[0], dtype=np.int64) // scale, np.asarray(hr_size[1], dtype=np.int64) // scale
    n = (scale * scale + 1) * lw * lh * bytes_per_pixel  # int64: 16-bit manifest columns would overflow
    return int(n) if n.ndim == 0 else n


@dataclasses.dataclass
class DecodedCache:
    """One dataset's entries in the node's cache folder ``root`` (picklable: opens nothing until used)."""

    root: str
    identity: str  # the dataset's manifest sha256
    scale: int
    limit: int | None  # bytes; None: every sample
    shards: Sequence[ShardInfo]  # the dataset's keys and HR sizes, to choose the cached subset
    _admitted: frozenset[str] | None = None
    _bpp: int | None = None
    _disabled: bool = False
    # pairs this process has mapped, most recently used last: a mapping kept keeps its page tables,
    # so a later epoch's crops fault nothing in (mapping a 25 MB pair afresh costs ~10 ms of faults)
    _mapped: collections.OrderedDict[str, tuple[np.ndarray, np.ndarray]] = dataclasses.field(
        default_factory=collections.OrderedDict, repr=False
    )
    _mapped_bytes: int = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_mapped"], state["_mapped_bytes"] = collections.OrderedDict(), 0  # mappings stay in their process
        return state

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit <= 0:
            raise ValueError(f"decoded_cache_limit must be a positive number of bytes, got {self.limit}")
        if not _DATASET.fullmatch(self.identity):
            raise ValueError(f"not a dataset identity: {self.identity!r}")

    @property
    def folder(self) -> Path:
        return Path(self.root) / SUBDIR / self.identity

    def path(self, key: str) -> Path:
        return self.folder / _name(key, self.scale)

    def has(self, key: str) -> bool:  # once per sample: a plain stat, without pathlib's objects
        return os.path.exists(os.path.join(self.root, SUBDIR, self.identity, _name(key, self.scale)))

    def lookup(self, key: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The cached (HR, LR) of ``key`` as arrays over a shared mapping (never written), or None.
        Up to ``MAX_MAPPED`` pairs (``MAX_MAPPED_BYTES``) stay mapped in this process, least
        recently used dropped first."""
        kept = self._mapped.get(key)
        if kept is not None:
            self._mapped.move_to_end(key)
            return kept
        got = self._map(key)
        if got is not None:
            self._mapped[key] = got
            self._mapped_bytes += got[0].nbytes + got[1].nbytes
            while len(self._mapped) > MAX_MAPPED or self._mapped_bytes > MAX_MAPPED_BYTES:
                _, (hr, lr) = self._mapped.popitem(last=False)
                self._mapped_bytes -= hr.nbytes + lr.nbytes
        return got

    def forget(self, key: str) -> None:
        """Drop this process's mapping of ``key`` (its file is gone: ``wdsr cache clear``)."""
        gone = self._mapped.pop(key, None)
        if gone is not None:
            self._mapped_bytes -= gone[0].nbytes + gone[1].nbytes

    def _map(self, key: str) -> tuple[np.ndarray, np.ndarray] | None:
        try:
            with open(self.path(key), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < _ALIGN:
                    return None
                # a private mapping: the pages are the file's own (shared with every process that maps
                # it) as long as nobody writes, which nothing does; torch takes such arrays without a warning
                mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except (FileNotFoundError, ValueError, OSError):
            return None
        try:
            if mm[:8] != MAGIC:
                return None
            (n,) = struct.unpack("<I", mm[8:12])
            head = json.loads(mm[12 : 12 + n]) if 12 + n <= _ALIGN else None
            if not isinstance(head, dict) or (head.get("key"), head.get("scale"), head.get("layout")) != (key, self.scale, "chw"):
                return None
            arrays = []
            at = _ALIGN
            for part in ("hr", "lr"):
                shape, dtype = tuple(head[part]["shape"]), _DTYPES[head[part]["dtype"]]
                if len(shape) != 3 or not all(type(v) is int and v > 0 for v in shape):
                    return None
                nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
                if at + nbytes > size:
                    return None
                arrays.append(np.frombuffer(mm, dtype=dtype, count=int(np.prod(shape)), offset=at).reshape(shape))
                at += nbytes
            if at != size:
                return None
            return arrays[0], arrays[1]
        except (ValueError, KeyError, TypeError, struct.error):
            return None

    # ---- which samples are cached -------------------------------------------------------------
    def admits(self, key: str, bytes_per_pixel: int) -> bool:
        if self.limit is None:
            return True
        if self._admitted is None or self._bpp != bytes_per_pixel:
            self._bpp = bytes_per_pixel
            self._admitted = self._subset(bytes_per_pixel)
        return key in self._admitted

    def _subset(self, bpp: int) -> frozenset[str]:
        """Keys in the order of their xxh3_64, while their decoded sizes fit the limit: the same
        subset in every process and epoch, so the cached set never churns."""
        assert self.limit is not None
        keys = [k for sh in self.shards for k in sh.keys]
        hashes = np.fromiter((xxhash.xxh3_64_intdigest(k.encode()) for k in keys), dtype=np.uint64, count=len(keys))
        sizes = np.concatenate([np.asarray(sh.hr_sizes, dtype=np.int64).reshape(-1, 2) for sh in self.shards])
        order = np.argsort(hashes, kind="stable")
        cost = (pair_bytes((sizes[:, 0], sizes[:, 1]), self.scale, bpp) + _ALIGN)[order]
        n = int(np.searchsorted(np.cumsum(cost), self.limit, side="right"))
        return frozenset(keys[i] for i in order[:n])

    # ---- writing ------------------------------------------------------------------------------
    def store(self, key: str, hr: np.ndarray, lr: np.ndarray) -> bool:
        """Write the pair if it is in the cached subset and not there yet; False when not written."""
        if self._disabled or hr.dtype.name not in _DTYPES:
            return False
        bpp = hr.dtype.itemsize * (1 if hr.ndim == 2 else hr.shape[2])
        if not self.admits(key, bpp):
            return False
        final = self.path(key)
        if final.exists():
            return False
        hr, lr = _planar(hr), _planar(lr)  # C x H x W: a patch is then plain copies, no transposing one
        head = json.dumps(
            {
                "key": key,
                "scale": self.scale,
                "layout": "chw",
                "hr": {"shape": list(hr.shape), "dtype": hr.dtype.name},
                "lr": {"shape": list(lr.shape), "dtype": lr.dtype.name},
            }
        ).encode()
        if 12 + len(head) > _ALIGN:
            return False  # a key too long for the header: decoded as without a cache
        temp = final.with_name(f"{final.name}.tmp.{os.getpid()}.{os.urandom(4).hex()}")
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            with open(temp, "wb") as f:
                f.write(MAGIC + struct.pack("<I", len(head)) + head + bytes(_ALIGN - 12 - len(head)))
                f.write(hr.data)
                f.write(lr.data)
            try:
                os.link(temp, final)  # complete, under its name, or not at all; never replaces
            except FileExistsError:
                return False
            return True
        except OSError as exc:
            self._disabled = True
            why = "the filesystem is full (ENOSPC)" if exc.errno == errno.ENOSPC else str(exc)
            log.warning(
                "decoded cache %s: %s; this process stops writing to it and decodes as without a cache",
                self.root,
                why,
            )
            return False
        finally:
            try:
                temp.unlink()
            except OSError:
                pass


def _planar(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a[None] if a.ndim == 2 else a.transpose(2, 0, 1))


# ---- wdsr cache info | clear -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CacheUsage:
    dataset: str
    pairs: int
    bytes: int
    temps: int  # unfinished writes (a killed writer): never read, removed by clear
    newest: float


def usage(root: str | os.PathLike) -> list[CacheUsage]:
    """Each dataset's entries in the decoded cache under ``root``."""
    base = Path(root) / SUBDIR
    out: list[CacheUsage] = []
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        if not (d.is_dir() and _DATASET.fullmatch(d.name)):
            continue
        pairs = temps = total = 0
        newest = 0.0
        for f in d.iterdir():
            try:
                st = f.stat()
            except FileNotFoundError:
                continue
            if _FILE.fullmatch(f.name):
                pairs, total, newest = pairs + 1, total + st.st_size, max(newest, st.st_mtime)
            elif _TEMP.fullmatch(f.name):
                temps += 1
        out.append(CacheUsage(d.name, pairs, total, temps, newest))
    return out


def clear(root: str | os.PathLike, dataset: str | None = None) -> int:
    """Remove the decoded cache under ``root`` (one dataset's entries with ``dataset``, an identity
    or its prefix); only names this module makes are touched. Returns the files removed. A file
    that a process has mapped stays readable to it until it unmaps it (POSIX unlink)."""
    base = Path(root) / SUBDIR
    removed = 0
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if not (d.is_dir() and _DATASET.fullmatch(d.name)) or (dataset and not d.name.startswith(dataset)):
            continue
        for f in d.iterdir():
            if _FILE.fullmatch(f.name) or _TEMP.fullmatch(f.name):
                try:
                    f.unlink()
                    removed += 1
                except FileNotFoundError:
                    pass
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        base.rmdir()
    except OSError:
        pass
    return removed


def describe(root: str | os.PathLike) -> str:
    rows = usage(root)
    if not rows:
        return f"{root}: no decoded cache"
    lines = [f"{root}/{SUBDIR}:", f"{'dataset':<16}  {'pairs':>7}  {'GB':>8}  {'unfinished':>10}  last write"]
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.newest)) if r.newest else "-"
        lines.append(f"{r.dataset[:16]:<16}  {r.pairs:>7}  {r.bytes / 1e9:>8.3f}  {r.temps:>10}  {when}")
    free = shutil.disk_usage(root)
    lines.append(f"total {sum(r.bytes for r in rows) / 1e9:.3f} GB; {free.free / 1e9:.1f} GB free on {root}")
    return "\n".join(lines)
