"""Reading a manifest's column index (``manifest.json.idx``, written by :mod:`.colindex`).

The index is as untrusted as the manifest. It is used only when it names the manifest file beside
it (same size, same probe of its first and last MiB); then its header is checked as a manifest's
top level is, every column's dtype, shape and extent against the file, and every per-sample value
(offsets, sizes, tile sides, member places, key boundaries) with vectorised passes over chunks of
about a million samples, before any entry is made. A key's own rules are checked when it is read.
Local indexes are memory-mapped (page cache shared by every process); others are fetched once per
process. Entries (:class:`ShardInfo`) are made on access, over views of the columns."""

from __future__ import annotations

import json
import logging
import math
import mmap
import operator
from collections.abc import Iterator, Sequence
from typing import Any, overload

import fsspec
import numpy as np

from shardmaker import storage
from shardmaker.errors import InputError
from shardmaker.format.colcheck import check_files, check_samples, check_shards
from shardmaker.format.colindex import ALIGN, MAGIC, MAX_HEADER, PREFIX, VERSION, data_start, index_path
from shardmaker.format.columns import MemberColumns
from shardmaker.format.files import FileColumns
from shardmaker.format.manifest import Manifest, ShardInfo, check_totals, top_fields
from shardmaker.format.schema import PROBE_BYTES, SHA256, ManifestError, key_problem, probe_of

log = logging.getLogger("shardmaker.format")
U4U8 = ("<u4", "<u8")


