"""The ``manifest.json`` of a shard set (format ``wdsr-shards/1``): the dataset's commit marker.

The schema's rules are in :mod:`.schema`, the compact columns in :mod:`.columns`; both are
re-exported here."""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardmaker.format.columns import KeyColumn, MemberColumns, MemberNames
from shardmaker.format.files import FileColumns, FileRoots
from shardmaker.format.schema import (
    BLOCK,
    CODECS,
    FORMAT,
    INDEX_KEY,
    JSON_MEMBER,
    KEY,
    LR_METHODS,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    MAX_SAMPLES,
    MAX_SHARD_BYTES,
    MAX_SIDE,
    MEMBER_CODECS,
    MEMBER_NAME,
    MIXED,
    PROBE_BYTES,
    SHA256,
    SHARD_NAME,
    XXH3,
    ManifestError,
    check_shard_name,
    codec_of,
    hr_member,
    int_field,
    key_problem,
    list_field,
    lr_member,
    pair_fits,
    probe_file,
    probe_of,
    sample_members,
    shard_path,
    str_field,
)
from shardmaker.format.tiles import MAX_TILE, MIN_TILE

__all__ = [
    "BLOCK",
    "CODECS",
    "FORMAT",
    "INDEX_KEY",
    "JSON_MEMBER",
    "KEY",
    "KeyColumn",
    "OTHER_REASONS",
    "LR_METHODS",
    "MANIFEST",
    "MAX_MANIFEST_BYTES",
    "MAX_SAMPLES",
    "MAX_SHARD_BYTES",
    "MAX_SIDE",
    "MEMBER_CODECS",
    "MEMBER_NAME",
    "MIXED",
    "Manifest",
    "ManifestError",
    "MemberColumns",
    "MemberNames",
    "PROBE_BYTES",
    "SHA256",
    "SHARD_NAME",
    "SKIP_EXAMPLES",
    "SKIP_LOGGED",
    "ShardInfo",
    "Skips",
    "XXH3",
    "check_shard_name",
    "codec_of",
    "hr_member",
    "int_field",
    "key_problem",
    "kind_text",
    "list_field",
    "lr_member",
    "pair_fits",
    "parse",
    "probe_file",
    "probe_of",
    "reason_class",
    "sample_members",
    "shard_path",
    "str_field",
]


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
    # each sample's HR tile side (0: stored whole); None: no sample of the shard is tiled
    tiles: Sequence[int] | None = None
    files: dict[str, FileColumns] | None = None  # an index of image files (format.files): a group, each member's files

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
        if self.tiles is not None and len(self.tiles) != n:
            raise ManifestError(f"shard {self.name}: samples={n} but {len(self.tiles)} tiles")
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
        if self.tiles is not None:
            d["tiles"] = [int(t) for t in self.tiles]
        if self.files is not None:
            d["files"] = {name: cols.to_json() for name, cols in self.files.items()}
        return d

    @classmethod
    def of_columns(cls, *fields: Any) -> ShardInfo:
        """An entry over columns a reader has already checked as a whole (the column index,
        :mod:`.colread`): the fields in declaration order, without :meth:`__post_init__`'s per-shard
        passes, which at 40k shards would cost more than the whole index's checks."""
        info = object.__new__(cls)
        info.__dict__.update(zip(_SHARD_INFO_FIELDS, fields, strict=True))  # frozen: no __setattr__ of ours
        return info

    def tiled(self, i: int) -> int:
        """Sample ``i``'s HR tile side, 0 when it is stored whole."""
        return 0 if self.tiles is None else int(self.tiles[i])

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
        samples = int_field(d["samples"], where, f"{f}.samples", 1, MAX_SAMPLES)
        size = int_field(d["bytes"], where, f"{f}.bytes", 1024, MAX_SHARD_BYTES)
        digest = str_field(d["sha256"], where, f"{f}.sha256")
        if not SHA256.fullmatch(digest):
            raise ManifestError(where, f"{f}.sha256", "must be 64 lowercase hex digits")
        indexed = "members" in d
        if indexed and "files" in d:
            raise ManifestError(where, f"{f}.files", "a group of files has no tar members")
        keys = list_field(d["keys"], where, f"{f}.keys", samples)
        for i, k in enumerate(keys):
            why = key_problem(k, dots=indexed)
            if why is not None:
                raise ManifestError(where, f"{f}.keys[{i}]", f"a key {why}")
        offsets = list_field(d["offsets"], where, f"{f}.offsets", samples)
        prev = -1
        for i, o in enumerate(offsets):
            int_field(o, where, f"{f}.offsets[{i}]", 0, size - 1)
            if o % 512 or o <= prev or (i == 0 and o != 0 and not indexed):
                raise ManifestError(
                    where, f"{f}.offsets[{i}]", "offsets must start at 0, increase, and be multiples of 512 (tar blocks)"
                )
            prev = o
        sizes = list_field(d["hr_sizes"], where, f"{f}.hr_sizes", samples)
        for i, wh in enumerate(sizes):
            list_field(wh, where, f"{f}.hr_sizes[{i}]", 2)
            for j in (0, 1):
                int_field(wh[j], where, f"{f}.hr_sizes[{i}][{j}]", 1, MAX_SIDE)
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
        tiles = None
        if "tiles" in d:
            if indexed:
                raise ManifestError(where, f"{f}.tiles", "an index of foreign shards has no tiled samples")
            tiles = list_field(d["tiles"], where, f"{f}.tiles", samples)
            for i, t in enumerate(tiles):
                if type(t) is not int or not (t == 0 or MIN_TILE <= t <= MAX_TILE):
                    raise ManifestError(where, f"{f}.tiles[{i}]", f"must be 0 (whole) or a tile side in [{MIN_TILE}, {MAX_TILE}]")
        files = None
        if "files" in d:
            if type(d["files"]) is not dict or not d["files"]:
                raise ManifestError(where, f"{f}.files", "must be an object: member name -> file columns")
            files = {}
            for mname, cols in d["files"].items():
                if not isinstance(mname, str) or not MEMBER_NAME.fullmatch(mname):
                    raise ManifestError(where, f"{f}.files", f"{mname!r} is not a member name")
                files[mname] = FileColumns.from_json(cols, where, f"{f}.files.{mname}", samples)
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
                None if tiles is None else np.asarray(tiles, dtype=np.uint16),  # type: ignore[arg-type]
                files,
            )
        return cls(
            name, samples, size, digest, list(keys), list(offsets), [list(wh) for wh in sizes], probe, members, tiles, files
        )


