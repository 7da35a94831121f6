"""The ``manifest.json`` of a shard set (format ``wdsr-shards/1``): the dataset's commit marker."""
from __future__ import annotations

import dataclasses
import json
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
    """A manifest that is missing, unreadable or inconsistent."""


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    name: str
    samples: int
    bytes: int
    sha256: str
    keys: list[str]
    offsets: list[int]
    hr_sizes: list[list[int]]

    def __post_init__(self) -> None:
        n = self.samples
        if not (len(self.keys) == len(self.offsets) == len(self.hr_sizes) == n):
            raise ManifestError(
                f"shard {self.name}: samples={n} but {len(self.keys)} keys, "
                f"{len(self.offsets)} offsets, {len(self.hr_sizes)} hr_sizes"
            )
        if any(b <= a for a, b in zip(self.offsets, self.offsets[1:])) or (n and self.offsets[0] != 0):
            raise ManifestError(f"shard {self.name}: offsets must start at 0 and increase")
        if n and self.offsets[-1] >= self.bytes:
            raise ManifestError(f"shard {self.name}: last offset {self.offsets[-1]} beyond {self.bytes} bytes")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ShardInfo:
        try:
            return cls(
                name=str(d["name"]),
                samples=int(d["samples"]),
                bytes=int(d["bytes"]),
                sha256=str(d["sha256"]),
                keys=[str(k) for k in d["keys"]],
                offsets=[int(o) for o in d["offsets"]],
                hr_sizes=[[int(v) for v in s] for s in d["hr_sizes"]],
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"shard entry {d.get('name', '?')!r}: missing or bad field ({exc})") from None


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

    def dumps(self) -> bytes:
        return (json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n").encode()

    @classmethod
    def from_json(cls, d: dict[str, Any], where: str = MANIFEST) -> Manifest:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ManifestError(f"{where}: not a {FORMAT} manifest (format={d.get('format') if isinstance(d, dict) else None!r})")
        try:
            m = cls(
                codec=str(d["codec"]),
                scales=[int(s) for s in d["scales"]],
                lr_method=str(d["lr_method"]),
                shards=[ShardInfo.from_json(s) for s in d["shards"]],
                build=dict(d.get("build", {})),
            )
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"{where}: missing or bad field ({exc})") from None
        if int(d.get("samples", m.samples)) != m.samples or int(d.get("bytes", m.bytes)) != m.bytes:
            raise ManifestError(f"{where}: totals do not add up over the shards")
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
        raise PermissionError(f"{url}: access denied reading {MANIFEST} ({_first_line(exc)}); check the credentials "
                              "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or storage_options)") from None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc})") from None
    return Manifest.from_json(data, where=path)
