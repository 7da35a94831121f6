"""The ``manifest.json`` of a shard set (format ``wdsr-shards/1``): the dataset's commit marker."""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from shardmaker import storage
from shardmaker.errors import ShardmakerError

FORMAT = "wdsr-shards/1"
MANIFEST = "manifest.json"


def pair_fits(hr_hw: tuple[int, int], lr_hw: tuple[int, int], scale: int) -> bool:
    """The format's pairing rule: HR sides are s x LR plus less than s (the mod-crop remainder)."""
    (h, w), (lh, lw) = hr_hw, lr_hw
    return 0 <= h - scale * lh < scale and 0 <= w - scale * lw < scale


class ManifestError(ShardmakerError, ValueError):
    """A manifest that is missing, unreadable or breaks the schema: ``where`` (URL or path),
    ``field`` (e.g. ``shards[3].offsets``) and ``reason``. Messages never quote the file's bytes."""

    def __init__(self, where: str, field: str | None = None, reason: str | None = None) -> None:
        if reason is None:
            msg = where
        else:
            msg = f"{where}: {field}: {reason}" if field else f"{where}: {reason}"
        super().__init__(msg)
        self.where, self.field, self.reason = where, field, reason

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.where, self.field, self.reason))


# ---- the schema ---------------------------------------------------------------------------------
CODECS = ("png", "qoi")
LR_METHODS = ("matlab", "matlab-uint8", "provided")
MAX_SIDE = 1 << 20  # pixels per image side
MAX_SHARD_BYTES = 1 << 46
MAX_SAMPLES = 1 << 24  # per shard
MAX_MANIFEST_BYTES = 1 << 30
# A shard name: one path component, no "..", no leading dot; the shard URL is always dataset + "/" + name.
SHARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,250}\.tar")
# A key: the source's relative path without extension, dots replaced by "_": "/"-separated
# segments without dots, control characters or empty segments.
KEY = re.compile(r"[^\x00-\x1f\x7f./]{1,255}(/[^\x00-\x1f\x7f./]{1,255}){0,31}")
SHA256 = re.compile(r"[0-9a-f]{64}")
# Indexes of foreign shards (``shardmaker index``): keys as the other tool wrote them, dots allowed
# (no "." or ".." segment); member names like "hr.png", "jpg", "x4.jpg"; digests of the member data.
INDEX_KEY = re.compile(r"[^\x00-\x1f\x7f/]{1,255}(/[^\x00-\x1f\x7f/]{1,255}){0,31}")
MEMBER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}(\.[A-Za-z0-9_-]{1,32}){0,3}")
MEMBER_CODECS = ("png", "qoi", "jpg", "jpeg", "webp")
XXH3 = re.compile(r"[0-9a-f]{16}")


PROBE_BYTES = 1 << 20
BLOCK = 512  # tar block
JSON_MEMBER = "json"


def hr_member(codec: str) -> str:
    """A sample's HR member suffix (``{key}.hr.png``)."""
    return f"hr.{codec}"


def lr_member(scale: int, codec: str) -> str:
    """A sample's LR member suffix for one scale (``{key}.lr_x4.png``)."""
    return f"lr_x{scale}.{codec}"


def sample_members(codec: str, scales: list[int] | tuple[int, ...]) -> list[str]:
    """Every member suffix of a sample, in the order the format writes them."""
    return [JSON_MEMBER, hr_member(codec)] + [lr_member(s, codec) for s in sorted(scales)]


def probe_of(head: bytes | bytearray, tail: bytes | bytearray) -> str:
    """The shard's probe: sha256 of its first and last MiB. It tells one build's shard from another's
    for ~1 ms per shard, where the full sha256 (``verify``) reads it all."""
    return hashlib.sha256(b"wdsr-probe/1\0" + bytes(head) + bytes(tail)).hexdigest()


def probe_file(f: Any, size: int) -> str:
    f.seek(0)
    head = f.read(min(PROBE_BYTES, size))
    f.seek(max(0, size - PROBE_BYTES))
    return probe_of(head, f.read(PROBE_BYTES))


