"""The ``manifest.json`` of a shard set (format ``wdsr-shards/1``): the dataset's commit marker."""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import json
import re
from typing import Any

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


PROBE_BYTES = 1 << 20
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


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    name: str
    samples: int
    bytes: int
    sha256: str
    keys: list[str]
    offsets: list[int]
    hr_sizes: list[list[int]]
    probe: str | None = None  # probe_of(first MiB, last MiB); absent in manifests of older builds

    def __post_init__(self) -> None:
        n = self.samples
        if not (len(self.keys) == len(self.offsets) == len(self.hr_sizes) == n):
            raise ManifestError(
                f"shard {self.name}: samples={n} but {len(self.keys)} keys, "
                f"{len(self.offsets)} offsets, {len(self.hr_sizes)} hr_sizes"
            )
        if any(b <= a for a, b in zip(self.offsets, self.offsets[1:], strict=False)) or (n and self.offsets[0] != 0):
            raise ManifestError(f"shard {self.name}: offsets must start at 0 and increase")
        if n and self.offsets[-1] >= self.bytes:
            raise ManifestError(f"shard {self.name}: last offset {self.offsets[-1]} beyond {self.bytes} bytes")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["probe"] is None:
            del d["probe"]
        return d

    @classmethod
    def from_json(cls, d: Any, where: str = MANIFEST, field: str = "shard") -> ShardInfo:
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
        keys = _list(d["keys"], where, f"{f}.keys", samples)
        for i, k in enumerate(keys):
            if not isinstance(k, str) or not KEY.fullmatch(k):
                raise ManifestError(
                    where, f"{f}.keys[{i}]", "must be a relative path without dots, control characters or empty segments"
                )
        offsets = _list(d["offsets"], where, f"{f}.offsets", samples)
        prev = -1
        for i, o in enumerate(offsets):
            _int(o, where, f"{f}.offsets[{i}]", 0, size - 1)
            if o % 512 or o <= prev or (i == 0 and o != 0):
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
        return cls(name, samples, size, digest, list(keys), list(offsets), [list(wh) for wh in sizes], probe)


@dataclasses.dataclass(frozen=True)
class Manifest:
    codec: str
    scales: list[int]
    lr_method: str
    shards: list[ShardInfo]
    build: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "codec": self.codec,
            "scales": list(self.scales),
            "lr_method": self.lr_method,
            "samples": self.samples,
            "bytes": self.bytes,
            "build": self.build,
            "shards": [s.to_json() for s in self.shards],
        }

    def dumps(self) -> builtins.bytes:  # the property `bytes` above shadows the type in this class
        return (json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n").encode()

    @classmethod
    def from_json(cls, d: Any, where: str = MANIFEST, allow_empty: bool = False) -> Manifest:
        """A whole manifest, checked against the schema; ``allow_empty`` for part manifests."""
        if type(d) is not dict or d.get("format") != FORMAT:
            got = d.get("format") if type(d) is dict else None
            raise ManifestError(where, "format", f"not a {FORMAT} manifest (format={got if isinstance(got, str) else None!r})")
        for k in ("codec", "scales", "lr_method", "shards"):
            if k not in d:
                raise ManifestError(where, k, "missing")
        codec = _str(d["codec"], where, "codec")
        if codec not in CODECS:
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
        build = d.get("build", {})
        if type(build) is not dict:
            raise ManifestError(where, "build", "must be an object")
        raw_shards = _list(d["shards"], where, "shards")
        if not raw_shards and not allow_empty:
            raise ManifestError(where, "shards", "no shards: an empty dataset")
        shards = [ShardInfo.from_json(x, where, f"shards[{i}]") for i, x in enumerate(raw_shards)]
        names, keys = set(), set()
        for sh in shards:
            if sh.name in names:
                raise ManifestError(where, "shards", f"shard {sh.name} is listed twice")
            names.add(sh.name)
            for k in sh.keys:
                if k in keys:
                    raise ManifestError(where, f"shards ({sh.name}).keys", f"key {k!r} appears twice in the dataset")
                keys.add(k)
        m = cls(codec, list(scales), lr_method, shards, dict(build))
        for total in ("samples", "bytes"):
            if total in d and (type(d[total]) is not int or d[total] != getattr(m, total)):
                raise ManifestError(where, total, "does not add up over the shards")
        return m


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def load(url: str, storage_options: dict[str, Any] | None = None) -> Manifest:
    """Read ``URL/manifest.json`` (URL is the dataset folder)."""
    fs, root = storage.open_dir(url, storage_options)
    path = storage.join(root, MANIFEST)
    try:
        raw = storage.read_bytes(fs, path)
    except FileNotFoundError:
        raise ManifestError(f"{url}: no {MANIFEST} (not a shard set, or its build did not finish)") from None
    except PermissionError as exc:
        raise PermissionError(
            f"{url}: access denied reading {MANIFEST} ({_first_line(exc)}); check the credentials "
            "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or storage_options)"
        ) from None
    return parse(raw, path)


def parse(raw: bytes, where: str, allow_empty: bool = False) -> Manifest:
    """Bytes of a manifest file -> a checked Manifest (any failure is a ManifestError naming ``where``)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(where, None, f"{len(raw)} bytes: too large for a manifest")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ManifestError(where, None, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except UnicodeDecodeError:
        raise ManifestError(where, None, "not valid JSON (not UTF-8 text)") from None
    except RecursionError:
        raise ManifestError(where, None, "not valid JSON (nested too deeply)") from None
    return Manifest.from_json(data, where=where, allow_empty=allow_empty)
