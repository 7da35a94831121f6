"""A val pass over clip datasets (``split="val"`` with ``clip=``): every clip once across the world, in
order, its segments put back together (frames shared by overlapping segments taken once), in chunks of
at most ``val_frames`` frames that overlap by ``frames // 2`` context frames each side; centre windows
padded at clip ends as BasicSR pads them; PSNR/SSIM averaged per clip, then over clips (REDS4, Vid4).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from wdsr.errors import SampleError
from wdsr.metrics import psnr_y, ssim_y
from wdsr.pipeline.clips import ClipConfig, DecodedClip
from wdsr.pipeline.plan import Span, val_plan
from wdsr.pipeline.source import MixSource, Source

log = logging.getLogger("wdsr")
KEY = re.compile(r"^(.+)_f(\d{6,7})$")  # a segment's key: {clip}_f{first:06d} (docs/format.md, Clip samples)
PADDINGS = ("replicate", "reflection", "reflection_circle", "circle")


class ValClip(NamedTuple):
    """One chunk of a clip: LR frames ``first .. first + len(lr) - 1``, and the HR of those it scores."""

    lr: torch.Tensor  # [n, C, h, w]
    hr: torch.Tensor  # [own.stop - own.start, C, s*h, s*w]: the HR of lr[own]
    clip: str  # the clip's key
    first: int  # clip index of lr[0]
    own: slice  # positions in lr of the frames this chunk scores; the others are context
    clip_frames: int
    windows: torch.Tensor | None  # window="center": [own frames, T] int64 positions in lr of each window


def center_window(center: int, length: int, frames: int, padding: str = "reflection_circle") -> list[int]:
    """Clip frame indices of the ``frames``-frame window around ``center`` in a clip of ``length``: BasicSR's
    ``generate_frame_indices`` (``m = length - 1``, ``h = frames // 2``; below 0: replicate ``0``, reflection
    ``-i``, reflection_circle ``center + h - i``, circle ``frames + i``; above m: ``m``, ``2m - i``,
    ``center - h - (i - m)``, ``i - frames``). Clips shorter than the window, where BasicSR would index outside
    the clip, are clamped to its ends."""
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {', '.join(PADDINGS)}, got {padding!r}")
    if frames % 2 == 0 or not 0 <= center < length:
        raise ValueError(f"a centre window needs an odd frame count and a centre in the clip, got {frames}, {center} of {length}")
    m, h, c = length - 1, frames // 2, center
    out = []
    for i in range(center - h, center + h + 1):
        j = i
        if i < 0:
            j = {"replicate": 0, "reflection": -i, "reflection_circle": c + h - i, "circle": frames + i}[padding]
        elif i > m:
            j = {"replicate": m, "reflection": 2 * m - i, "reflection_circle": c - h - (i - m), "circle": i - frames}[padding]
        out.append(min(max(j, 0), m))
    return out


def context(cc: ClipConfig) -> int:
    """Frames of context a chunk carries on each side of the frames it scores: ``frames // 2`` (a centre
    window's half; a recurrent model sees at least as much on each side as the middle of its training window)."""
    return cc.frames // 2


def check_val(folder: str, cc: ClipConfig, tile: int | None) -> None:
    """What a clip val pass needs of the options: chunks that score at least one frame, no image tiles."""
    c = context(cc)
    if cc.val_frames < 2 * c + 1:
        raise ValueError(
            f"{folder}: clip val_frames={cc.val_frames} leaves no frame to score between {c} context frames each side "
            f"(frames={cc.frames}): use val_frames >= {2 * c + 1}"
        )
    if tile is not None:
        raise ValueError(f"{folder}: tile= cuts images into tiles; clip chunks are whole frames (leave tile unset)")


def chunks(length: int, cc: ClipConfig) -> list[tuple[int, int, int, int]]:
    """``(lo, hi, a, b)`` per chunk of a clip: frames ``lo .. hi - 1`` (at most ``val_frames``), of which it
    scores ``a .. b - 1``; the scored ranges partition ``[0, length)``. The first chunk starts at frame 0,
    the last ends at the clip's end with ``val_frames`` frames where the clip has them (so padded centre
    windows, which reach ``2 * (frames // 2)`` frames in from an end, stay inside it)."""
    return chunk_ranges(length, cc.val_frames, context(cc))


def chunk_ranges(length: int, v: int, c: int) -> list[tuple[int, int, int, int]]:
    """:func:`chunks` of a clip of ``length`` frames in chunks of ``v`` frames with ``c`` context frames a side."""
    out, a = [], 0
    while a < length:
        lo = max(0, a - c)
        if lo + v >= length:  # the last chunk
            out.append((max(0, length - v), length, a, length))
            break
        out.append((lo, lo + v, a, lo + v - c))
        a = lo + v - c
    return out


@dataclasses.dataclass(frozen=True)
class ClipRef:
    """A clip as the manifest's keys give it: its segments ``(shard_index, sample, first_frame)`` in frame order."""

    clip: str
    segments: tuple[tuple[int, int, int], ...]