def check_shard_name(name: Any, where: str = MANIFEST, field: str = "name") -> str:
    if not isinstance(name, str) or not SHARD_NAME.fullmatch(name) or ".." in name:
        raise ManifestError(
            where,
            field,
            "a shard name must be one file name like shard-000000.tar (letters, digits, '_', '-', '.'; no '/', no '..')",
        )
    return name


def shard_path(root: str, name: str) -> str:
    """Where shard ``name`` of the dataset at ``root`` is: inside it, whatever the manifest says."""
    return f"{root.rstrip('/')}/{check_shard_name(name)}"


def _int(v: Any, where: str, field: str, lo: int, hi: int) -> int:
    if type(v) is not int:  # not bool, not float, not a string of digits
        raise ManifestError(where, field, f"must be an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ManifestError(where, field, f"must be in [{lo}, {hi}], got {v}")
    return v


def _list(v: Any, where: str, field: str, n: int | None = None) -> list:
    if type(v) is not list:
        raise ManifestError(where, field, f"must be a list, got {type(v).__name__}")
    if n is not None and len(v) != n:
        raise ManifestError(where, field, f"must have {n} entries (one per sample), has {len(v)}")
    return v


def _str(v: Any, where: str, field: str) -> str:
    if not isinstance(v, str):
        raise ManifestError(where, field, f"must be a string, got {type(v).__name__}")
    return v


def codec_of(member: str) -> str:
    """The codec of a member name: its last part (``x4.jpg`` -> ``jpg``)."""
    return member.rsplit(".", 1)[-1].lower()


@dataclasses.dataclass(frozen=True)
class MemberNames:
    """The members an index of foreign shards reads: ``{key}.{hr}`` and ``{key}.{lr[s]}`` per scale."""

    hr: str
    lr: dict[int, str]

    def names(self) -> list[str]:
        return [self.hr] + [self.lr[s] for s in sorted(self.lr)]

    def to_json(self) -> dict[str, Any]:
        return {"hr": self.hr, "lr": {str(s): self.lr[s] for s in sorted(self.lr)}}

    @classmethod
    def from_json(cls, d: Any, where: str = MANIFEST) -> MemberNames:
        if type(d) is not dict or set(d) != {"hr", "lr"} or type(d["lr"]) is not dict or not d["lr"]:
            raise ManifestError(where, "members", 'must be {"hr": NAME, "lr": {"SCALE": NAME, ...}}')
        lr: dict[int, str] = {}
        for s, name in d["lr"].items():
            if not (isinstance(s, str) and s.isdigit() and 2 <= int(s) <= 16):
                raise ManifestError(where, "members.lr", f"scale {s!r} must be a whole number 2..16")
            lr[int(s)] = name
        names = [d["hr"], *lr.values()]
        for name in names:
            if not isinstance(name, str) or not MEMBER_NAME.fullmatch(name) or codec_of(name) not in MEMBER_CODECS:
                raise ManifestError(
                    where,
                    "members",
                    f"{name!r} is not a member name like hr.png or x4.jpg (extensions: {', '.join(MEMBER_CODECS)})",
                )
        if len(set(names)) != len(names):
            raise ManifestError(where, "members", "the HR and LR members must have different names")
        return cls(d["hr"], lr)


@dataclasses.dataclass(frozen=True)
class MemberColumns:
    """Where one member of every sample of a foreign shard is: its entry's first byte (its header,
    or the long-name/PAX header before it), the entry's length (headers, data, padding), and the
    xxh3_64 of its data. Numpy columns, so members may sit anywhere in the shard, in any order."""

    offsets: np.ndarray
    bytes: np.ndarray
    xxh3_64: np.ndarray  # uint64

    def to_json(self) -> dict[str, Any]:
        return {
            "offsets": [int(o) for o in self.offsets],
            "bytes": [int(n) for n in self.bytes],
            "xxh3_64": [f"{int(d):016x}" for d in self.xxh3_64],
        }

    @classmethod
    def from_json(cls, d: Any, where: str, field: str, samples: int, size: int) -> MemberColumns:
        if type(d) is not dict or set(d) != {"offsets", "bytes", "xxh3_64"}:
            raise ManifestError(where, field, 'must be {"offsets": [...], "bytes": [...], "xxh3_64": [...]}')
        offsets = _list(d["offsets"], where, f"{field}.offsets", samples)
        lengths = _list(d["bytes"], where, f"{field}.bytes", samples)
        digests = _list(d["xxh3_64"], where, f"{field}.xxh3_64", samples)
        for i in range(samples):
            o = _int(offsets[i], where, f"{field}.offsets[{i}]", 0, size - BLOCK)
            n = _int(lengths[i], where, f"{field}.bytes[{i}]", BLOCK, size)
            if o % BLOCK or n % BLOCK or o + n > size:
                raise ManifestError(
                    where, f"{field}[{i}]", f"a member must lie in whole 512-byte tar blocks inside the shard ({size} bytes)"
                )
            if not isinstance(digests[i], str) or not XXH3.fullmatch(digests[i]):
                raise ManifestError(where, f"{field}.xxh3_64[{i}]", "must be 16 lowercase hex digits")
        return cls(
            np.asarray(offsets, dtype=np.uint32 if size < 1 << 32 else np.int64),
            np.asarray(lengths, dtype=np.uint32 if size < 1 << 32 else np.int64),
            np.array([int(x, 16) for x in digests], dtype=np.uint64),
        )


class KeyColumn(Sequence[str]):
    """A shard's sample keys in one fixed-width bytes array (~25 bytes a key instead of ~75 for a
    Python string): how ``load(compact=True)`` holds a million keys in tens of MB."""

    __slots__ = ("array",)

    def __init__(self, keys: Sequence[str]) -> None:
        self.array = np.array([k.encode() for k in keys], dtype=bytes) if len(keys) else np.empty(0, dtype="S1")

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [b.decode() for b in self.array[i]]
        return bytes(self.array[i]).decode()

    def __iter__(self) -> Iterator[str]:
        return (b.decode() for b in self.array)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard's entry. Lists as parsed, or (``compact``) numpy columns and a :class:`KeyColumn`;
    both index the same way (``offsets[i]``, ``keys[i]``, ``hr_sizes[i][0]``)."""

    name: str
    samples: int
    bytes: int
    sha256: str
    keys: Sequence[str]
    offsets: Sequence[int]
    hr_sizes: Sequence[Sequence[int]]
    probe: str | None = None  # probe_of(first MiB, last MiB); absent in manifests of older builds
    members: dict[str, MemberColumns] | None = None  # foreign shards (an index): where each member is

    def __post_init__(self) -> None:
        n = self.samples
        if not (len(self.keys) == len(self.offsets) == len(self.hr_sizes) == n):
            raise ManifestError(
                f"shard {self.name}: samples={n} but {len(self.keys)} keys, "
                f"{len(self.offsets)} offsets, {len(self.hr_sizes)} hr_sizes"
            )
        offsets = np.asarray(self.offsets, dtype=np.int64)
        if (n and offsets[0] != 0 and self.members is None) or bool(np.any(np.diff(offsets) <= 0)):
            raise ManifestError(f"shard {self.name}: offsets must start at 0 and increase")
        for m in (self.members or {}).values():
            if len(m.offsets) != n or not np.array_equal(offsets, np.minimum(offsets, m.offsets.astype(np.int64))):
                raise ManifestError(f"shard {self.name}: a sample's offset must be that of its first member")
        if n and offsets[-1] >= self.bytes:
            raise ManifestError(f"shard {self.name}: last offset {offsets[-1]} beyond {self.bytes} bytes")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "samples": self.samples,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "keys": list(self.keys),
            "offsets": [int(o) for o in self.offsets],
            "hr_sizes": [[int(w), int(h)] for w, h in self.hr_sizes],
        }
        if self.probe is not None:
            d["probe"] = self.probe
        if self.members is not None:
            d["members"] = {name: cols.to_json() for name, cols in self.members.items()}
        return d

    @classmethod
    def from_json(cls, d: Any, where: str = MANIFEST, field: str = "shard", compact: bool = False) -> ShardInfo:
        """A shard entry, checked field by field (types, ranges, patterns, consistency)."""
        if type(d) is not dict:
            raise ManifestError(where, field, f"must be an object, got {type(d).__name__}")
        for k in ("name", "samples", "bytes", "sha256", "keys", "offsets", "hr_sizes"):
            if k not in d:
                raise ManifestError(where, f"{field}.{k}", "missing")
        name = check_shard_name(d["name"], where, f"{field}.name")
        f = f"{field} ({name})"
        samples = _int(d["samples"], where, f"{f}.samples", 1, MAX_SAMPLES)
        size = _int(d["bytes"], where, f"{f}.bytes", 1024, MAX_SHARD_BYTES)
        digest = _str(d["sha256"], where, f"{f}.sha256")
        if not SHA256.fullmatch(digest):
            raise ManifestError(where, f"{f}.sha256", "must be 64 lowercase hex digits")
        indexed = "members" in d
        keys = _list(d["keys"], where, f"{f}.keys", samples)
        for i, k in enumerate(keys):
            if indexed:
                if not isinstance(k, str) or not INDEX_KEY.fullmatch(k) or any(p in (".", "..") for p in k.split("/")):
                    raise ManifestError(
                        where, f"{f}.keys[{i}]", "must be a relative path without control characters, empty, '.' or '..' segments"
                    )
            elif not isinstance(k, str) or not KEY.fullmatch(k):
                raise ManifestError(
                    where, f"{f}.keys[{i}]", "must be a relative path without dots, control characters or empty segments"
                )
        offsets = _list(d["offsets"], where, f"{f}.offsets", samples)
        prev = -1
        for i, o in enumerate(offsets):
            _int(o, where, f"{f}.offsets[{i}]", 0, size - 1)
            if o % 512 or o <= prev or (i == 0 and o != 0 and not indexed):
                raise ManifestError(
                    where, f"{f}.offsets[{i}]", "offsets must start at 0, increase, and be multiples of 512 (tar blocks)"
                )
            prev = o
        sizes = _list(d["hr_sizes"], where, f"{f}.hr_sizes", samples)
        for i, wh in enumerate(sizes):
            _list(wh, where, f"{f}.hr_sizes[{i}]", 2)
            for j in (0, 1):
                _int(wh[j], where, f"{f}.hr_sizes[{i}][{j}]", 1, MAX_SIDE)
        probe = d.get("probe")
        if probe is not None and (not isinstance(probe, str) or not SHA256.fullmatch(probe)):
            raise ManifestError(where, f"{f}.probe", "must be 64 lowercase hex digits")
        members = None
        if indexed:
            if type(d["members"]) is not dict or not d["members"]:
                raise ManifestError(where, f"{f}.members", "must be an object: member name -> columns")
            members = {}
            for mname, cols in d["members"].items():
                if not isinstance(mname, str) or not MEMBER_NAME.fullmatch(mname):
                    raise ManifestError(where, f"{f}.members", f"{mname!r} is not a member name")
                members[mname] = MemberColumns.from_json(cols, where, f"{f}.members.{mname}", samples, size)
            first = np.min(np.stack([c.offsets.astype(np.int64) for c in members.values()]), axis=0)
            if not np.array_equal(first, np.asarray(offsets, dtype=np.int64)):
                raise ManifestError(where, f"{f}.offsets", "a sample's offset must be that of its first member")
        if compact:
            return cls(
                name,
                samples,
                size,
                digest,
                KeyColumn(keys),
                # the narrowest types that hold them: 4 + 4 bytes a sample for shards under 4 GiB, sides under 64k
                np.asarray(offsets, dtype=np.uint32 if size < 1 << 32 else np.int64),  # type: ignore[arg-type]
                np.asarray(sizes, dtype=np.uint16 if max(map(max, sizes)) < 1 << 16 else np.int32).reshape(-1, 2),  # type: ignore[arg-type]
                probe,
                members,
            )
        return cls(name, samples, size, digest, list(keys), list(offsets), [list(wh) for wh in sizes], probe, members)


@dataclasses.dataclass(frozen=True)
class Manifest:
    codec: str
    scales: list[int]
    lr_method: str
    shards: list[ShardInfo]
    build: dict[str, Any] = dataclasses.field(default_factory=dict)
    identity: str | None = dataclasses.field(default=None, compare=False)  # sha256 of the file it was read from
    members: MemberNames | None = None  # an index of foreign shards (shardmaker index); None: our own shards

    def member_names(self, scale: int) -> tuple[str, str]:
        """The HR member and the x``scale`` LR member of every sample (``hr.png``, ``lr_x4.png``)."""
        if self.members is None:
            return hr_member(self.codec), lr_member(scale, self.codec)
        return self.members.hr, self.members.lr[scale]

    @property
    def digest(self) -> str:
        """What tells this dataset from any other: the sha256 of its manifest file (of its JSON
        when it was made in memory)."""
        return self.identity if self.identity is not None else hashlib.sha256(self.dumps()).hexdigest()

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": FORMAT,
            "codec": self.codec,
            "scales": list(self.scales),
            "lr_method": self.lr_method,
            "samples": self.samples,
            "bytes": self.bytes,
            "build": self.build,
        }
        if self.members is not None:
            d["members"] = self.members.to_json()
        d["shards"] = [s.to_json() for s in self.shards]
        return d

    def dumps(self) -> builtins.bytes:  # the property `bytes` above shadows the type in this class
        return (json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n").encode()

    @classmethod
    def from_json(cls, d: Any, where: str = MANIFEST, allow_empty: bool = False, compact: bool = False) -> Manifest:
        """A whole manifest, checked against the schema; ``allow_empty`` for part manifests."""
        if type(d) is not dict or d.get("format") != FORMAT:
            got = d.get("format") if type(d) is dict else None
            raise ManifestError(where, "format", f"not a {FORMAT} manifest (format={got if isinstance(got, str) else None!r})")
        for k in ("codec", "scales", "lr_method", "shards"):
            if k not in d:
                raise ManifestError(where, k, "missing")
        members = MemberNames.from_json(d["members"], where) if "members" in d else None
        codec = _str(d["codec"], where, "codec")
        if members is not None and codec != codec_of(members.hr):
            raise ManifestError(where, "codec", f"must be the HR member's extension, {codec_of(members.hr)!r}")
        if members is None and codec not in CODECS:
            raise ManifestError(where, "codec", f"must be one of {', '.join(CODECS)}")
        scales = _list(d["scales"], where, "scales")
        if not scales:
            raise ManifestError(where, "scales", "must not be empty")
        for i, s in enumerate(scales):
            _int(s, where, f"scales[{i}]", 2, 16)
        if scales != sorted(set(scales)):
            raise ManifestError(where, "scales", "must be increasing, without repeats")
        lr_method = _str(d["lr_method"], where, "lr_method")
        if lr_method not in LR_METHODS:
            raise ManifestError(where, "lr_method", f"must be one of {', '.join(LR_METHODS)}")
        if members is not None and (sorted(members.lr) != scales or lr_method != "provided"):
            raise ManifestError(where, "members", "an index names one LR member per scale, and its lr_method is 'provided'")
        build = d.get("build", {})
        if type(build) is not dict:
            raise ManifestError(where, "build", "must be an object")
        raw_shards = _list(d["shards"], where, "shards")
        if not raw_shards and not allow_empty:
            raise ManifestError(where, "shards", "no shards: an empty dataset")
        shards = []
        for i, x in enumerate(raw_shards):
            if isinstance(x, _Parsed):  # parse(compact=True) made it while reading the JSON
                shards.append(x.info if x.info is not None else ShardInfo.from_json(x.original, where, f"shards[{i}]", compact))
            else:
                shards.append(ShardInfo.from_json(x, where, f"shards[{i}]", compact))
        if compact:
            _no_parsed(build, where, "build")
        names: set[str] = set()
        want = None if members is None else set(members.names())
        for i, sh in enumerate(shards):
            if (sh.members is None) != (want is None) or (sh.members is not None and set(sh.members) != want):
                raise ManifestError(
                    where,
                    f"shards[{i}] ({sh.name}).members",
                    f"must list exactly the members {sorted(want or [])}"
                    if want
                    else "only an index of foreign shards lists members",
                )
            if sh.name in names:
                raise ManifestError(where, "shards", f"shard {sh.name} is listed twice")
            names.add(sh.name)
        _check_unique_keys(shards, where)
        m = cls(codec, list(scales), lr_method, shards, dict(build), members=members)
        for total in ("samples", "bytes"):
            if total in d and (type(d[total]) is not int or d[total] != getattr(m, total)):
                raise ManifestError(where, total, "does not add up over the shards")
        return m


@dataclasses.dataclass(frozen=True)
class _Parsed:
    """A shard entry turned into columns while the JSON is still being parsed (or why it could
    not be): its lists are freed at once, so a million samples never exist as Python objects."""

    info: ShardInfo | None
    original: dict[str, Any] | None = None  # kept only when it failed: checked again to name shards[i]


_SHARD_FIELDS = frozenset({"name", "samples", "bytes", "sha256", "keys", "offsets", "hr_sizes"})


def _compact_hook(where: str) -> Any:
    def hook(d: dict[str, Any]) -> Any:
        if not _SHARD_FIELDS <= d.keys():
            return d
        try:
            return _Parsed(ShardInfo.from_json(d, where, "shard", True))
        except ManifestError:
            return _Parsed(None, d)

    return hook


def _no_parsed(v: Any, where: str, field: str) -> None:
    """A shard entry anywhere but in ``shards`` (a crafted file): refused, not silently changed."""
    if isinstance(v, _Parsed):
        raise ManifestError(where, field, "holds a shard entry outside the shards list")
    if isinstance(v, dict):
        for k, x in v.items():
            _no_parsed(x, where, f"{field}.{k}")
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _no_parsed(x, where, f"{field}[{i}]")


def _check_unique_keys(shards: list[ShardInfo], where: str) -> None:
    """Every key once in the dataset: one sort of all keys as fixed-width bytes, not a set of strings."""
    if not shards:
        return
    cols = [
        s.keys.array if isinstance(s.keys, KeyColumn) else np.array([k.encode() for k in s.keys], dtype=bytes) for s in shards
    ]
    width = max((c.dtype.itemsize for c in cols if len(c)), default=1)
    every = np.sort(np.concatenate([c.astype(f"S{width}") for c in cols]))
    dup = np.flatnonzero(every[1:] == every[:-1])
    if len(dup):
        key = bytes(every[dup[0]]).decode()
        owner = next(s.name for s in shards if key in set(s.keys))
        raise ManifestError(where, f"shards ({owner}).keys", f"key {key!r} appears twice in the dataset")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load(url: str, storage_options: dict[str, Any] | None = None, compact: bool = False, name: str = MANIFEST) -> Manifest:
    """Read ``URL/manifest.json`` (URL is the dataset folder); ``compact``: per-sample data in
    numpy columns (what the streaming reader holds in every process)."""
    fs, root = storage.open_dir(url, storage_options)
    path = storage.join(root, name)
    try:
        raw = storage.read_bytes(fs, path)
    except FileNotFoundError:
        raise ManifestError(f"{url}: no {MANIFEST} (not a shard set, or its build did not finish)") from None
    except PermissionError as exc:
        raise PermissionError(
            f"{url}: access denied reading {MANIFEST} ({_first_line(exc)}); check the credentials "
            "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or storage_options)"
        ) from None
    return parse(raw, path, compact=compact)


def parse(raw: bytes, where: str, allow_empty: bool = False, compact: bool = False) -> Manifest:
    """Bytes of a manifest file -> a checked Manifest (any failure is a ManifestError naming ``where``)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(where, None, f"{len(raw)} bytes: too large for a manifest")
    try:
        data = json.loads(raw, object_hook=_compact_hook(where) if compact else None)
    except json.JSONDecodeError as exc:
        raise ManifestError(where, None, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except UnicodeDecodeError:
        raise ManifestError(where, None, "not valid JSON (not UTF-8 text)") from None
    except RecursionError:
        raise ManifestError(where, None, "not valid JSON (nested too deeply)") from None
    m = Manifest.from_json(data, where=where, allow_empty=allow_empty, compact=compact)
    del data
    return dataclasses.replace(m, identity=hashlib.sha256(raw).hexdigest())
