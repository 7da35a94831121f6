"""Decode one sample's HR and requested LR image; check presence, sizes, kind, hashes.

Only ``{key}.json``, ``{key}.hr.{ext}`` and ``{key}.lr_x{s}.{ext}`` are ever decoded, and only
by image decoders (libspng/Pillow for PNG, QOI): nothing is unpickled. Every pair is checked from
its headers first (:func:`check_headers`: sizes, scale, ``max_pixels``, channels and depth against
the dataset's :class:`Kind`), by ``SRDataset`` and ``wdsr.wds`` alike, so nothing too large or of
another kind ever reaches a decoder.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xxhash

from shardmaker import format as fmt
from shardmaker import imaging
from shardmaker.format import JSON_MEMBER, TILED, Manifest, hr_member, lr_member, pair_fits
from shardmaker.imaging import ImageDataError
from wdsr.errors import SampleError
from wdsr.pipeline import bicubic, clips, tiled
from wdsr.pipeline.read import RawSample


@dataclasses.dataclass
class DecodedPair:
    shard: str
    key: str
    rep: int
    hr: np.ndarray  # HxW[xC], cropped to exactly scale x LR
    lr: np.ndarray
    decode_ns: int  # image decoding alone
    verify_ns: int  # checking member digests
    chw: bool = False  # planar C x H x W arrays (from the decoded cache), else H x W [x C]

    @property
    def lr_hw(self) -> tuple[int, int]:
        """LR (height, width), whatever the layout."""
        shape = self.lr.shape
        return (shape[1], shape[2]) if self.chw else (shape[0], shape[1])

    @property
    def tiled(self) -> bool:
        """HR and LR are lazily decoded tiled images (``shardmaker.imaging.TiledImage``), not arrays."""
        return not isinstance(self.hr, np.ndarray)

    def hwc(self) -> tuple[np.ndarray, np.ndarray]:
        """(HR, LR) as H x W [x C] arrays (views of planar ones; a tiled pair decoded whole)."""
        if self.tiled:
            return np.asarray(self.hr), np.asarray(self.lr)
        if not self.chw:
            return self.hr, self.lr
        return _hwc(self.hr), _hwc(self.lr)


def _hwc(a: np.ndarray) -> np.ndarray:
    return a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)


class _ClipMembers(frozenset):
    """The members of a clip sample that are read: json, and every frame's HR and x``scale`` LR."""

    scale = 0

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and clips.wanted(name, self.scale)


def clip_members(scale: int) -> frozenset[str]:
    got = _ClipMembers()
    got.scale = scale
    return got


def wanted_members(m: Manifest, scale: int, lr_mode: str = "stored") -> frozenset[str]:
    """The members a sample is read with: HR, the x``scale`` LR and (our shards) ``{key}.json``; of a
    clip dataset's sample, every frame's; with LR made per patch (``lr="bicubic"``), HR alone."""
    if is_clip_dataset(m):
        return clip_members(scale)
    if lr_mode != "stored":
        if m.members is not None:
            return frozenset({m.members.hr})
        return frozenset({JSON_MEMBER, hr_member(m.codec), hr_member(TILED)})
    hr, lr = m.member_names(scale)
    if m.members is not None:
        return frozenset({hr, lr})
    return frozenset({JSON_MEMBER, hr, lr, hr_member(TILED), lr_member(scale, TILED)})  # either kind of sample


def is_clip_dataset(m: Manifest) -> bool:
    """Built with ``shardmaker build --clips``: its samples are clip segments."""
    return m.members is None and isinstance(m.build.get("clips"), dict)


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


def _sample_json(raw: RawSample, view: bool) -> dict[str, Any]:
    """``{key}.json``, checked (``shardmaker.format.SampleHeader.parse``), as the JSON object the kinds
    read; of a clip frame's ``view`` (made by the clip kind from its segment's checked header), the digests."""
    if "json" not in raw.members:
        raise SampleError(raw.shard, raw.key, "no json member")
    try:
        if view:
            d = fmt.parse_digests(raw.members["json"], raw.shard, raw.key)
            return {"sha256": d.sha256, **({} if d.xxh3_64 is None else {"xxh3_64": d.xxh3_64})}
        return fmt.SampleHeader.parse(raw.members["json"], raw.shard, raw.key).to_json()
    except fmt.SampleHeaderError as exc:
        raise SampleError(raw.shard, raw.key, exc.reason) from None


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