def clip_plan(shards: Sequence[Any]) -> list[ClipRef]:
    """The dataset's clips, sorted by key, from the manifest's segment keys ``{clip}_f{first:06d}``."""
    found: dict[str, list[tuple[int, int, int]]] = {}
    seen: set[tuple[str, int]] = set()
    for s, info in enumerate(shards):
        for i in range(info.samples):
            key = str(info.keys[i])
            m = KEY.match(key)
            if m is None:
                raise ValueError(f"shard {info.name}: key {key!r} is not a clip segment's ({{clip}}_f{{first:06d}})")
            clip, first = m.group(1), int(m.group(2))
            if (clip, first) in seen:
                raise ValueError(f"shard {info.name}: segment {key!r} appears twice (two datasets with the same clip keys?)")
            seen.add((clip, first))
            found.setdefault(clip, []).append((s, i, first))
    return [ClipRef(k, tuple(sorted(v, key=lambda t: t[2]))) for k, v in sorted(found.items())]


def clip_val_plan(shards: Sequence[Any], world_size: int, num_workers: int) -> list[list[ClipRef]]:
    """Clips per slot, each clip in exactly one slot: images' rule (:func:`val_plan`) over the clips."""
    clips = clip_plan(shards)
    return [[clips[r.sample] for r in slot] for slot in val_plan([len(clips)], world_size, num_workers)]


class _Abandon(Exception):
    """The clip cannot be finished (a bad segment or frame, already given to the error policy)."""


class _Frames:
    """A clip's frames in order, read from its segments one after the other (a frame shared by two
    segments from the first), each decoded once and held only until :meth:`drop_below` lets it go."""

    def __init__(self, source: Source | MixSource, ref: ClipRef, worker: int) -> None:
        self.ref = ref
        self._segs = source.pairs([Span(s, i, i + 1) for s, i, _ in ref.segments], worker)
        self._n = 0  # segments taken
        self._next = 0  # frames below it have been decoded
        self._cur: DecodedClip | None = None
        self.held: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.length = 0
        self.lr_hw = (0, 0)

    def open(self) -> int:
        """Read the first segment: the clip's length."""
        first = self._next_segment(0)
        self.length, self.lr_hw = first.seg.clip_frames, first.lr_hw
        return self.length

    def _next_segment(self, frame: int) -> DecodedClip:
        if self._n == len(self.ref.segments):
            raise SampleError("-", self.ref.clip, f"frames {frame}.. of clip {self.ref.clip!r} are in none of its segments")
        got = next(self._segs, None)
        planned = self.ref.segments[self._n][2]
        self._n += 1
        if got is None:
            raise _Abandon()  # the policy has it (skip) or raised it (fail)
        assert isinstance(got, DecodedClip), "a clip dataset's samples decode to clip segments"
        seg, want = got.seg, self.length or got.seg.clip_frames

        def bad(reason: str) -> SampleError:
            return SampleError(got.shard, got.key, reason)

        if seg.clip != self.ref.clip or seg.first != planned or seg.clip_frames != want or seg.first > frame:
            raise bad(
                f"segment of clip {seg.clip!r} at frame {seg.first} of {seg.clip_frames}, where clip {self.ref.clip!r} "
                f"(of {want} frames) needs frame {frame} from the segment its key puts at frame {planned}"
            )
        if self._cur is not None and got.lr_hw != self.lr_hw:
            raise bad(f"LR {got.lr_hw[1]}x{got.lr_hw[0]}, the clip's first segment's {self.lr_hw[1]}x{self.lr_hw[0]}")
        self._cur = got
        return got

    def get(self, f: int) -> tuple[np.ndarray, np.ndarray]:
        """(HR, LR) of clip frame ``f``; frames not held are asked for in order."""
        if f not in self.held:
            if f < self._next:
                raise AssertionError(f"clip {self.ref.clip!r}: frame {f} asked for again after it was let go")
            self._next = f + 1
            cur = self._cur
            while cur is None or f >= cur.seg.first + cur.seg.frames:
                cur = self._next_segment(f)
            t = f - cur.seg.first
            hr, lr, planar = cur.frame(t)
            cur.release(t)  # decoded once: held here until drop_below, not in the segment as well
            if planar:  # a decoded-cache entry's C x H x W views: as a decoded frame, H x W [x C]
                hr, lr = (a[0] if a.shape[0] == 1 else a.transpose(1, 2, 0) for a in (hr, lr))
            self.held[f] = (np.asarray(hr), np.asarray(lr))  # a tiled frame is read whole
        return self.held[f]

    def drop_below(self, f: int) -> None:
        for g in [g for g in self.held if g < f]:
            del self.held[g]

    def close(self) -> None:
        self._segs.close()
        self._cur = None
        self.held.clear()


