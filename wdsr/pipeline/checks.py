"""The checks every kind of sample passes before any decode: member digests (``Verify``), the
dataset's kind of image (``Kind``: channels and bit depth) and a pair's image headers.

Nothing here decodes pixels: a sample too large, of another kind or with a digest that does not
match is a SampleError naming shard and key before any decoder sees its bytes.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

import xxhash

from shardmaker import format as fmt
from shardmaker.format import Manifest
from wdsr.errors import SampleError
from wdsr.pipeline.read import RawSample


class Verify(str, enum.Enum):
    """How image members are checked against the digests in ``{key}.json`` before decoding."""

    NONE = "none"
    XXH3 = "xxh3_64"  # ~40 GB/s: catches corruption for ~1% of a QOI decode
    SHA256 = "sha256"  # ~2 GB/s: also catches deliberate tampering


def check_digests(
    shard: str,
    key: str,
    members: Mapping[str, Any],
    meta: Mapping[str, Any] | fmt.Digests,
    names: tuple[str, ...],
    verify: Verify,
) -> None:
    """The members ``names`` against their digests in ``{key}.json`` (``meta``: its JSON object, or its
    digests): ``shardmaker.format.check_digests``, its failures as a SampleError."""
    if verify is Verify.NONE:
        return
    try:
        if not isinstance(meta, fmt.Digests):
            meta = fmt.Digests(meta.get("sha256"), meta.get("xxh3_64"))  # type: ignore[arg-type]
        fmt.check_digests(meta, members, names, verify.value, shard, key)
    except fmt.SampleHeaderError as exc:
        raise SampleError(shard, key, exc.reason) from None
    except ValueError as exc:
        raise SampleError(shard, key, f"{key}.json: {exc}") from None


@dataclasses.dataclass
class Kind:
    """What every sample of a dataset (or of a mix: their batches are stacked) decodes to: channels
    and bit depth. Recorded in the manifest, it is checked from each sample's headers before any
    decode. What a manifest does not record is fixed by the first sample this process decodes (each
    DataLoader worker has its own copy): such a dataset's samples are checked only against each
    other, and in each worker against the first one it decoded (rebuild or re-index to record it)."""

    where: str  # the dataset (or the mix), for messages
    channels: int | None = None
    bit_depth: int | None = None
    recorded: bool = False  # both fields came from the manifest(s)
    fixed_by: str | None = None  # the key of the sample that fixed what was not recorded
    required_by: str | None = None  # what asked for this kind where the manifest does not say (e.g. "degrade=")

    @classmethod
    def of(cls, parts: Sequence[tuple[str, Manifest]]) -> Kind:
        """The kind of one dataset or a mix of them (``(folder, manifest)`` pairs); datasets whose
        manifests record different kinds cannot be mixed: a ValueError naming them, before any read."""
        where = f"the dataset {parts[0][0]}" if len(parts) == 1 else f"the mix of {len(parts)} datasets"
        found: dict[str, int | None] = {}
        for field in ("channels", "bit_depth"):
            values = {getattr(m, field) for _, m in parts} - {None}
            if len(values) > 1:
                kinds = "; ".join(f"{folder}: {fmt.kind_text(m.channels, m.bit_depth)}" for folder, m in parts)
                raise ValueError(
                    f"datasets of different kinds cannot be mixed (their batches would not stack): {kinds} "
                    "(convert one, or train on them apart)"
                )
            found[field] = values.pop() if values else None
        recorded = all(m.channels is not None and m.bit_depth is not None for _, m in parts)
        return cls(where, found["channels"], found["bit_depth"], recorded)

    def check(self, shard: str, key: str, name: str, head: fmt.ImageHeader) -> None:
        """A sample whose HR header is of another kind than the dataset's is a SampleError naming both."""
        if (self.channels is None or head.channels == self.channels) and (
            self.bit_depth is None or head.bit_depth == self.bit_depth
        ):
            return
        source = "as recorded" if self.fixed_by is None else f"as its first sample {self.fixed_by!r} decoded here was"
        if self.required_by is not None and not self.recorded:
            source = f"as {self.required_by} takes"
        raise SampleError(
            shard,
            key,
            f"{name} is {fmt.kind_text(head.channels, head.bit_depth)}, but {self.where} is "
            f"{fmt.kind_text(self.channels, self.bit_depth)} ({source}): a sample of another kind",
        )

    def fix(self, key: str, head: fmt.ImageHeader) -> None:
        """What the manifest does not record, from the first sample decoded (after it decoded well)."""
        if self.recorded or (self.channels is not None and self.bit_depth is not None):
            return
        self.channels = head.channels if self.channels is None else self.channels
        self.bit_depth = head.bit_depth if self.bit_depth is None else self.bit_depth
        self.fixed_by = key


def check_headers(
    shard: str,
    key: str,
    members: Mapping[str, Any],
    names: tuple[str, str],
    scale: int,
    max_pixels: int,
    hr_size: tuple[int, int] | None = None,
    kind: Kind | None = None,
) -> tuple[fmt.ImageHeader, fmt.ImageHeader]:
    """The one check before any decode of a pair: both headers readable (grey or RGB, 8 or 16 bits),
    HR of the size the manifest promised (``hr_size``) and at most ``max_pixels``, HR = ``scale`` x LR,
    HR and LR of one kind, and that the dataset's (``kind``). Failures are SampleErrors."""
    heads = []
    for name in names:
        try:
            heads.append(fmt.image_header(members[name], name))
        except fmt.HeaderError as exc:
            raise SampleError(shard, key, f"{name}: {exc}") from None
    try:
        fmt.check_pair(heads[0], heads[1], scale, hr_size, max_pixels)
    except fmt.HeaderError as exc:
        raise SampleError(shard, key, str(exc)) from None
    if kind is not None:
        kind.check(shard, key, names[0], heads[0])
    return heads[0], heads[1]


def check_indexed(raw: RawSample, meta: dict[str, Any], names: tuple[str, ...], verify: Verify) -> None:
    """The members ``names`` against their digests: ``{key}.json``'s (``meta``) in our shards, the
    manifest's xxh3_64 (``raw.digests``) in an index of foreign shards."""
    if raw.digests is None:
        check_digests(raw.shard, raw.key, raw.members, meta, names, verify)
        return
    if verify is Verify.NONE:
        return
    for name in names:  # a name without a digest here was checked as it was read (an index of files)
        if name in raw.digests and xxhash.xxh3_64_intdigest(raw.members[name]) != raw.digests[name]:
            raise SampleError(raw.shard, raw.key, f"{name} does not match its xxh3_64 in the index (shard changed or corrupt)")
