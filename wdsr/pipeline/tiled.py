"""Tiled samples (``{key}.hr.tiles``, ``{key}.lr_x{s}.tiles``): checked from their headers and tile
indexes, then handed on as lazily decoded images, so a sample's patches decode only the tiles they
touch (each once per sample).

Patch positions are the same function of (seed, epoch, key, j) as for whole images and the pixels
are the same, so a dataset stored tiled gives the batches it gives untiled, byte for byte. Digests:
``verify="xxh3_64"`` checks each tile's xxh3_64 from the member's index as the tile is decoded;
``"sha256"`` checks the whole members against ``{key}.json`` first (reading every byte, as asked).

Members come in memory, read by range from a local file (``read.FileMember``) or from an object
store (``remote.RangePart``: each read a request, so its tiles are fetched as the patch stage
announces them, ``DecodedPair.prefetch``, and every tile is checked as it arrives, not up front).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from shardmaker import format as fmt
from shardmaker.format import JSON_MEMBER, TILED, Manifest, hr_member, lr_member, pair_fits
from shardmaker.imaging import TiledImage, read_layout
from wdsr.errors import SampleError
from wdsr.pipeline.checks import Verify
from wdsr.pipeline.read import RawSample
from wdsr.pipeline.sample import DecodeSpec, Hr, LrMode, SampleKind, is_clip_dataset
from wdsr.pipeline.whole import DecodedPair, image_options

HR_TILED = hr_member(TILED)


def is_tiled(raw: RawSample) -> bool:
    """Our shards' sample stored as tiled members (an index of foreign shards never is)."""
    return raw.digests is None and HR_TILED in raw.members


def tiled_pair(raw: RawSample, meta: dict[str, Any], spec: DecodeSpec) -> DecodedPair:
    """The sample's HR and x``scale`` LR as :class:`TiledImage` (HR viewed cropped to exactly
    ``scale`` x LR), every header, index and pairing rule checked first; failures are SampleErrors."""
    t0 = time.perf_counter_ns()
    scale, kind = spec.scale, spec.kind
    names = (HR_TILED, lr_member(scale, TILED))

    def fail(reason: str) -> SampleError:
        return SampleError(raw.shard, raw.key, reason)

    if names[1] not in raw.members:
        raise fail(f"no {names[1]} member (this sample has scales {fmt_scales(meta)})")
    layouts = []
    for name in names:
        try:
            layouts.append(read_layout(raw.members[name]))  # of a local shard's member: two small reads
        except fmt.TileFormatError as exc:
            raise fail(f"{name}: {exc}") from None
    (hr, _), (lr, _) = layouts
    if raw.hr_size is not None and (hr.width, hr.height) != tuple(raw.hr_size):
        raise fail(f"{names[0]} says {hr.width}x{hr.height}, the manifest says {raw.hr_size[0]}x{raw.hr_size[1]}")
    if not pair_fits((hr.height, hr.width), (lr.height, lr.width), scale):
        raise fail(f"HR {hr.width}x{hr.height} is not {scale} x LR {lr.width}x{lr.height} (wrong scale?)")
    if hr.tile % scale or lr.tile != hr.tile // scale:
        raise fail(f"LR tiles of {lr.tile} px do not lie on the HR grid of {hr.tile} px at x{scale}")
    if (hr.channels, hr.bit_depth) != (lr.channels, lr.bit_depth):
        raise fail(f"HR is {hr.bit_depth}-bit x{hr.channels}, LR {lr.bit_depth}-bit x{lr.channels}")
    head = fmt.ImageHeader(hr.width, hr.height, hr.channels, hr.bit_depth)
    if kind is not None:
        kind.check(raw.shard, raw.key, names[0], head)
    per_tile = _check_tiles(raw, meta, names, layouts, Verify(spec.verify))
    hr_img = _Tiles(raw, names[0], layouts[0], (scale * lr.height, scale * lr.width), per_tile)
    lr_img = _Tiles(raw, names[1], layouts[1], None, per_tile)
    if kind is not None:
        kind.fix(raw.key, head)
    return DecodedPair(raw.shard, raw.key, raw.rep, hr_img, lr_img, 0, time.perf_counter_ns() - t0)  # type: ignore[arg-type]


def tiled_hr(raw: RawSample, meta: dict[str, Any], spec: DecodeSpec) -> Hr:
    """The sample's tiled HR alone (LR made from it: ``lr="bicubic"``, ``degrade=``), its header,
    index and tiles checked as :func:`tiled_pair` checks them."""
    t0 = time.perf_counter_ns()
    names, kind = (HR_TILED,), spec.kind
    try:
        layouts = [read_layout(raw.members[HR_TILED])]
    except fmt.TileFormatError as exc:
        raise SampleError(raw.shard, raw.key, f"{HR_TILED}: {exc}") from None
    hr = layouts[0][0]
    if raw.hr_size is not None and (hr.width, hr.height) != tuple(raw.hr_size):
        raise SampleError(
            raw.shard, raw.key, f"{HR_TILED} says {hr.width}x{hr.height}, the manifest says {raw.hr_size[0]}x{raw.hr_size[1]}"
        )
    head = fmt.ImageHeader(hr.width, hr.height, hr.channels, hr.bit_depth)
    if kind is not None:
        kind.check(raw.shard, raw.key, HR_TILED, head)
    per_tile = _check_tiles(raw, meta, names, layouts, Verify(spec.verify))
    img = _Tiles(raw, HR_TILED, layouts[0], None, per_tile)
    if kind is not None:
        kind.fix(raw.key, head)
    if img.shape[0] * img.shape[1] > spec.max_pixels:
        raise SampleError(raw.shard, raw.key, f"HR of {img.shape[1]}x{img.shape[0]} pixels is over max_pixels={spec.max_pixels}")
    return Hr(img, 0, time.perf_counter_ns() - t0)