def clip_val_pass(source: Source | MixSource, clips: Sequence[ClipRef], worker: int, cc: ClipConfig) -> Iterator[ValClip]:
    """The chunks of ``clips``, clip after clip. A clip with a bad segment or frame ends there: the error goes
    to the policy (``fail`` raises; ``skip`` counts it, and the clip's frames after it are not scored)."""
    for ref in clips:
        frames = _Frames(source, ref, worker)
        try:
            layout = chunks(frames.open(), cc)
            for n, (lo, hi, a, b) in enumerate(layout):
                item = _chunk(frames, ref.clip, cc, lo, hi, a, b)
                frames.drop_below(layout[n + 1][0] if n + 1 < len(layout) else hi)  # the next chunk's context stays
                yield item
        except SampleError as exc:
            source.errors(worker, exc)  # raises under fail
            log.warning("clip %r: frames from the bad sample on are not validated", ref.clip)
        except _Abandon:
            log.warning("clip %r: a segment was skipped; frames from there on are not validated", ref.clip)
        finally:
            frames.close()


def _chunk(frames: _Frames, clip: str, cc: ClipConfig, lo: int, hi: int, a: int, b: int) -> ValClip:
    pairs = [frames.get(f) for f in range(lo, hi)]
    lr = _nchw(np.stack([p[1] for p in pairs]))
    hr = _nchw(np.stack([p[0] for p in pairs[a - lo : b - lo]]))
    windows = None
    if cc.window == "center":
        rows = [[j - lo for j in center_window(c, frames.length, cc.frames, cc.val_padding)] for c in range(a, b)]
        if min(map(min, rows)) < 0 or max(map(max, rows)) >= hi - lo:
            raise AssertionError(f"a centre window of frames {a}..{b - 1} leaves chunk {lo}..{hi - 1}")
        windows = torch.tensor(rows, dtype=torch.int64)
    return ValClip(torch.from_numpy(lr), torch.from_numpy(hr), clip, lo, slice(a - lo, b - lo), frames.length, windows)


def _nchw(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a[:, None] if a.ndim == 3 else a.transpose(0, 3, 1, 2))


class ClipMeter:
    """PSNR/SSIM on Y per frame (``crop_border`` pixels cut, usually the scale), averaged per clip, then over
    clips: the REDS4 / Vid4 protocol. Each frame counts once; a frame given twice is an error. Across ranks,
    gather every rank's :meth:`state` and :meth:`merge` them."""

    def __init__(self, crop_border: int = 0, ssim: bool = True) -> None:
        self.crop_border, self.ssim = crop_border, ssim
        self.clips: dict[str, dict[str, Any]] = {}  # clip -> frames (clip length), scored (frame indices), psnr, ssim sums

    def add(self, item: ValClip, sr: torch.Tensor | np.ndarray) -> None:
        """``sr``: the model's output for the chunk's own frames (``[own frames, C, H, W]``), or for all its frames."""
        if len(sr) == len(item.lr) != len(item.hr):
            sr = sr[item.own]
        if len(sr) != len(item.hr):
            raise ValueError(f"clip {item.clip!r}: {len(sr)} SR frames for a chunk of {len(item.hr)} own frames")
        for i in range(len(item.hr)):
            self.add_frame(item.clip, item.first + item.own.start + i, item.clip_frames, sr[i], item.hr[i])

    def add_frame(self, clip: str, frame: int, clip_frames: int, sr: Any, hr: Any) -> None:
        c = self.clips.setdefault(clip, {"frames": clip_frames, "scored": set(), "psnr": 0.0, "ssim": 0.0})
        if frame in c["scored"] or not 0 <= frame < c["frames"] or clip_frames != c["frames"]:
            raise ValueError(f"clip {clip!r}: frame {frame} of {clip_frames} scored twice, or not in the clip")
        c["scored"].add(frame)
        c["psnr"] += float(psnr_y(sr, hr, self.crop_border))
        c["ssim"] += float(ssim_y(sr, hr, self.crop_border)) if self.ssim else 0.0

    def state(self) -> dict[str, Any]:
        """JSON-able per-clip sums (what ``torch.distributed.all_gather_object`` carries)."""
        return {k: {**c, "scored": sorted(c["scored"])} for k, c in self.clips.items()}

    def merge(self, state: dict[str, Any]) -> None:
        for clip, s in state.items():
            c = self.clips.setdefault(clip, {"frames": s["frames"], "scored": set(), "psnr": 0.0, "ssim": 0.0})
            if c["frames"] != s["frames"] or c["scored"] & set(s["scored"]):
                raise ValueError(f"clip {clip!r}: scored on two ranks, or of two lengths")
            c["scored"] |= set(s["scored"])
            c["psnr"] += s["psnr"]
            c["ssim"] += s["ssim"]

    def result(self) -> dict[str, Any]:
        """``psnr_y`` / ``ssim_y`` averaged over the clips whose every frame was scored (per clip, then over
        clips), ``clips`` per clip, and ``incomplete``: the clips with frames missing (left out of the means)."""
        n = {k: max(1, len(c["scored"])) for k, c in self.clips.items()}
        per = {
            k: {"psnr_y": c["psnr"] / n[k], "ssim_y": c["ssim"] / n[k], "frames": len(c["scored"])} for k, c in self.clips.items()
        }
        done = [k for k, c in self.clips.items() if len(c["scored"]) == c["frames"]]
        mean = {m: (sum(per[k][m] for k in done) / len(done) if done else math.nan) for m in ("psnr_y", "ssim_y")}
        return {**mean, "clips": per, "incomplete": sorted(set(self.clips) - set(done))}
