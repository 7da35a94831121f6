"""A sample's member digests (``sha256`` and ``xxh3_64`` in ``{key}.json``) and the one check of
members against them (:func:`check_digests`), with one wording, for every reader."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import xxhash

from shardmaker.errors import ShardmakerError, brief
from shardmaker.format.schema import SHA256, XXH3


class SampleHeaderError(ShardmakerError, ValueError):
    """A ``{key}.json`` that breaks the schema, or members that do not match its digests:
    ``shard``, ``key`` and ``reason``. ``foreign``: not a JSON object with digests at all (another
    tool's json, which ``wdsr.wds`` leaves alone)."""

    def __init__(self, shard: str, key: str | None, reason: str, foreign: bool = False) -> None:
        super().__init__(f"{shard} key {key!r}: {reason}" if key is not None else f"{shard}: {reason}")
        self.shard, self.key, self.reason, self.foreign = shard, key, reason, foreign

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # survive the trip from a worker process
        return (type(self), (self.shard, self.key, self.reason, self.foreign))


class DigestAlgorithm(str, enum.Enum):
    """The digests a header records for every member: xxh3_64 (~40 GB/s, corruption) and sha256 (tampering)."""

    XXH3_64 = "xxh3_64"
    SHA256 = "sha256"


_HEX = {DigestAlgorithm.SHA256: SHA256, DigestAlgorithm.XXH3_64: XXH3}


def digest_of(data: Any, algorithm: DigestAlgorithm | str) -> str:
    """The hex digest of a member's bytes."""
    if DigestAlgorithm(algorithm) is DigestAlgorithm.XXH3_64:
        return xxhash.xxh3_64_hexdigest(data)
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class Digests:
    """Each member's digests, by member suffix (``hr.png``): sha256 always, xxh3_64 since writer revision 3."""

    sha256: dict[str, str]
    xxh3_64: dict[str, str] | None = None

    def __post_init__(self) -> None:
        for algo in DigestAlgorithm:
            got = getattr(self, algo.value)
            if got is None and algo is DigestAlgorithm.XXH3_64:
                continue
            if type(got) is not dict or len(got) > 1 << 16:
                raise ValueError(f"{algo.value} must be an object of member digests, got {brief(got)}")
            for name, digest in got.items():
                if type(name) is not str or type(digest) is not str or not _HEX[algo].fullmatch(digest):
                    raise ValueError(f"{algo.value} must map member names to hex digests, got {brief(name)}: {brief(digest)}")

    @classmethod
    def of(cls, members: Mapping[str, bytes]) -> Digests:
        """Both digests of every member (what the build records)."""
        return cls(*({n: digest_of(d, a) for n, d in members.items()} for a in (DigestAlgorithm.SHA256, DigestAlgorithm.XXH3_64)))

    def get(self, algorithm: DigestAlgorithm | str) -> dict[str, str] | None:
        return getattr(self, DigestAlgorithm(algorithm).value)  # type: ignore[no-any-return]


def check_digests(
    digests: Digests, members: Mapping[str, Any], names: Iterable[str], algorithm: DigestAlgorithm | str, shard: str, key: str
) -> None:
    """The members ``names`` against their recorded ``algorithm`` digests (``"xxh3_64"`` or
    ``"sha256"``; a header without xxh3_64, from an older build, is checked by sha256): the one
    check, with one wording (``... does not match its sha256 in {key}.json``)."""
    algo = DigestAlgorithm(algorithm)
    if digests.get(algo) is None:
        algo = DigestAlgorithm.SHA256
    for name in names:
        check_digest(digests, name, digest_of(members[name], algo), algo, shard, key)


def check_digest(digests: Digests, name: str, got: str, algorithm: DigestAlgorithm | str, shard: str, key: str) -> None:
    """One member's digest ``got`` (hashed by the caller, e.g. while streaming a member read by range)
    against the header's: the same check and wording as :func:`check_digests`."""
    algo = DigestAlgorithm(algorithm)
    if got != (digests.get(algo) or {}).get(name):
        raise SampleHeaderError(shard, key, f"{name} does not match its {algo.value} in {key}.json (corrupt shard)")