class IndexKeys(Sequence[str]):
    """One shard's keys: views of the index's key bytes and boundaries; each key decoded and held
    to the key rules when it is read (a bad one is a :class:`ManifestError` naming it)."""

    __slots__ = ("_at", "_blob", "_dots", "_field", "_where")

    def __init__(self, blob: np.ndarray, at: np.ndarray, dots: bool, where: str, field: str) -> None:
        self._blob, self._at, self._dots, self._where, self._field = blob, at, dots, where, field

    def __len__(self) -> int:
        return len(self._at) - 1

    def _key(self, i: int) -> str:
        raw = self._blob[int(self._at[i]) : int(self._at[i + 1])].tobytes()
        try:
            key = raw.decode()
        except UnicodeDecodeError:
            raise ManifestError(self._where, f"{self._field}[{i}]", "a key must be UTF-8 text") from None
        why = key_problem(key, dots=self._dots)
        if why is not None:
            raise ManifestError(self._where, f"{self._field}[{i}]", f"a key {why}")
        return key

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._key(j) for j in range(*i.indices(len(self)))]
        return self._key(_position(i, len(self)))

    def __iter__(self) -> Iterator[str]:
        return (self._key(j) for j in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def _position(i: Any, n: int) -> int:
    i = operator.index(i)
    if not -n <= i < n:
        raise IndexError(f"index {i} out of range for {n} entries")
    return i + n if i < 0 else i


class ShardTable(Sequence[ShardInfo]):
    """A dataset's shard entries over the index's columns: ``table[i]`` makes entry ``i`` (~5 us);
    ``totals`` are the dataset's samples and bytes. Pickled as where the index is, so a spawned
    DataLoader worker maps the same file instead of receiving a copy."""

    def __init__(
        self, cols: dict[str, np.ndarray], members: list[str], where: str, source: tuple[str, Any, str], files: bool = False
    ) -> None:
        self._c, self._members, self._where, self._source, self._files = cols, members, where, source, files
        self._n = len(cols["starts"]) - 1
        self.totals = (int(cols["starts"][-1]), int(cols["shard_bytes"].sum()))

    def __len__(self) -> int:
        return self._n

    def samples_per_shard(self) -> np.ndarray:
        """Every shard's sample count, from the columns (no entry made)."""
        return np.diff(self._c["starts"])

    def hr_sizes(self) -> np.ndarray:
        """Every sample's HR ``(w, h)``, ``[samples, 2]``, in shard order (a view of the mapped column)."""
        return self._c["hr_sizes"]

    def name(self, i: int) -> str:
        at = self._c["name_at"]
        return self._c["names"][int(at[i]) : int(at[i + 1])].tobytes().decode()

    def _entry(self, i: int) -> ShardInfo:
        c = self._c
        a, b = int(c["starts"][i]), int(c["starts"][i + 1])
        name, flags = self.name(i), int(c["flags"][i])
        foreign = bool(self._members) and not self._files  # keys as another tool wrote them: dots allowed
        keys = IndexKeys(c["keys"], c["key_at"][a : b + 1], foreign, self._where, f"shards[{i}] ({name}).keys")
        members = files = None
        if self._files:
            files = {
                m: FileColumns(
                    IndexKeys(c[f"f{j}.paths"], c[f"f{j}.path_at"][a : b + 1], True, self._where, f"shards[{i}].files.{m}.paths"),
                    c[f"f{j}.bytes"][a:b],
                    c[f"f{j}.xxh3_64"][a:b],
                )
                for j, m in enumerate(self._members)
            }
        elif self._members:
            members = {
                m: MemberColumns(c[f"m{j}.offsets"][a:b], c[f"m{j}.bytes"][a:b], c[f"m{j}.xxh3_64"][a:b])
                for j, m in enumerate(self._members)
            }
        return ShardInfo.of_columns(
            name,
            b - a,
            int(c["shard_bytes"][i]),
            c["sha256"][i].tobytes().hex(),
            keys,
            c["offsets"][a:b],
            c["hr_sizes"][a:b],
            c["probe"][i].tobytes().hex() if flags & 1 else None,
            members,
            c["tiles"][a:b] if flags & 2 else None,
            files,
        )

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...
    @overload
    def __getitem__(self, i: slice) -> list[ShardInfo]: ...
    def __getitem__(self, i: int | slice) -> ShardInfo | list[ShardInfo]:
        if isinstance(i, slice):
            return [self._entry(j) for j in range(*i.indices(self._n))]
        return self._entry(_position(i, self._n))

    def __iter__(self) -> Iterator[ShardInfo]:
        return (self._entry(j) for j in range(self._n))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (reopen, self._source)


def _mapped(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    """The index's bytes: a read-only memory map of a local file, else the whole object fetched. A
    local index must be a regular file (a FIFO there would block, a device read without end)."""
    if not storage.is_local(fs):
        return fs.cat_file(path)
    try:
        f = storage.open_regular(path)
    except InputError as exc:
        raise ManifestError(path, None, exc.reason) from None
    with f:
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            return b""


def _header(buf: Any, where: str) -> dict[str, Any]:
    if len(buf) < PREFIX or bytes(buf[: len(MAGIC)]) != MAGIC:
        raise ManifestError(where, None, "not a column index (no WDSRCOLS magic)")
    version, length = int.from_bytes(buf[8:12], "little"), int.from_bytes(buf[12:16], "little")
    if version != VERSION:
        raise ManifestError(where, "version", f"column index version {version}; this reader knows {VERSION}")
    if length > min(MAX_HEADER, len(buf) - PREFIX):
        raise ManifestError(where, "header", f"{length} bytes: longer than the file or {MAX_HEADER}")
    try:
        h = json.loads(bytes(buf[PREFIX : PREFIX + length]))
    except (ValueError, RecursionError):
        raise ManifestError(where, "header", "not valid JSON") from None
    if type(h) is not dict or {"version", "manifest", "top", "member_names", "columns"} - set(h):
        raise ManifestError(where, "header", "must hold version, manifest, top, member_names and columns")
    ident = h["manifest"]
    if type(ident) is not dict or type(ident.get("bytes")) is not int:
        raise ManifestError(where, "manifest", "must be {bytes, probe, sha256} of the manifest file")
    for k in ("probe", "sha256"):
        if not isinstance(ident.get(k), str) or not SHA256.fullmatch(ident[k]):
            raise ManifestError(where, f"manifest.{k}", "must be 64 lowercase hex digits")
    if type(h["columns"]) is not dict or type(h["member_names"]) is not list:
        raise ManifestError(where, "columns", "must be an object, member_names a list")
    h["base"] = data_start(length)
    return h


def _probe(fs: fsspec.AbstractFileSystem, path: str, size: int) -> str:
    try:
        head = storage.read_range(fs, path, 0, min(PROBE_BYTES, size))
        return probe_of(head, storage.read_range(fs, path, max(0, size - PROBE_BYTES), size))
    except InputError as exc:  # the manifest beside the index is a FIFO or a device
        raise ManifestError(path, None, exc.reason) from None


def open_indexed(fs: fsspec.AbstractFileSystem, path: str, storage_options: dict[str, Any] | None = None) -> Manifest | None:
    """The manifest at ``path`` read from its column index; None when there is none, or when it
    was made from another manifest file (then the caller reads the JSON). An index that names the
    manifest but breaks a rule is a :class:`ManifestError`."""
    idx = index_path(path)
    try:
        size = storage.size_of(fs, path)
        buf = _mapped(fs, idx)
    except FileNotFoundError:
        return None
    except InputError as exc:  # the manifest is a FIFO, a folder or a device: never read
        raise ManifestError(path, None, exc.reason) from None
    h = _header(buf, idx)
    if h["manifest"]["bytes"] != size or h["manifest"]["probe"] != _probe(fs, path, size):
        log.warning("%s was made from another %s than the one beside it; reading the JSON (slower)", idx, path)
        return None
    return _manifest(buf, h, idx, (storage.url_of(fs, idx), storage_options, h["manifest"]["sha256"]))


def reopen(url: str, storage_options: dict[str, Any] | None, sha256: str) -> ShardTable:
    """The table of the index at ``url`` in another process (a spawned DataLoader worker), which
    must still be the one of the manifest with digest ``sha256``."""
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    buf = _mapped(fs, path)
    h = _header(buf, url)
    if h["manifest"]["sha256"] != sha256:
        raise ManifestError(url, None, "the column index changed since the dataset was opened")
    table = _manifest(buf, h, url, (url, storage_options, sha256)).shards
    assert isinstance(table, ShardTable)  # noqa: S101 - what _manifest makes
    return table


def _manifest(buf: Any, h: dict[str, Any], where: str, source: tuple[str, Any, str]) -> Manifest:
    top = top_fields(h["top"], where)
    files = top["files"] is not None
    members = top["members"].names() if top["members"] is not None else []
    if h["member_names"] != members:
        raise ManifestError(where, "member_names", f"must be {members}, the manifest's members in order")
    cols = _columns(buf, h, where, len(members), files)
    check_shards(cols, where, bool(members))
    check_samples(cols, where, [] if files else members)
    if files:
        check_files(cols, where, members)
    m = Manifest(shards=ShardTable(cols, members, where, source, files), identity=h["manifest"]["sha256"], **top)
    check_totals(m, h["top"], where)
    return m


def _column(buf: Any, h: dict[str, Any], name: str, dtypes: tuple[str, ...], shape: tuple[int | None, ...]) -> np.ndarray:
    """Column ``name``: its dtype one of ``dtypes``, its shape ``shape`` (None: any length), inside the file."""
    spec, where = h["columns"].get(name), h.get("where", "")
    if type(spec) is not dict or spec.get("dtype") not in dtypes or type(spec.get("shape")) is not list:
        raise ManifestError(where, f"columns.{name}", f"missing, or not of dtype {' or '.join(dtypes)}")
    got, off = spec["shape"], spec.get("offset")
    fits = len(got) == len(shape) and all(type(x) is int and x >= 0 and w in (None, x) for x, w in zip(got, shape, strict=True))
    if not fits:
        raise ManifestError(where, f"columns.{name}", f"shape {got} where {list(shape)} was expected")
    dtype = np.dtype(spec["dtype"])
    count = math.prod(got)  # Python ints: a crafted shape cannot overflow
    if type(off) is not int or off < 0 or off % ALIGN or h["base"] + off + count * dtype.itemsize > len(buf):
        raise ManifestError(where, f"columns.{name}", f"must lie inside the file, {ALIGN}-byte aligned")
    if count == 0:
        return np.zeros(got, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=count, offset=h["base"] + off).reshape(got)


def _columns(buf: Any, h: dict[str, Any], where: str, members: int, files: bool = False) -> dict[str, np.ndarray]:
    h["where"] = where
    c = {"starts": _column(buf, h, "starts", ("<u8",), (None,))}
    shards = len(c["starts"]) - 1
    if shards < 1 or c["starts"][0] != 0 or bool(np.any(np.diff(c["starts"].astype(np.int64)) < 1)):
        raise ManifestError(where, "columns.starts", "shards must be listed, each with at least one sample")
    n = int(c["starts"][-1])
    for name, dtypes, shape in [
        ("shard_bytes", ("<u8",), (shards,)),
        ("name_at", ("<u8",), (shards + 1,)),
        ("names", ("|u1",), (None,)),
        ("sha256", ("|u1",), (shards, 32)),
        ("probe", ("|u1",), (shards, 32)),
        ("flags", ("|u1",), (shards,)),
        ("key_at", U4U8, (n + 1,)),
        ("keys", ("|u1",), (None,)),
        ("offsets", U4U8, (n,)),
        ("hr_sizes", ("<u2", "<u4"), (n, 2)),
        *[(f"m{j}.{f}", U4U8, (n,)) for j in range(0 if files else members) for f in ("offsets", "bytes")],
        *[(f"m{j}.xxh3_64", ("<u8",), (n,)) for j in range(0 if files else members)],
        *[(f"f{j}.{f}", ("<u8",), (n,)) for j in range(members if files else 0) for f in ("bytes", "xxh3_64")],
        *[(f"f{j}.path_at", ("<u8",), (n + 1,)) for j in range(members if files else 0)],
        *[(f"f{j}.paths", ("|u1",), (None,)) for j in range(members if files else 0)],
        *([("tiles", ("<u2",), (n,))] if "tiles" in h["columns"] else []),
    ]:
        c[name] = _column(buf, h, name, dtypes, shape)
    if set(h["columns"]) != set(c):
        raise ManifestError(where, "columns", f"unknown columns {sorted(set(h['columns']) - set(c))}")
    return c
