"""A node-wide cache of decoded pairs: decode once per node, map everywhere.

``SRDataset(..., decoded_cache="/dev/shm/wdsr", decoded_cache_limit=bytes)``: the first process on
a node that decodes a sample writes its HR (cropped to ``scale`` x LR) and LR arrays to one file
there; every DataLoader worker of every rank on the node then maps that file read-only and cuts
patches from it without reading the shard or decoding. On tmpfs (``/dev/shm``) the mapped pages
are the file's own, so the node holds one copy of each pair, whatever the number of processes.

* Files are named by the dataset's identity (the sha256 of its manifest), the sample key and the
  scale, so two datasets, or a rebuilt one, never share an entry.
* Nothing found there is trusted. The root, ``SUBDIR`` and each dataset's folder are made 0700 and
  must be this user's, not writable by others and not links (else ``CacheFolderError`` when the
  dataset is made, before any worker starts: a clear error up front rather than a silent run
  without the cache). An entry is opened without following links and must be a regular file (a FIFO
  there never blocks); its header, its shapes against the manifest (LR = HR size // scale, channels
  and bit depth where the manifest records them, else HR and LR alike) and, once per process and
  file, the xxh3_64 of its pixels are checked (~5 ms for a 4K pair, mapped). A refused entry is
  treated as absent: decoded from the shard, counted (``decoded_rejected``) and replaced.
* A file appears under its name complete or not at all: it is written to a temp name and then
  hard-linked into place (``link`` fails if another process got there first: one file, whoever
  wins); a refused entry is replaced by ``rename`` (atomic; it replaces a FIFO or a link itself,
  never what a link points to; a folder at the name is left alone). A writer killed mid-write
  leaves only a temp name, which no reader opens; ``wdsr cache clear`` removes those too.
* ``wdsr cache clear`` between an entry's check and its use (the entry, or the folder being
  written, vanishes): the pair is decoded, and a write remakes the folders (same checks) and
  tries once more, then gives up for that sample only.
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
shape and dtype, key, scale, ``xxh3_64`` of the HR then LR bytes), zero padding to 4096 bytes,
the HR bytes, the LR bytes (C order).
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
import stat
import struct
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from shardmaker import storage
from shardmaker.errors import InputError
from shardmaker.format import ShardInfo

log = logging.getLogger("wdsr")
SUBDIR = "wdsr-decoded-cache"
MAGIC = b"WDSRPAIR"
_ALIGN = 4096
MAX_MAPPED = 4096  # pairs kept mapped per process (well under vm.max_map_count, 65530 by default)
MAX_MAPPED_BYTES = 16 << 30  # and bytes: the page tables cost ~2 MB per GB kept mapped
MAX_VERIFIED = 1 << 20  # entries whose digest this process checked, remembered (past it: forgotten, checked again)
_DTYPES = {"uint8": np.uint8, "uint16": np.uint16}
_DEPTHS = {8: "uint8", 16: "uint16"}
_FILE = re.compile(r"[0-9a-f]{32}-x[0-9]{1,2}\.pair")
_TEMP = re.compile(r"[0-9a-f]{32}-x[0-9]{1,2}\.pair\.tmp\.[0-9]+\.[0-9a-f]+")
_DATASET = re.compile(r"[0-9a-f]{64}")


class CacheFolderError(ValueError):
    """A decoded-cache folder that is not safe to use: a link, another user's, or writable by others."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"decoded cache folder {path}: {reason}")
        self.path, self.reason = path, reason

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.path, self.reason))


def folder_problem(st: os.stat_result, uid: int) -> str | None:
    """Why a folder with this ``lstat`` may not hold decoded pairs for user ``uid`` (None: it may).

    Whoever owns or can write a folder of the cache can change the pixels every later run trains on,
    and a link would send writes (and ``wdsr cache clear``) to wherever it points."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link; give the folder itself (the cache never writes or deletes through a link)"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by this user (uid {uid}); choose a folder of your own"
    if st.st_mode & 0o022:
        return f"can be written by others (mode {stat.S_IMODE(st.st_mode):04o}); `chmod go-w` it or choose another"
    return None


def check_folder(path: str, create: bool = False) -> bool:
    """Is ``path`` a safe cache folder (made 0700 first with ``create``)? False: it does not exist.
    Raises ``CacheFolderError`` naming the folder and what is wrong with it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return False
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # another process made it first: checked below like any other
        st = os.lstat(path)
    why = folder_problem(st, os.geteuid())
    if why is not None:
        raise CacheFolderError(path, why)
    return True


