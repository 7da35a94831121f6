"""The one encoder of a sample into tar bytes, for image and clip samples alike: ``{key}.json`` (the
header, its digests made here from the members) first, then each member in the order given."""

from __future__ import annotations

import dataclasses

from shardmaker.format import JSON_MEMBER, Digests, SampleHeader, tario


@dataclasses.dataclass(frozen=True)
class EncodedSample:
    key: str
    tar_bytes: bytes  # the sample's tar members, ready to append to a shard
    hr_size: tuple[int, int]
    tiles: int = 0  # HR tile side; 0: stored whole


def pack_sample(header: SampleHeader, members: dict[str, bytes]) -> EncodedSample:
    """``header`` (its ``digests`` replaced by those of ``members``) and ``members`` (suffix -> bytes)
    as the sample's tar members: ``{key}.json``, then ``{key}.{suffix}`` for each member."""
    header = dataclasses.replace(header, digests=Digests.of(members))
    parts = [tario.member_bytes(f"{header.key}.{JSON_MEMBER}", header.encode())]
    parts += [tario.member_bytes(f"{header.key}.{name}", data) for name, data in members.items()]
    return EncodedSample(header.key, b"".join(parts), header.hr_size, header.tiles or 0)
