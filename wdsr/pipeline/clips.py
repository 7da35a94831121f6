"""Video clips: windows of T frames cut from clip segments (``shardmaker build --clips``), k windows
per decoded segment, each with one crop and one dihedral transform shared by all its frames.

Windows, as BasicSR and mmagic draw them (so published EDVR / BasicVSR training is reproduced):

* ``window="recurrent"`` (BasicVSR, BasicVSR++, VRT; BasicSR's ``REDSRecurrentDataset``, mmagic's
  ``GenerateSegmentIndices``): ``interval`` uniform over the list, then the start ``s`` uniform over
  the starts with ``s + T * interval <= L`` (their formula: the window's frames are ``s, s + interval,
  .. s + (T - 1) * interval``); batches ``lr [B, T, C, h, w]``, ``hr [B, T, C, H, W]``.
* ``window="center"`` (EDVR; BasicSR's ``REDSDataset``, mmagic's ``GenerateFrameIndices``): ``interval``
  uniform, then the centre ``c`` uniform over the frames whose window ``c - h * interval .. c + h *
  interval`` (``h = T // 2``, T odd) lies in the clip; ``hr [B, C, H, W]`` is the centre frame.

Then, with probability ``reverse``, the frames in reverse order (BasicSR's Vimeo ``random_reverse``).
Every draw is a counter hash of (seed, epoch, key, j) (:func:`wdsr.pipeline.patches.draws`), never a
global RNG. A segment only draws windows whose start it owns (the ranges partition the clip's
starts), so each window of the clip is drawn from exactly one sample.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardmaker import format as fmt
from shardmaker.format import Manifest
from wdsr.bounds import bounded, check_bounds
from wdsr.errors import SampleError
from wdsr.pipeline import tiled
from wdsr.pipeline.augment import N_DIHEDRAL, chw_shape, patch_source, write_chw
from wdsr.pipeline.checks import Verify, check_digests, check_headers
from wdsr.pipeline.patches import PatchConfig, draws
from wdsr.pipeline.read import RawSample
from wdsr.pipeline.sample import DecodeSpec, LrMode, SampleKind, is_clip_dataset
from wdsr.pipeline.whole import DecodedPair, whole_pair
from wdsr.store.decoded import FRAME_SEP

MAX_FRAMES = fmt.MAX_SEGMENT  # frames of one segment: the format's limit
_U = 1 << 31  # resolution of the uniform draws of start, interval and reverse


@dataclasses.dataclass(frozen=True)
class ClipConfig:
    """Windows of ``frames`` frames from clip datasets (``SRDataset(url, clip=wdsr.ClipConfig(...))``).

    ``interval``: frame steps, one drawn per window; ``window``: ``"recurrent"`` (all T frames' HR) or
    ``"center"`` (the centre frame's HR; T odd); ``reverse``: probability of reversing a window's
    frames. Validation: ``val_frames`` frames per chunk of a clip (``split="val"``), ``val_padding``
    how centre windows are padded at clip ends."""

    # the numbers' ranges live on the fields (wdsr.bounds): checked here, read by wdsr train's flags
    frames: int = bounded(7, 1, MAX_FRAMES)
    interval: tuple[int, ...] = bounded((1,), 1, MAX_FRAMES, items=64)  # a scalar is one interval
    window: str = "recurrent"
    reverse: float = bounded(0.0, 0.0, 1.0)  # a probability
    val_frames: int = bounded(32, 1, MAX_FRAMES)
    val_padding: str = "reflection_circle"

    def __post_init__(self) -> None:
        check_bounds(self, "clip ")
        if self.window not in ("recurrent", "center"):
            raise ValueError(f"clip window must be 'recurrent' or 'center', got {self.window!r}")
        if self.window == "center" and self.frames % 2 == 0:
            raise ValueError(f"a center window needs an odd number of frames, got {self.frames}")
        if not (isinstance(self.reverse, (int, float)) and 0.0 <= self.reverse <= 1.0):
            raise ValueError(f"clip reverse must be a probability in [0, 1], got {self.reverse!r}")
        if type(self.val_frames) is not int or not 1 <= self.val_frames <= MAX_FRAMES:
            raise ValueError(f"clip val_frames must be an integer in [1, {MAX_FRAMES}], got {self.val_frames!r}")
        if self.val_padding not in ("replicate", "reflection", "reflection_circle", "circle"):
            raise ValueError(
                f"clip val_padding must be replicate, reflection, reflection_circle or circle, got {self.val_padding!r}"
            )

    def reach(self, interval: int) -> int:
        """Frames a window of ``interval`` needs from its first frame: ``T * interval`` for recurrent
        windows (BasicSR's and mmagic's ``s + T * interval <= L``), ``(T - 1) * interval + 1`` for centre ones."""
        return self.frames * interval if self.window == "recurrent" else (self.frames - 1) * interval + 1

    @property
    def span(self) -> int:
        """The most frames any window covers, first to last: what ``--max-span`` must hold."""
        return (self.frames - 1) * max(self.interval) + 1


@dataclasses.dataclass
class Segment:
    """A clip sample as ``{key}.json`` describes it, checked."""

    clip: str
    clip_frames: int
    first: int
    frames: int
    owned: tuple[int, int]
    ext: str


def is_clip(raw_members: Any) -> bool:
    return fmt.clip_ext(raw_members) is not None


def wanted(name: str, scale: int) -> bool:
    """A clip sample's member is read: its json, and the HR and x``scale`` LR of every frame."""
    if name == fmt.JSON_MEMBER:
        return True
    m = fmt.FRAME_MEMBER.match(name)
    return m is not None and (m.group(1) == "hr" or m.group(2) == str(scale))


def segment_of(shard: str, key: str, meta: dict[str, Any], members: Any, scale: int) -> Segment:
    """The segment's fields from its json, every one bounded and consistent with its members."""

    def fail(reason: str) -> SampleError:
        return SampleError(shard, key, reason)

    if meta.get("clip") is None:  # fields checked by shardmaker.format.SampleHeader.parse; present on a segment's
        raise fail(f"{key}.json has no clip fields: not a clip segment's header")
    clip, length, first, frames = meta["clip"], meta["clip_frames"], meta["first_frame"], meta["frames"]
    a, b = meta["owned"]
    ext = fmt.clip_ext(members)
    if ext is None:
        raise fail(f"no {fmt.hr_frame(0, 'png')} member: not a clip sample")
    for t in range(frames):
        for name in (fmt.hr_frame(t, ext), fmt.lr_frame(scale, t, ext)):
            if name not in members:
                raise fail(f"no {name} member (frame {t} of {frames}; scales {meta.get('scales')!r})")
    return Segment(clip, length, first, frames, (a, b), ext)


class DecodedClip:
    """A clip segment whose frames are decoded as windows ask for them, each frame once: HR and LR
    (H x W [x C] arrays, HR cropped to exactly scale x LR), every frame checked as an image sample
    is (headers against the manifest's size and the kind, digests) before its decode."""

    tiled = False
    chw = False
    lazy = True  # frames decoded as windows ask: a bad one is found when the k windows are first cut

    def __init__(self, raw: RawSample, meta: dict[str, Any], seg: Segment, spec: DecodeSpec) -> None:
        self.shard, self.key, self.rep = raw.shard, raw.key, raw.rep
        scale = spec.scale
        self.seg, self.scale, self.cc, self._raw, self._meta, self._spec = seg, scale, spec.clip, raw, meta, spec
        self._frames: dict[int, tuple[Any, Any, bool]] = {}  # t -> (HR, LR, planar: from the decoded cache)
        self.decode_ns = self.verify_ns = 0
        self._cache: Any = None  # the node-wide decoded cache: decoded frames, one entry each
        self._kind: tuple[Any, Any] = (None, None)
        self.cache_hits = self.cache_stores = 0
        w, h = raw.hr_size or meta.get("hr_size") or (0, 0)
        self.lr_hw = (int(h) // scale, int(w) // scale)

    def cut(self, spec: PatchConfig, base: np.uint64, first: int, count: int) -> tuple[list[Window], int]:
        """What an image pair's ``cut`` cuts, for this segment: its windows ``first ..``."""
        return cut_windows(self, spec, self.cc, base, first, count)

    def keep(self, cache: Any, channels: int | None, bit_depth: int | None) -> bool:
        """Frames come from (and, decoded, go to) the decoded cache, as ``{key}#f{t}`` entries
        (:data:`wdsr.store.decoded.FRAME_SEP`), checked as any entry is (digest, shapes, kind); the
        segment itself is never kept (its frames are decoded one by one)."""
        self._cache, self._kind = cache, (channels, bit_depth)
        return False

    def hwc(self) -> tuple[np.ndarray, np.ndarray]:
        raise SampleError(self.shard, self.key, "a clip segment is validated in chunks of frames (split='val' with clip=)")

    def frame(self, t: int) -> tuple[Any, Any, bool]:
        """(HR, LR, planar) of segment frame ``t``: H x W [x C] arrays, or C x H x W views of a
        decoded-cache entry (``planar``)."""
        got = self._frames.get(t)
        if got is None:
            got = self._cached(t) or self._decode(t)
            self._frames[t] = got
        return got

    def take_stats(self) -> dict[str, int]:
        """Decoded-cache frame hits and stores since the last call (the stats' ``decoded_hits``, ``decoded_stores``)."""
        out = {"decoded_hits": self.cache_hits, "decoded_stores": self.cache_stores}
        self.cache_hits = self.cache_stores = 0
        return out

    def _cached(self, t: int) -> tuple[Any, Any, bool] | None:
        if self._cache is None:
            return None
        name = f"{self.key}{FRAME_SEP}f{t:04d}"
        w, h = self._raw.hr_size or (0, 0)
        hit = self._cache.lookup(name, (int(w), int(h)), *self._kind) if self._cache.has(name) else None
        if hit is None:
            return None
        self.cache_hits += 1
        return hit[0], hit[1], True

    def release(self, t: int) -> None:
        """Forget frame ``t``'s decoded pixels (a caller that keeps them itself: validation's chunks)."""
        self._frames.pop(t, None)

    def sub_sample(self, t: int) -> tuple[RawSample, dict[str, Any], tuple[str, str], tuple[str, str]]:
        """Frame ``t`` as an image sample (``hr.ext``, ``lr_x{s}.ext``), the header of their digests, the
        names it has there, and its members' names in the segment."""
        ext, s = self.seg.ext, self.scale
        real = (fmt.hr_frame(t, ext), fmt.lr_frame(s, t, ext))
        one, two = fmt.hr_member(ext), fmt.lr_member(s, ext)
        digests = {
            d: {one: (self._meta.get(d) or {}).get(real[0]), two: (self._meta.get(d) or {}).get(real[1])}
            for d in ("sha256", "xxh3_64")
        }
        members = {one: self._raw.members[real[0]], two: self._raw.members[real[1]]}
        meta = {**digests, "scales": self._meta.get("scales")}
        return dataclasses.replace(self._raw, members=members), meta, (one, two), real

    def failed(self, t: int, exc: SampleError, names: tuple[str, str], real: tuple[str, str]) -> SampleError:
        reason = exc.reason.replace(names[0], real[0]).replace(names[1], real[1])
        return SampleError(self.shard, self.key, f"frame {t}: {reason}")

    def check(self) -> None:
        """Every frame's headers and digests, before any is decoded (a tiled frame's checks are its
        layout's and each tile's, as it is read)."""
        spec = self._spec
        for t in range(self.seg.frames):
            sub, meta, names, real = self.sub_sample(t)
            if tiled.is_tiled(sub):
                continue
            try:
                check_headers(sub.shard, sub.key, sub.members, names, spec.scale, spec.max_pixels, sub.hr_size, spec.kind)
                check_digests(sub.shard, sub.key, sub.members, meta, names, Verify(spec.verify))
            except SampleError as exc:
                raise self.failed(t, exc, names, real) from None

    def _decode_frame(self, sub: RawSample, meta: dict[str, Any], names: tuple[str, str]) -> DecodedPair:
        """A frame as an image sample, checked by :meth:`check` first (a tiled one: as it is read)."""
        if tiled.is_tiled(sub):
            return tiled.tiled_pair(sub, meta, dataclasses.replace(self._spec, names=names, clip=None))
        return whole_pair(sub, meta, dataclasses.replace(self._spec, names=names, verify=Verify.NONE, clip=None))

    def _decode(self, t: int) -> tuple[Any, Any, bool]:
        sub, meta, names, real = self.sub_sample(t)
        try:
            pair = self._decode_frame(sub, meta, names)
        except SampleError as exc:
            raise self.failed(t, exc, names, real) from None
        self.decode_ns += pair.decode_ns
        self.verify_ns += pair.verify_ns
        if pair.lr_hw != self.lr_hw:
            raise SampleError(self.shard, self.key, f"frame {t}: LR {pair.lr_hw[1]}x{pair.lr_hw[0]}, frame 0's differs")
        if self._cache is not None and not pair.tiled:
            if self._cache.store(f"{self.key}{FRAME_SEP}f{t:04d}", pair.hr, pair.lr, *self._kind):
                self.cache_stores += 1
        return pair.hr, pair.lr, False


class Window:
    """One window between its cut and its batch: per frame, the HR and LR crops, and the transform
    they share. ``write`` lays it out (T x) C x H x W into a batch's rows, as ``Patch.write`` does."""

    __slots__ = ("_lr", "_hr", "_planar", "t", "key", "j", "frames", "center")
    planar = False  # as a whole: its frames' sources say each their own (views of decoded-cache entries, or crops)

    def __init__(
        self,
        lr: list[np.ndarray],
        hr: list[np.ndarray],
        t: int,
        key: str,
        j: int,
        frames: list[int],
        center: bool,
        planar: tuple[list[bool], list[bool]] | None = None,
    ) -> None:
        self._lr, self._hr, self.t, self.key, self.j, self.frames, self.center = lr, hr, t, key, j, frames, center
        self._planar = planar or ([False] * len(lr), [False] * len(hr))

    @property
    def dtype(self) -> np.dtype:
        return self._hr[0].dtype

    @property
    def lr_shape(self) -> tuple[int, ...]:
        return (len(self._lr), *chw_shape(self._lr[0], self.t, self._planar[0][0]))

    @property
    def hr_shape(self) -> tuple[int, ...]:
        one = chw_shape(self._hr[0], self.t, self._planar[1][0])
        return one if self.center else (len(self._hr), *one)

    def write(self, lr_out: np.ndarray, hr_out: np.ndarray) -> None:
        if lr_out.size != int(np.prod(self.lr_shape)) or hr_out.size != int(np.prod(self.hr_shape)) or self.dtype != hr_out.dtype:
            raise ValueError(f"windows of one batch differ: {self.lr_shape}/{self.hr_shape} after {lr_out.shape}/{hr_out.shape}")
        lr_out = lr_out.reshape(self.lr_shape)
        lp, hp = self._planar
        for i, a in enumerate(self._lr):
            write_chw(a, self.t, lp[i], lr_out[i])
        if self.center:
            write_chw(self._hr[0], self.t, hp[0], hr_out.reshape(self.hr_shape))
        else:
            hr_out = hr_out.reshape(self.hr_shape)
            for i, a in enumerate(self._hr):
                write_chw(a, self.t, hp[i], hr_out[i])

    @property
    def lr(self) -> np.ndarray:
        out = np.empty(self.lr_shape, dtype=self.dtype)
        hr = np.empty(self.hr_shape, dtype=self.dtype)
        self.write(out, hr)
        return out

    @property
    def hr(self) -> np.ndarray:
        lr = np.empty(self.lr_shape, dtype=self.dtype)
        out = np.empty(self.hr_shape, dtype=self.dtype)
        self.write(lr, out)
        return out


def window_draws(
    base: np.uint64, js: np.ndarray, cc: ClipConfig, seg: Segment, lr_hw: tuple[int, int], p: int, augment: bool
) -> list[tuple[list[int], int, int, int]]:
    """Per window ``j``: its frames (clip indices, in the order given), LR crop (y, x) and transform."""
    lh, lw = lr_hw
    crops = draws(base, js, 0, (lh - p + 1, lw - p + 1, N_DIHEDRAL if augment else 1))
    picks = draws(base, js, 1, (len(cc.interval), _U, _U))
    out = []
    a, b = seg.owned
    for (y, x, t), (iv_i, u_start, u_rev) in zip(crops.tolist(), picks.tolist(), strict=True):
        iv = cc.interval[iv_i]
        stop = min(b, seg.clip_frames - cc.reach(iv) + 1)  # owned starts whose window fits the clip
        n = stop - a
        if n < 1:
            return []
        start = a + (u_start * n >> 31)
        frames = [start + i * iv for i in range(cc.frames)]
        if u_rev < int(cc.reverse * _U):
            frames.reverse()
        out.append((frames, y, x, t))
    return out


def cut_windows(
    clip: DecodedClip, spec: PatchConfig, cc: ClipConfig, base: np.uint64, first: int, count: int
) -> tuple[list[Window], int]:
    """Windows ``first .. first + count - 1`` of a decoded segment (their frames decoded as needed)."""
    s, p = spec.scale, spec.patch_size // spec.scale
    seg = clip.seg
    lh, lw = clip.lr_hw
    if lh < p or lw < p:
        raise SampleError(clip.shard, clip.key, f"LR {lw}x{lh} is smaller than the LR patch {p}x{p}")
    plan = window_draws(base, np.arange(first, first + count), cc, seg, clip.lr_hw, p, spec.augment)
    if not plan:
        raise SampleError(
            clip.shard, clip.key, f"no window of {cc.frames} frames starts in this segment (a clip of {seg.clip_frames} frames)"
        )
    out = []
    center = cc.window == "center"
    for j, (frames, y, x, t) in zip(range(first, first + count), plan, strict=True):
        lo, hi = min(frames), max(frames)
        if lo < seg.first or hi >= seg.first + seg.frames:
            raise SampleError(
                clip.shard,
                clip.key,
                f"a window of frames {lo}..{hi} does not lie in this segment (frames {seg.first}..{seg.first + seg.frames - 1}): "
                f"windows spanning {cc.span} frames need a dataset built with --max-span {cc.span} or more",
            )
        lrs, hrs, lp, hp = [], [], [], []
        for f in frames:
            hr, lr, planar = clip.frame(f - seg.first)
            lrs.append(patch_source(_crop(lr, y, x, p, planar), t, planar))
            lp.append(planar)
            if not center:
                hrs.append(patch_source(_crop(hr, s * y, s * x, s * p, planar), t, planar))
                hp.append(planar)
        if center:
            hr, _, planar = clip.frame(frames[len(frames) // 2] - seg.first)
            hrs.append(patch_source(_crop(hr, s * y, s * x, s * p, planar), t, planar))
            hp.append(planar)
        out.append(Window(lrs, hrs, t, clip.key, j, frames, center, (lp, hp)))
    return out, 0


def _crop(a: Any, y: int, x: int, n: int, planar: bool) -> Any:
    return a[:, y : y + n, x : x + n] if planar else a[y : y + n, x : x + n]


def clip_pair(raw: RawSample, meta: dict[str, Any], spec: DecodeSpec) -> DecodedClip:
    """The segment checked from its json and members, every frame's headers and digests (xxh3 of a
    REDS segment: a few ms); its frames are decoded as windows need them."""
    if spec.clip is None:
        raise SampleError(
            raw.shard, raw.key, "a clip sample (frames hr_f0000 ...): stream clip datasets with clip=wdsr.ClipConfig(frames=T)"
        )
    t0 = time.perf_counter_ns()
    seg = segment_of(raw.shard, raw.key, meta, raw.members, spec.scale)
    out = DecodedClip(raw, meta, seg, spec)
    out.check()
    out.verify_ns = time.perf_counter_ns() - t0
    return out


def frames_of(windows: Sequence[Window]) -> list[list[int]]:
    return [w.frames for w in windows]


class _ClipMembers(frozenset):
    """The members of a clip sample that are read: json, and every frame's HR and x``scale`` LR."""

    scale = 0

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and wanted(name, self.scale)


def clip_members(m: Manifest, scale: int, lr: LrMode) -> frozenset[str]:
    got = _ClipMembers()
    got.scale = scale
    return got


def clip_options(folder: str, clip: ClipConfig | None) -> None:
    """A clip dataset streams windows of frames: ``clip=`` says how."""
    if clip is None:
        raise ValueError(
            f"{folder}: a clip dataset (shardmaker build --clips): stream windows of frames with "
            "clip=wdsr.ClipConfig(frames=T) (a mix holds clip datasets only, or image datasets only)"
        )


KIND = SampleKind(
    name="clip",
    what="a clip dataset",
    plural="clips",
    claims=lambda raw: raw.digests is None and is_clip(raw.members),
    holds=is_clip_dataset,
    members=clip_members,
    pair=clip_pair,
    options=clip_options,
)