_SHARD_INFO_FIELDS = tuple(f.name for f in dataclasses.fields(ShardInfo))


@dataclasses.dataclass(frozen=True)
class Manifest:
    codec: str
    scales: list[int]
    lr_method: str
    shards: Sequence[ShardInfo]  # a list, or the column index's table (entries made on access)
    build: dict[str, Any] = dataclasses.field(default_factory=dict)
    identity: str | None = dataclasses.field(default=None, compare=False)  # sha256 of the file it was read from
    members: MemberNames | None = None  # an index of foreign shards (shardmaker index); None: our own shards
    # what every sample decodes to: 1 (grey) or 3 (RGB) channels, 8 or 16 bits; None: not recorded
    # (manifests written before these fields), checked per sample at decode time instead
    channels: int | None = None
    bit_depth: int | None = None
    files: FileRoots | None = None  # an index of image files in place (shardmaker index DIR): where they are

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
        totals = getattr(self.shards, "totals", None)  # the column index's table: without making every entry
        return int(totals[0]) if totals is not None else sum(s.samples for s in self.shards)

    @property
    def bytes(self) -> int:
        totals = getattr(self.shards, "totals", None)
        return int(totals[1]) if totals is not None else sum(s.bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        d = self.top_json()
        d["shards"] = [s.to_json() for s in self.shards]
        return d

    def top_json(self) -> dict[str, Any]:
        """The manifest's fields but its shards (what the column index's header holds)."""
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
        if self.channels is not None:
            d["channels"] = self.channels
        if self.bit_depth is not None:
            d["bit_depth"] = self.bit_depth
        if self.files is not None:
            d["files"] = self.files.to_json()
        return d

    def dumps(self) -> builtins.bytes:  # the property `bytes` above shadows the type in this class
        return (json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n").encode()

    @classmethod
    def from_json(cls, d: Any, where: str = MANIFEST, allow_empty: bool = False, compact: bool = False) -> Manifest:
        """A whole manifest, checked against the schema; ``allow_empty`` for part manifests."""
        top = top_fields(d, where)
        if "shards" not in d:
            raise ManifestError(where, "shards", "missing")
        build, members = top["build"], top["members"]
        raw_shards = list_field(d["shards"], where, "shards")
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
            if top["files"] is not None or sh.files is not None:
                if top["files"] is None or sh.members is not None or set(sh.files or ()) != want:
                    raise ManifestError(
                        where,
                        f"shards[{i}] ({sh.name}).files",
                        f"an index of files lists exactly the members {sorted(want or [])}",
                    )
            elif (sh.members is None) != (want is None) or (sh.members is not None and set(sh.members) != want):
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
        m = cls(shards=shards, **top)
        check_totals(m, d, where)
        return m


def check_totals(m: Manifest, d: dict[str, Any], where: str) -> None:
    """The top-level ``samples`` and ``bytes``, when given, are the sums over the shards."""
    for total in ("samples", "bytes"):
        if total in d and (type(d[total]) is not int or d[total] != getattr(m, total)):
            raise ManifestError(where, total, "does not add up over the shards")


def top_fields(d: Any, where: str) -> dict[str, Any]:
    """The top-level fields of a manifest (all but its shards), checked: ``Manifest``'s keyword
    arguments (the JSON reader's and the column index's)."""
    if type(d) is not dict or d.get("format") != FORMAT:
        got = d.get("format") if type(d) is dict else None
        raise ManifestError(where, "format", f"not a {FORMAT} manifest (format={got if isinstance(got, str) else None!r})")
    for k in ("codec", "scales", "lr_method"):
        if k not in d:
            raise ManifestError(where, k, "missing")
    files = FileRoots.from_json(d["files"], where) if "files" in d else None
    if files is not None and "members" not in d:
        raise ManifestError(where, "members", "an index of files names its members")
    members = MemberNames.from_json(d["members"], where, hr_only=files is not None) if "members" in d else None
    mixed = [n for n in members.names() if codec_of(n) == MIXED] if members is not None else []
    if mixed and (files is None or files.version < 3):
        raise ManifestError(where, "members", f"{mixed[0]!r}: a side of mixed formats is only in an index of files (version 3)")
    codec = str_field(d["codec"], where, "codec")
    if members is not None and codec != codec_of(members.hr):
        raise ManifestError(where, "codec", f"must be the HR member's extension, {codec_of(members.hr)!r}")
    if members is None and codec not in CODECS:
        raise ManifestError(where, "codec", f"must be one of {', '.join(CODECS)}")
    scales = list_field(d["scales"], where, "scales")
    if not scales and d.get("lr_method") != "none":
        raise ManifestError(where, "scales", "must not be empty (an HR-only dataset has lr_method none)")
    if scales and d.get("lr_method") == "none":
        raise ManifestError(where, "scales", "must be empty for an HR-only dataset (lr_method none)")
    for i, s in enumerate(scales):
        int_field(s, where, f"scales[{i}]", 2, 16)
    if scales != sorted(set(scales)):
        raise ManifestError(where, "scales", "must be increasing, without repeats")
    lr_method = str_field(d["lr_method"], where, "lr_method")
    if lr_method not in LR_METHODS:
        raise ManifestError(where, "lr_method", f"must be one of {', '.join(LR_METHODS)}")
    if members is not None and (sorted(members.lr) != scales or lr_method != ("provided" if members.lr else "none")):
        raise ManifestError(where, "members", "an index names one LR member per scale, and its lr_method is 'provided'")
    if files is not None and sorted(files.lr) != scales:
        raise ManifestError(where, "files.lr", "must name one root per scale")
    build = d.get("build", {})
    if type(build) is not dict:
        raise ManifestError(where, "build", "must be an object")
    channels, depth = _kind_field(d, "channels", where), _kind_field(d, "bit_depth", where)
    return {
        "codec": codec,
        "scales": list(scales),
        "lr_method": lr_method,
        "build": dict(build),
        "members": members,
        "channels": channels,
        "bit_depth": depth,
        "files": files,
    }


KINDS = {"channels": (1, 3), "bit_depth": (8, 16)}  # what a sample may decode to


def kind_text(channels: int | None, bit_depth: int | None) -> str:
    """``8-bit RGB``, ``16-bit grey``: a dataset's or a sample's kind in a message (``?`` for what
    is not known, "of a kind not recorded" when neither is)."""
    if channels is None and bit_depth is None:
        return "of a kind not recorded"
    name = "?" if channels is None else {1: "grey", 3: "RGB"}.get(channels, f"{channels}-channel")
    return f"{'?' if bit_depth is None else bit_depth}-bit {name}"


# ---- build.skipped: what a build or an index left out, bounded ---------------------------------
SKIP_EXAMPLES = 100  # entries build.skipped lists by name; build.skipped_reasons counts them all
SKIP_LOGGED = 5  # warnings logged per reason; then one summary line per reason
SKIP_REASONS = 64  # reasons counted apart; the rest under OTHER_REASONS
OTHER_REASONS = "other reasons"
_PARTICULARS = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|\d+")


def reason_class(reason: str) -> str:
    """A skip reason without its particulars (numbers, quoted names): what skips are counted by."""
    return _PARTICULARS.sub("#", reason)[:200]


class Skips:
    """The record of what was skipped, bounded whatever the count: ``build.skipped`` (the first
    :data:`SKIP_EXAMPLES` entries), ``build.skipped_count`` and ``build.skipped_reasons`` (a count per
    reason class). Logs the first :data:`SKIP_LOGGED` of each reason; :meth:`summarise` the rest."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.count = 0
        self.reasons: dict[str, int] = {}
        self.first: list[dict[str, Any]] = []
        self._log = logger

    def add(self, entry: dict[str, Any], reason: str, where: str, logged: bool = True) -> None:
        """One more skip: ``entry`` as the manifest lists it, ``where`` (shard and key, or path) for the log."""
        self.count += 1
        c = reason_class(reason)
        if c not in self.reasons and len(self.reasons) >= SKIP_REASONS:
            c = OTHER_REASONS
        n = self.reasons[c] = self.reasons.get(c, 0) + 1
        if len(self.first) < SKIP_EXAMPLES:
            self.first.append(entry)
        if self._log is not None and logged and n <= SKIP_LOGGED:
            more = " (further skips for this reason are only counted)" if n == SKIP_LOGGED else ""
            self._log.warning("skipping %s: %s%s", where, reason, more)

    def summarise(self) -> None:
        """One line per reason skipped more often than was logged."""
        for c, n in self.reasons.items():
            if self._log is not None and n > SKIP_LOGGED:
                self._log.warning("skipped %d in all for: %s", n, c)

    def extend(self, build: dict[str, Any]) -> None:
        """Add another record's skips (a part manifest's ``build``; one before these fields: a plain list)."""
        listed = build.get("skipped", [])
        listed = listed if type(listed) is list else []
        count = build.get("skipped_count", len(listed))
        reasons = build.get("skipped_reasons")
        if type(reasons) is not dict:
            reasons = {}
            for x in listed:
                r = reason_class(str(x.get("reason", ""))) if type(x) is dict else OTHER_REASONS
                reasons[r] = reasons.get(r, 0) + 1
        self.count += count if type(count) is int and count >= 0 else len(listed)
        for c, n in reasons.items():
            c = c if c in self.reasons or len(self.reasons) < SKIP_REASONS else OTHER_REASONS
            self.reasons[c] = self.reasons.get(c, 0) + (n if type(n) is int and n > 0 else 0)
        self.first += listed[: SKIP_EXAMPLES - len(self.first)]

    def to_build(self) -> dict[str, Any]:
        """The fields of a manifest's ``build``."""
        return {"skipped": list(self.first), "skipped_count": self.count, "skipped_reasons": dict(self.reasons)}


DROP_EXAMPLES = 10_000  # dropped samples listed by key in a manifest; more are counted


class Dropped:
    """The record of samples ``--min-valid`` left out (flat background, nodata: not errors): the build's
    ``min_valid``, ``dropped`` (the first :data:`DROP_EXAMPLES`, each ``{key, source, valid}``) and
    ``dropped_count``. Absent from builds without ``--min-valid``."""

    def __init__(self, min_valid: float = 0.0) -> None:
        self.min_valid, self.count = min_valid, 0
        self.first: list[dict[str, Any]] = []

    def add(self, key: str | None, source: str, valid: float) -> None:
        self.count += 1
        if len(self.first) < DROP_EXAMPLES:
            self.first.append({"key": key, "source": source, "valid": valid})

    def extend(self, build: dict[str, Any]) -> None:
        """Add a part manifest's record."""
        listed = build.get("dropped", [])
        listed = listed if type(listed) is list else []
        count = build.get("dropped_count", len(listed))
        self.count += count if type(count) is int and count >= 0 else len(listed)
        self.first += listed[: DROP_EXAMPLES - len(self.first)]
        if isinstance(build.get("min_valid"), (int, float)):
            self.min_valid = build["min_valid"]

    def to_build(self) -> dict[str, Any]:
        if not self.min_valid and not self.count:
            return {}
        return {"min_valid": self.min_valid, "dropped": list(self.first), "dropped_count": self.count}


def _kind_field(d: dict[str, Any], key: str, where: str) -> int | None:
    v = d.get(key)
    if v is not None and (type(v) is not int or v not in KINDS[key]):
        raise ManifestError(where, key, f"must be one of {', '.join(map(str, KINDS[key]))}")
    return v


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