FRAME_SEP = "#"  # a clip frame's entry: ``{segment key}#f{t:04d}`` (keys never hold "#")


def _name(key: str, scale: int) -> str:
    return f"{hashlib.sha256(key.encode()).hexdigest()[:32]}-x{scale}.pair"


def pair_bytes(hr_size: Any, scale: int, bytes_per_pixel: int) -> Any:
    """Decoded bytes of a pair from its HR ``(w, h)``: HR cropped to ``scale`` x LR, and LR (also
    for ``(w, h)`` columns of numpy arrays)."""
    lw, lh = np.asarray(hr_size[0], dtype=np.int64) // scale, np.asarray(hr_size[1], dtype=np.int64) // scale
    n = (scale * scale + 1) * lw * lh * bytes_per_pixel  # int64: 16-bit manifest columns would overflow
    return int(n) if n.ndim == 0 else n


def shape_problem(
    head: dict[str, Any], scale: int, hr_size: tuple[int, int] | None, channels: int | None, bit_depth: int | None
) -> str | None:
    """What is wrong with an entry's header's shapes and dtypes (None: nothing): HR is ``scale`` x LR
    (C x H x W), both of one dtype and channel count, LR is the manifest's HR ``(w, h)`` // ``scale``,
    and the channels and bit depth are the manifest's where it records them."""
    try:
        (c, hh, hw), (lc, lh, lw) = head["hr"]["shape"], head["lr"]["shape"]
        dtypes = head["hr"]["dtype"], head["lr"]["dtype"]
    except (KeyError, TypeError, ValueError):
        return "no HR/LR shapes in its header"
    if not all(type(v) is int and v > 0 for v in (c, hh, hw, lc, lh, lw)) or c not in (1, 3):
        return f"shapes {brief_shape(head)} are not C x H x W with 1 or 3 channels"
    if dtypes[0] not in _DTYPES or dtypes[0] != dtypes[1] or c != lc:
        return f"HR and LR differ in dtype or channels ({brief_shape(head)})"
    if (hh, hw) != (scale * lh, scale * lw):
        return f"HR is not {scale} x LR ({brief_shape(head)})"
    if hr_size is not None and (lw, lh) != (hr_size[0] // scale, hr_size[1] // scale):
        return f"LR {lw}x{lh}, the manifest's HR {hr_size[0]}x{hr_size[1]} gives {hr_size[0] // scale}x{hr_size[1] // scale}"
    if channels is not None and c != channels:
        return f"{c} channel(s), the manifest says {channels}"
    if bit_depth is not None and dtypes[0] != _DEPTHS.get(bit_depth):
        return f"{dtypes[0]}, the manifest says {bit_depth}-bit"
    return None


def brief_shape(head: dict[str, Any]) -> str:
    try:
        return "HR {} {}, LR {} {}".format(*(str(head[p][f])[:40] for p in ("hr", "lr") for f in ("shape", "dtype")))
    except (KeyError, TypeError):
        return "unreadable"


@dataclasses.dataclass
class DecodedCache:
    """One dataset's entries in the node's cache folder ``root`` (picklable: maps nothing until used).

    Made in the main process, it makes and checks its folders at once (``CacheFolderError``: a clear
    error up front, before any worker starts); each worker checks them again when it first uses them."""

    root: str
    identity: str  # the dataset's manifest sha256
    scale: int
    limit: int | None  # bytes; None: every sample
    shards: Sequence[ShardInfo]  # the dataset's keys and HR sizes, to choose the cached subset
    _admitted: frozenset[str] | None = None
    _bpp: int | None = None
    _disabled: bool = False  # no more writes in this process (a full filesystem, a write error)
    _unsafe: bool = False  # a folder failed its checks in this process: neither read nor written
    _pid: int = 0  # the process that checked the folders
    # pairs this process has mapped, most recently used last: a mapping kept keeps its page tables,
    # so a later epoch's crops fault nothing in (mapping a 25 MB pair afresh costs ~10 ms of faults)
    _mapped: collections.OrderedDict[str, tuple[np.ndarray, np.ndarray]] = dataclasses.field(
        default_factory=collections.OrderedDict, repr=False
    )
    _mapped_bytes: int = 0
    _verified: set[int] = dataclasses.field(default_factory=set, repr=False)  # (key, file version) checked here
    _bad: set[str] = dataclasses.field(default_factory=set, repr=False)  # keys whose entry was refused: replaced
    _rejected: int = 0  # entries refused since the last take_rejected()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_mapped"], state["_mapped_bytes"] = collections.OrderedDict(), 0  # mappings stay in their process
        state["_verified"], state["_bad"], state["_rejected"] = set(), set(), 0
        return state

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit <= 0:
            raise ValueError(f"decoded_cache_limit must be a positive number of bytes, got {self.limit}")
        if not _DATASET.fullmatch(self.identity):
            raise ValueError(f"not a dataset identity: {self.identity!r}")
        self._prepare()
        self._pid = os.getpid()

    @property
    def folder(self) -> Path:
        return Path(self.root) / SUBDIR / self.identity

    def path(self, key: str) -> Path:
        return self.folder / _name(key, self.scale)

    def _prepare(self) -> None:
        """Make (0700) and check the root, our subfolder and this dataset's folder."""
        missing, up = [], os.path.dirname(os.path.abspath(self.root))
        while up and not os.path.lexists(up) and up != os.path.dirname(up):
            missing.append(up)
            up = os.path.dirname(up)
        levels = (self.root, os.path.join(self.root, SUBDIR), os.path.join(self.root, SUBDIR, self.identity))
        for p in [*reversed(missing), *levels]:  # folders above the root that wdsr makes: 0700 too
            try:
                if p in levels:
                    check_folder(p, create=True)
                else:
                    os.mkdir(p, 0o700)
            except FileExistsError:
                pass
            except OSError as exc:  # one line naming the folder, not a traceback
                raise CacheFolderError(p, f"cannot be made or read ({exc.strerror or exc.__class__.__name__})") from None

    def _usable(self) -> bool:
        """Checks the folders once per process; False once they failed (the cache is then unused here)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._recheck()
        return not self._unsafe

    def _recheck(self) -> bool:
        try:
            self._prepare()
            return True
        except CacheFolderError as exc:
            self._unsafe = True
            log.warning("%s; this process decodes as without a cache", exc)
        except OSError as exc:
            self._disabled = True
            log.warning("decoded cache %s: %s; this process stops writing to it", self.root, exc)
        return False

    def has(self, key: str) -> bool:  # once per sample: a plain lstat, without pathlib's objects
        if self._pid != os.getpid() and not self._usable():
            return False
        return not self._unsafe and os.path.lexists(os.path.join(self.root, SUBDIR, self.identity, _name(key, self.scale)))

    def take_rejected(self) -> int:
        """Entries refused (and so decoded instead) since the last call: for the stats."""
        n, self._rejected = self._rejected, 0
        return n

    def lookup(
        self, key: str, hr_size: tuple[int, int] | None = None, channels: int | None = None, bit_depth: int | None = None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """The cached (HR, LR) of ``key`` as arrays over a shared mapping (never written), or None.

        An entry is served only if it is a regular file (opened without following links, never
        blocking), its header and shapes are what the manifest says (``hr_size``, ``channels``,
        ``bit_depth``: None where not known) and its pixels match its digest (checked once per
        process and file). A refused entry counts (``take_rejected``) and is replaced when the pair
        is stored. Up to ``MAX_MAPPED`` pairs (``MAX_MAPPED_BYTES``) stay mapped in this process."""
        kept = self._mapped.get(key)
        if kept is not None:
            self._mapped.move_to_end(key)
            return kept
        if not self._usable():
            return None
        got = self._map(key, (hr_size, channels, bit_depth))
        if isinstance(got, str):
            self._bad.add(key)
            self._rejected += 1
            log.debug("decoded cache: entry %s of %r refused (%s); decoding it", self.path(key), key, got)
            return None
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

    def _map(self, key: str, expect: tuple[Any, Any, Any]) -> tuple[np.ndarray, np.ndarray] | str | None:
        """The entry's arrays; None when there is none; why it is refused otherwise."""
        try:
            with storage.open_regular(str(self.path(key)), follow_symlinks=False) as f:
                st = os.fstat(f.fileno())
                if st.st_size < _ALIGN:
                    return "shorter than its header (truncated)"
                # a private mapping: the pages are the file's own (shared with every process that maps
                # it) as long as nobody writes, which nothing does; torch takes such arrays without a warning
                mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except FileNotFoundError:
            return None  # gone since has() (wdsr cache clear): absent
        except InputError as exc:
            return exc.reason  # a FIFO, a device, a folder or a link at the entry's name
        except (ValueError, OSError) as exc:
            return f"unreadable ({exc.__class__.__name__})"
        try:
            return self._arrays(mm, key, st, expect)
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError, struct.error) as exc:
            return f"bad header ({exc.__class__.__name__})"

    def _arrays(self, mm: mmap.mmap, key: str, st: os.stat_result, expect: tuple[Any, Any, Any]) -> Any:
        if mm[:8] != MAGIC:
            return "no WDSRPAIR magic"
        (n,) = struct.unpack("<I", mm[8:12])
        head = json.loads(mm[12 : 12 + n]) if 12 + n <= _ALIGN else None
        if not isinstance(head, dict) or (head.get("key"), head.get("scale"), head.get("layout")) != (key, self.scale, "chw"):
            return "header of another key, scale or layout"
        why = shape_problem(head, self.scale, *expect)
        if why is not None:
            return why
        shapes = [tuple(head[p]["shape"]) for p in ("hr", "lr")]
        dtype = np.dtype(_DTYPES[head["hr"]["dtype"]])
        sizes = [int(np.prod(s)) for s in shapes]
        if _ALIGN + sum(sizes) * dtype.itemsize != st.st_size:
            return f"{st.st_size} bytes, its shapes need {_ALIGN + sum(sizes) * dtype.itemsize} (truncated?)"
        version = xxhash.xxh3_64_intdigest(f"{key}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        if version not in self._verified:
            digest = head.get("xxh3_64")
            if not isinstance(digest, str) or xxhash.xxh3_64_hexdigest(memoryview(mm)[_ALIGN:]) != digest:
                return "its pixels do not match its digest (corrupt or altered)"
            if len(self._verified) >= MAX_VERIFIED:
                self._verified.clear()
            self._verified.add(version)
        hr = np.frombuffer(mm, dtype=dtype, count=sizes[0], offset=_ALIGN).reshape(shapes[0])
        lr = np.frombuffer(mm, dtype=dtype, count=sizes[1], offset=_ALIGN + sizes[0] * dtype.itemsize).reshape(shapes[1])
        return hr, lr

    # ---- which samples are cached -------------------------------------------------------------
    def admits(self, key: str, bytes_per_pixel: int) -> bool:
        if self.limit is None:
            return True
        key = key.split(FRAME_SEP, 1)[0]  # a clip frame (``{segment}#f0003``) is in when its segment is
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
    def store(self, key: str, hr: np.ndarray, lr: np.ndarray, channels: int | None = None, bit_depth: int | None = None) -> bool:
        """Write the pair if it is in the cached subset and not there yet (or there but refused:
        then replaced); False when not written. A pair ``lookup`` would refuse is never written."""
        if self._disabled or not self._usable() or hr.dtype.name not in _DTYPES:
            return False
        bpp = hr.dtype.itemsize * (1 if hr.ndim == 2 else hr.shape[2])
        if not self.admits(key, bpp):
            return False
        final = self.path(key)
        replace = key in self._bad
        if not replace and os.path.lexists(final):
            return False
        hr, lr = _planar(hr), _planar(lr)  # C x H x W: a patch is then plain copies, no transposing one
        digest = xxhash.xxh3_64()
        digest.update(hr.data)
        digest.update(lr.data)
        fields = {"key": key, "scale": self.scale, "layout": "chw", "xxh3_64": digest.hexdigest()}
        fields |= {p: {"shape": list(a.shape), "dtype": a.dtype.name} for p, a in (("hr", hr), ("lr", lr))}
        if shape_problem(fields, self.scale, None, channels, bit_depth) is not None:
            return False
        head = json.dumps(fields).encode()
        if 12 + len(head) > _ALIGN:
            return False  # a key too long for the header: decoded as without a cache
        blob = (MAGIC + struct.pack("<I", len(head)) + head + bytes(_ALIGN - 12 - len(head)), hr.data, lr.data)
        for attempt in (0, 1):
            try:
                done = self._write(final, blob, replace)
                if done:
                    self._bad.discard(key)
                return done
            except FileNotFoundError:  # its folder went (wdsr cache clear) while it wrote: make it again, once
                if attempt or not self._recheck():
                    return False  # this sample only: the next one tries again
            except OSError as exc:
                self._disabled = True
                why = "the filesystem is full (ENOSPC)" if exc.errno == errno.ENOSPC else str(exc)
                log.warning(
                    "decoded cache %s: %s; this process stops writing to it and decodes as without a cache",
                    self.root,
                    why,
                )
                return False
        return False

    def open_temp(self, path: Path) -> int:
        """A new temp file beside the entry (never an existing one, never through a link)."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)

    def _write(self, final: Path, blob: tuple[Any, ...], replace: bool) -> bool:
        """Write ``blob`` to a temp name, then put it in place: ``link`` (never replaces; False when
        another process got there first), or with ``replace`` a ``rename`` over the refused entry
        (atomic, and it replaces a FIFO or a link itself, never what a link points to)."""
        temp = final.with_name(f"{final.name}.tmp.{os.getpid()}.{os.urandom(4).hex()}")
        try:
            with open(self.open_temp(temp), "wb") as f:
                for part in blob:
                    f.write(part)
            if replace:
                try:
                    os.rename(temp, final)
                except OSError as exc:
                    if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                        raise
                    return False  # a folder at the entry's name: left alone, this pair is decoded
                return True
            try:
                os.link(temp, final)  # complete, under its name, or not at all; never replaces
            except FileExistsError:
                return False
            return True
        finally:
            try:
                os.unlink(temp)
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


def _datasets(root: str | os.PathLike) -> list[os.DirEntry]:
    """The dataset folders of the cache under ``root``, never through a link: a root or subfolder
    that is a link, another user's or writable by others is a ``CacheFolderError``; a dataset
    folder of that kind is left out (with a warning)."""
    base = os.path.join(root, SUBDIR)
    if not (check_folder(os.fspath(root)) and check_folder(base)):
        return []
    out = []
    with os.scandir(base) as it:
        for d in sorted(it, key=lambda e: e.name):
            if not _DATASET.fullmatch(d.name):
                continue
            why = folder_problem(d.stat(follow_symlinks=False), os.geteuid())
            if why is not None:
                log.warning("decoded cache: left %s alone: it %s", d.path, why)
                continue
            out.append(d)
    return out


def _entries(folder: os.DirEntry) -> list[os.DirEntry]:
    with os.scandir(folder.path) as it:
        return [f for f in it if _FILE.fullmatch(f.name) or _TEMP.fullmatch(f.name)]


def usage(root: str | os.PathLike) -> list[CacheUsage]:
    """Each dataset's entries in the decoded cache under ``root`` (links are not followed)."""
    out: list[CacheUsage] = []
    for d in _datasets(root):
        pairs = temps = total = 0
        newest = 0.0
        for f in _entries(d):
            try:
                st = f.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if _FILE.fullmatch(f.name):
                pairs, total, newest = pairs + 1, total + st.st_size, max(newest, st.st_mtime)
            else:
                temps += 1
        out.append(CacheUsage(d.name, pairs, total, temps, newest))
    return out


def clear(root: str | os.PathLike, dataset: str | None = None) -> int:
    """Remove the decoded cache under ``root`` (one dataset's entries with ``dataset``, an identity
    or its prefix); only names this module makes are touched, and never through a link (a linked
    or unsafe root or subfolder is a ``CacheFolderError``; a link at an entry's name is removed
    itself). Returns the files removed. A file that a process has mapped stays readable to it
    until it unmaps it (POSIX unlink)."""
    removed = 0
    for d in _datasets(root):
        if dataset and not d.name.startswith(dataset):
            continue
        for f in _entries(d):
            try:
                os.unlink(f.path)  # a folder at an entry's name is not ours to remove: it stays
                removed += 1
            except OSError:
                pass
        try:
            os.rmdir(d.path)
        except OSError:
            pass
    try:
        os.rmdir(os.path.join(root, SUBDIR))
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