def decode_members(
    shard: str,
    key: str,
    members: Mapping[str, Any],
    hr_name: str,
    lr_name: str,
    scale: int,
    max_pixels: int = fmt.DEFAULT_MAX_PIXELS,
) -> tuple[np.ndarray, np.ndarray]:
    """Decode HR and LR (the member's extension picks the decoder; each checks its own header against
    ``max_pixels`` first), check HR = scale x LR (up to a mod-crop) and matching depth and channels;
    HR comes back cropped to exactly scale x LR. Call :func:`check_headers` before: it checks the pair."""

    def fail(reason: str) -> SampleError:
        return SampleError(shard, key, reason)

    try:
        hr = imaging.decode(members[hr_name], hr_name, max_pixels)
    except ImageDataError as exc:
        raise fail(f"{hr_name}: {exc}") from None
    try:
        lr = imaging.decode(members[lr_name], lr_name, max_pixels)
    except ImageDataError as exc:
        raise fail(f"{lr_name}: {exc}") from None
    (h, w), (lh, lw) = hr.shape[:2], lr.shape[:2]
    if not pair_fits((h, w), (lh, lw), scale):
        raise fail(f"HR {w}x{h} is not {scale} x LR {lw}x{lh} (wrong scale?)")
    if hr.dtype != lr.dtype or hr.shape[2:] != lr.shape[2:]:
        raise fail(f"HR {hr.dtype}{list(hr.shape[2:])} and LR {lr.dtype}{list(lr.shape[2:])} differ in depth or channels")
    return hr[: scale * lh, : scale * lw], lr


def decode_pair(
    raw: RawSample,
    names: tuple[str, str],
    scale: int,
    verify: Verify = Verify.XXH3,
    max_pixels: int = fmt.DEFAULT_MAX_PIXELS,
    kind: Kind | None = None,
    clip: clips.ClipConfig | None = None,
    lr_mode: str = "stored",
    degrade: Any = None,
    view: bool = False,
) -> DecodedPair:
    """Check headers (sizes against the manifest, scale, ``max_pixels``, channels and depth against
    ``kind``) and digests, then decode the members ``names`` (HR, LR); every failure is a SampleError
    naming shard and key. Digests come from ``{key}.json`` in our shards, from the manifest in an
    index of foreign shards (``raw.digests``, xxh3_64). ``view``: a clip frame's sample."""
    t0 = time.perf_counter_ns()
    hr_name, lr_name = names

    def fail(reason: str) -> SampleError:
        return SampleError(raw.shard, raw.key, reason)

    meta: dict[str, Any] = {} if raw.digests is not None else _sample_json(raw, view)
    if raw.digests is None and clips.is_clip(raw.members):
        if clip is None:
            raise fail("a clip sample (frames hr_f0000 ...): stream clip datasets with clip=wdsr.ClipConfig(frames=T)")

        def frame(sub: RawSample, frame_names: tuple[str, str]) -> DecodedPair:  # checked by check() first
            sub_verify = verify if tiled.is_tiled(sub) else Verify.NONE
            return decode_pair(sub, frame_names, scale, sub_verify, max_pixels, kind, view=True)

        def check(sub: RawSample, frame_names: tuple[str, str]) -> None:  # before any frame is decoded
            if not tiled.is_tiled(sub):  # a tiled frame's checks are its layout's and each tile's, as it is read
                check_headers(sub.shard, sub.key, sub.members, frame_names, scale, max_pixels, sub.hr_size, kind)
                check_digests(sub.shard, sub.key, sub.members, _sample_json(sub, True), frame_names, Verify(verify))

        return clips.decode_clip(raw, meta, scale, clip, frame, check)  # type: ignore[return-value]
    if lr_mode != "stored":
        return _hr_only(raw, meta, hr_name, scale, Verify(verify), max_pixels, kind, lr_mode, degrade)  # type: ignore[return-value]
    if tiled.is_tiled(raw):
        return tiled.tiled_pair(raw, meta, scale, Verify(verify), kind)
    for name in (hr_name, lr_name):
        if name not in raw.members:
            raise fail(f"no {name} member (this sample has scales {meta.get('scales')!r})")
    hr_head, _ = check_headers(raw.shard, raw.key, raw.members, names, scale, max_pixels, raw.hr_size, kind)
    if raw.digests is None:
        check_digests(raw.shard, raw.key, raw.members, meta, (hr_name, lr_name), Verify(verify))
    elif verify is not Verify.NONE:
        for name in (hr_name, lr_name):
            if xxhash.xxh3_64_intdigest(raw.members[name]) != raw.digests[name]:
                raise fail(f"{name} does not match its xxh3_64 in the index (shard changed or corrupt)")
    t1 = time.perf_counter_ns()
    hr, lr = decode_members(raw.shard, raw.key, raw.members, hr_name, lr_name, scale, max_pixels)
    if kind is not None:
        kind.fix(raw.key, hr_head)
    return DecodedPair(raw.shard, raw.key, raw.rep, hr, lr, time.perf_counter_ns() - t1, t1 - t0)


