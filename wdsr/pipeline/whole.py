"""Whole images (``{key}.hr.{ext}``, ``{key}.lr_x{s}.{ext}``): checked from their headers and digests,
decoded whole, and cut into aligned patches (LR top-left (y, x), HR at (s*y, s*x)).

:class:`DecodedPair` is also the pair of a tiled sample (``wdsr.pipeline.tiled``: its images decode
tile by tile as the same slices ask) and of the decoded cache (planar views of a mapped entry).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from shardmaker import format as fmt
from shardmaker import imaging
from shardmaker.format import JSON_MEMBER, Manifest, hr_member, pair_fits
from shardmaker.imaging import ImageDataError
from wdsr.errors import SampleError
from wdsr.pipeline.augment import N_DIHEDRAL, patch_source
from wdsr.pipeline.checks import check_headers, check_indexed
from wdsr.pipeline.patches import Patch, PatchConfig, best_try, draws
from wdsr.pipeline.read import RawSample
from wdsr.pipeline.sample import DecodeSpec, Hr, LrMode, SampleKind, is_clip_dataset, tile_reads


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

    @property
    def lazy(self) -> bool:
        return self.tiled

    def hwc(self) -> tuple[np.ndarray, np.ndarray]:
        """(HR, LR) as H x W [x C] arrays (views of planar ones; a tiled pair decoded whole)."""
        if self.tiled:
            return np.asarray(self.hr), np.asarray(self.lr)
        if not self.chw:
            return self.hr, self.lr
        return _hwc(self.hr), _hwc(self.lr)

    def cut(self, spec: PatchConfig, base: np.uint64, first: int, count: int) -> tuple[list[Patch], int]:
        return cut_whole(self, spec, base, first, count)

    def keep(self, cache: Any, channels: int | None, bit_depth: int | None) -> bool:
        """Stored in the decoded cache (a tiled pair is decoded tile by tile: never kept)."""
        return not self.tiled and bool(cache.store(self.key, self.hr, self.lr, channels, bit_depth))

    def take_stats(self) -> dict[str, int]:
        return tile_reads((self.hr, self.lr)) if self.tiled else {}

    def prefetch(self, yx: list[tuple[int, int]], p: int, scale: int) -> None:
        """Tell a tiled pair the LR patches (side ``p``, top-left ``yx``) about to be cut, and their HR:
        a member read by request fetches all their tiles at once (merged, concurrently)."""
        lh, lw = self.lr_hw
        if not self.tiled or lh < p or lw < p:
            return
        s = scale
        self.lr.prefetch([(y, x, p, p) for y, x in yx])  # type: ignore[attr-defined]
        self.hr.prefetch([(s * y, s * x, s * p, s * p) for y, x in yx])  # type: ignore[attr-defined]


def _hwc(a: np.ndarray) -> np.ndarray:
    return a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0)


def cut(pair: DecodedPair, spec: PatchConfig, base: np.uint64, j: int, first: np.ndarray | None = None) -> tuple[Patch, int]:
    """Patch ``j`` (and how many candidates were rejected as flat); ``first``: its try-0 draws."""
    s, p = spec.scale, spec.patch_size // spec.scale
    lh, lw = pair.lr_hw
    if lh < p or lw < p:
        raise SampleError(pair.shard, pair.key, f"LR {lw}x{lh} is smaller than the LR patch {p}x{p}")
    bounds = (lh - p + 1, lw - p + 1, N_DIHEDRAL if spec.augment else 1)
    d = first if first is not None else draws(base, np.array([j]), 0, bounds)[0]
    t = int(d[2])

    def lr_std(cy: int, cx: int) -> tuple[float, None]:
        return float((pair.lr[:, cy : cy + p, cx : cx + p] if pair.chw else pair.lr[cy : cy + p, cx : cx + p]).std()), None

    y, x, _, rejected = best_try(spec, base, j, d, bounds, lr_std)
    if pair.chw:  # planar arrays (the decoded cache)
        lr_v, hr_v = pair.lr[:, y : y + p, x : x + p], pair.hr[:, s * y : s * (y + p), s * x : s * (x + p)]
    else:
        lr_v, hr_v = pair.lr[y : y + p, x : x + p], pair.hr[s * y : s * (y + p), s * x : s * (x + p)]
    return Patch(patch_source(lr_v, t, pair.chw), patch_source(hr_v, t, pair.chw), t, pair.chw, pair.key, j), rejected


def cut_whole(pair: DecodedPair, spec: PatchConfig, base: np.uint64, first: int, count: int) -> tuple[list[Patch], int]:
    """Patches ``first .. first + count - 1`` of an image pair: each at its try-0 draw, or with
    ``min_patch_std`` the first try that is not flat (:func:`cut`)."""
    out, rejected = [], 0
    p = spec.patch_size // spec.scale
    lh, lw = pair.lr_hw
    js = np.arange(first, first + count)
    firsts = draws(base, js, 0, (max(1, lh - p + 1), max(1, lw - p + 1), N_DIHEDRAL if spec.augment else 1))
    pair.prefetch([(y, x) for y, x, _ in firsts.tolist()], p, spec.scale)  # a remote tiled pair: their first tries' tiles
    if spec.min_patch_std is not None or lh < p or lw < p:
        for n, j in enumerate(range(first, first + count)):
            patch, r = cut(pair, spec, base, j, firsts[n])
            out.append(patch)
            rejected += r
        return out, rejected
    # every patch its try-0 draw: what cut() does, without its per-patch checks
    s, lr, hr, chw, key = spec.scale, pair.lr, pair.hr, pair.chw, pair.key
    for j, (y, x, t) in zip(range(first, first + count), firsts.tolist(), strict=True):
        if chw:
            lr_v, hr_v = lr[:, y : y + p, x : x + p], hr[:, s * y : s * (y + p), s * x : s * (x + p)]
        else:
            lr_v, hr_v = lr[y : y + p, x : x + p], hr[s * y : s * (y + p), s * x : s * (x + p)]
        out.append(Patch(patch_source(lr_v, t, chw), patch_source(hr_v, t, chw), t, chw, key, j))
    return out, 0


def decode_members(
    shard: str,
    key: str,
    members: Any,
    hr_name: str,
    lr_name: str,
    scale: int,
    max_pixels: int = fmt.DEFAULT_MAX_PIXELS,
) -> tuple[np.ndarray, np.ndarray]:
    """Decode HR and LR (the member's extension picks the decoder; each checks its own header against
    ``max_pixels`` first), check HR = scale x LR (up to a mod-crop) and matching depth and channels;
    HR comes back cropped to exactly scale x LR. Call ``check_headers`` before: it checks the pair."""

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


def whole_pair(raw: RawSample, meta: dict[str, Any], spec: DecodeSpec) -> DecodedPair:
    """HR and the stored LR (``spec.names``): headers (sizes against the manifest, scale, ``max_pixels``,
    the dataset's kind) and digests checked, then both decoded; failures are SampleErrors."""
    t0 = time.perf_counter_ns()
    names = spec.names
    for name in names:
        if name not in raw.members:
            raise SampleError(raw.shard, raw.key, f"no {name} member (this sample has scales {meta.get('scales')!r})")
    hr_head, _ = check_headers(raw.shard, raw.key, raw.members, names, spec.scale, spec.max_pixels, raw.hr_size, spec.kind)
    check_indexed(raw, meta, names, spec.verify)
    t1 = time.perf_counter_ns()
    hr, lr = decode_members(raw.shard, raw.key, raw.members, *names, spec.scale, spec.max_pixels)
    if spec.kind is not None:
        spec.kind.fix(raw.key, hr_head)
    return DecodedPair(raw.shard, raw.key, raw.rep, hr, lr, time.perf_counter_ns() - t1, t1 - t0)


def whole_hr(raw: RawSample, meta: dict[str, Any], spec: DecodeSpec) -> Hr:
    """The HR image alone (its LR made from it), checked (header: the manifest's size, ``max_pixels``,
    the kind; digest) and decoded."""
    t0 = time.perf_counter_ns()

    def fail(reason: str) -> SampleError:
        return SampleError(raw.shard, raw.key, reason)

    hr_name = spec.names[0]
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
    if head.pixels > spec.max_pixels:
        raise fail(f"HR of {head.width}x{head.height} = {head.pixels} pixels is over max_pixels={spec.max_pixels}")
    if spec.kind is not None:
        spec.kind.check(raw.shard, raw.key, hr_name, head)
    check_indexed(raw, meta, (hr_name,), spec.verify)
    t1 = time.perf_counter_ns()
    try:
        hr = imaging.decode(raw.members[hr_name], hr_name, spec.max_pixels)
    except ImageDataError as exc:
        raise fail(f"{hr_name}: {exc}") from None
    if spec.kind is not None:
        spec.kind.fix(raw.key, head)
    return Hr(hr, time.perf_counter_ns() - t1, t1 - t0)


def _members(m: Manifest, scale: int, lr: LrMode) -> frozenset[str]:
    if lr.made:
        return frozenset({m.members.hr}) if m.members is not None else frozenset({JSON_MEMBER, hr_member(m.codec)})
    return frozenset(m.member_names(scale)) | (frozenset() if m.members is not None else {JSON_MEMBER})


def image_options(folder: str, clip: Any) -> None:
    """An image dataset streams patches (whole and tiled samples alike), not windows of frames."""
    if clip is not None:
        raise ValueError(f"{folder}: clip= streams clip datasets (shardmaker build --clips); this one holds images")


KIND = SampleKind(
    name="whole",
    what="an image dataset",
    plural="images",
    claims=lambda raw: True,  # the last row of the table: every sample another kind does not claim
    holds=lambda m: not is_clip_dataset(m),
    members=_members,
    pair=whole_pair,
    options=image_options,
    hr=whole_hr,
)