def _check_tiles(raw: RawSample, meta: dict[str, Any], names: tuple[str, ...], layouts: list[Any], verify: Verify) -> bool:
    """Members ``names`` checked before any tile is decoded (sha256: whole; in memory or read from
    a local file: every tile's header, in memory its digest too); whether tiles are checked as read."""

    def fail(reason: str) -> SampleError:
        return SampleError(raw.shard, raw.key, reason)

    if verify is Verify.SHA256:
        digests = fmt.Digests(meta.get("sha256") or {}, meta.get("xxh3_64"))
        for name in names:
            try:
                fmt.check_digest(digests, name, _sha256(raw.members[name]), "sha256", raw.shard, raw.key)
            except fmt.SampleHeaderError as exc:
                raise fail(exc.reason) from None
    per_tile = verify is Verify.XXH3
    for name, (h, index) in zip(names, layouts, strict=True):
        member: Any = raw.members[name]
        in_memory = isinstance(member, (bytes, bytearray, memoryview))
        if _requested(member):
            continue  # a request per read: every tile is checked as it arrives, before its decode
        try:  # every tile's header (~1 us; read by range: its first bytes alone) before any decode; in memory
            for i in range(h.count):  # also its digest (read by range: as each tile is read, before its decode)
                if in_memory:
                    fmt.tiles.check_tile(h, i, fmt.tiles.tile_view(member, h, index, i, per_tile))
                else:
                    off, n, _, _ = index.item(i)
                    fmt.tiles.check_tile(h, i, member.read(off, min(n, fmt.tiles.TILE_HEAD_BYTES)))
        except (fmt.TileFormatError, OSError) as exc:
            raise fail(f"{name}: {exc}") from None
    return per_tile


class _Tiles(TiledImage):
    """A sample's tiled member whose tile errors name shard, key, member and tile. In memory (a
    small remote sample) its tiles were checked when the sample was read, so only data that passes
    those checks and still does not decode (crafted, or ``verify="none"``) fails here; read by range
    (a local shard, the shard cache, a large remote sample), each tile is checked as it is read.
    Either way the failure comes as the patches are cut, and the stream puts it to ``on_error``
    (``TrainStream._usable``: the whole sample is skipped, or the error raised)."""

    def __init__(self, raw: RawSample, name: str, layout: Any, shape_hw: tuple[int, int] | None, verify: bool) -> None:
        member = raw.members[name]
        # in memory, every tile was checked already; read by range, each is checked (digest too) as it is read
        super().__init__(member, layout, shape_hw, verify and not isinstance(member, (bytes, bytearray, memoryview)))
        self._where = (raw.shard, raw.key, name)

    def take_reads(self) -> tuple[int, int]:
        """Bytes read for this member's tiles (and ns waited for them) since the last call."""
        take = getattr(self._member, "take", None)
        return take() if take is not None else (0, 0)

    def tile(self, i: int) -> Any:
        try:
            return super().tile(i)
        except fmt.TileFormatError as exc:
            shard, key, name = self._where
            raise SampleError(shard, key, f"{name}: {exc}") from None


def _requested(member: Any) -> bool:
    """A member whose every read is a request to an object store (it can be told what to fetch)."""
    return hasattr(member, "prefetch")


def _sha256(member: Any) -> str:
    if isinstance(member, (bytes, bytearray, memoryview)):
        return hashlib.sha256(member).hexdigest()
    if _requested(member):
        member.prefetch([(0, len(member))])  # read whole (kept: the tiles are read from it after)
    h = hashlib.sha256()
    for at in range(0, len(member), 1 << 22):
        h.update(member.read(at, min(1 << 22, len(member) - at)))
    return h.hexdigest()


def fmt_scales(meta: dict[str, Any]) -> str:
    return repr(meta.get("scales"))


def _members(m: Manifest, scale: int, lr: LrMode) -> frozenset[str]:
    if m.members is not None:  # an index of foreign shards: never tiled
        return frozenset()
    return frozenset({JSON_MEMBER, HR_TILED} if lr.made else {JSON_MEMBER, HR_TILED, lr_member(scale, TILED)})


KIND = SampleKind(
    name="tiled",
    what="an image dataset",
    plural="images",
    claims=is_tiled,
    holds=lambda m: m.members is None and not is_clip_dataset(m),
    members=_members,
    pair=tiled_pair,
    options=image_options,
    hr=tiled_hr,
)