def _hr_only(
    raw: RawSample,
    meta: dict[str, Any],
    hr_name: str,
    scale: int,
    verify: Verify,
    max_pixels: int,
    kind: Kind | None,
    mode: str,
    degrade: Any,
) -> Any:
    """The HR image alone, checked (header: the manifest's size, ``max_pixels``, the kind; digest) and
    decoded (tiled: lazily, tile by tile); its LR patches are made as they are cut (``lr="bicubic"``),
    or on the device (``mode="degrade"``: its patches carry their degradation parameters)."""
    t0 = time.perf_counter_ns()

    def fail(reason: str) -> SampleError:
        return SampleError(raw.shard, raw.key, reason)

    def pair(hr: Any, decode_ns: int, verify_ns: int) -> Any:
        if mode == "degrade":
            from wdsr.pipeline import degraded  # it cuts patches (pipeline.patches imports this module)

            return degraded.DegradePair(raw.shard, raw.key, raw.rep, hr, scale, degrade, decode_ns, verify_ns)
        return bicubic.BicubicPair(raw.shard, raw.key, raw.rep, hr, scale, bicubic.MODES[mode], decode_ns, verify_ns)

    if tiled.is_tiled(raw):
        hr_tiles = tiled.tiled_hr(raw, meta, verify, kind)
        if hr_tiles.shape[0] * hr_tiles.shape[1] > max_pixels:
            raise fail(f"HR of {hr_tiles.shape[1]}x{hr_tiles.shape[0]} pixels is over max_pixels={max_pixels}")
        return pair(hr_tiles, 0, time.perf_counter_ns() - t0)
    if raw.digests is None:
        hr_name = next((n for n in raw.members if n.startswith("hr.")), hr_name)
    if hr_name not in raw.members:
        raise fail(f"no {hr_name} member")
    try:
        head = fmt.image_header(raw.members[hr_name], hr_name)
    except fmt.HeaderError as exc:
        raise fail(f"{hr_name}: {exc}") from None
    if raw.hr_size is not None and (head.width, head.height) != tuple(raw.hr_size):
        raise fail(f"HR header says {head.width}x{head.height}, the manifest says {raw.hr_size[0]}x{raw.hr_size[1]}")
    if head.pixels > max_pixels:
        raise fail(f"HR of {head.width}x{head.height} = {head.pixels} pixels is over max_pixels={max_pixels}")
    if kind is not None:
        kind.check(raw.shard, raw.key, hr_name, head)
    if raw.digests is None:
        check_digests(raw.shard, raw.key, raw.members, meta, (hr_name,), verify)
    elif verify is not Verify.NONE and xxhash.xxh3_64_intdigest(raw.members[hr_name]) != raw.digests[hr_name]:
        raise fail(f"{hr_name} does not match its xxh3_64 in the index (shard changed or corrupt)")
    t1 = time.perf_counter_ns()
    try:
        hr = imaging.decode(raw.members[hr_name], hr_name, max_pixels)
    except ImageDataError as exc:
        raise fail(f"{hr_name}: {exc}") from None
    if kind is not None:
        kind.fix(raw.key, head)
    return pair(hr, time.perf_counter_ns() - t1, t1 - t0)
