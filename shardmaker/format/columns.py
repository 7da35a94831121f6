"""Compact columns of a manifest: member names of an index, where each member of a foreign shard is,
and sample keys held in one bytes array."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from shardmaker.format.schema import (
    BLOCK,
    MANIFEST,
    MEMBER_CODECS,
    MEMBER_NAME,
    XXH3,
    ManifestError,
    codec_of,
    int_field,
    list_field,
)


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
    def from_json(cls, d: Any, where: str = MANIFEST, hr_only: bool = False) -> MemberNames:
        """``hr_only``: an index of HR files alone may name no LR member."""
        if type(d) is not dict or set(d) != {"hr", "lr"} or type(d["lr"]) is not dict or not (d["lr"] or hr_only):
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
        offsets = list_field(d["offsets"], where, f"{field}.offsets", samples)
        lengths = list_field(d["bytes"], where, f"{field}.bytes", samples)
        digests = list_field(d["xxh3_64"], where, f"{field}.xxh3_64", samples)
        for i in range(samples):
            o = int_field(offsets[i], where, f"{field}.offsets[{i}]", 0, size - BLOCK)
            n = int_field(lengths[i], where, f"{field}.bytes[{i}]", BLOCK, size)
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
