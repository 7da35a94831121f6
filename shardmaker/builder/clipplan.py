"""How clips are cut into samples (segments of consecutive frames that overlap by ``max_span - 1``,
each owning a range of window starts): :class:`ClipOptions`, :func:`plan_segments`, and the
:class:`ClipPart` a segment's pair carries from the scan to the worker that encodes it."""

from __future__ import annotations

import dataclasses

from shardmaker.format import MAX_SEGMENT

DEFAULT_SEGMENT, DEFAULT_MAX_SPAN = 100, 16


@dataclasses.dataclass(frozen=True)
class ClipOptions:
    """How clips are cut into samples: at most ``segment`` frames each, windows of up to
    ``max_span`` frames (``(T - 1) * interval + 1``) always inside one segment."""

    segment: int = DEFAULT_SEGMENT
    max_span: int = DEFAULT_MAX_SPAN

    def __post_init__(self) -> None:
        if not (type(self.segment) is int and type(self.max_span) is int and 1 <= self.max_span <= self.segment <= MAX_SEGMENT):
            raise ValueError(
                f"clips need 1 <= max_span <= segment <= {MAX_SEGMENT} frames, got segment={self.segment!r}, "
                f"max_span={self.max_span!r}"
            )


@dataclasses.dataclass(frozen=True)
class ClipPart:
    """One segment of a clip: its frames' sources and the window starts it owns (clip frame indices)."""

    clip: str  # the clip's key
    first: int  # the clip index of the segment's first frame
    count: int
    clip_frames: int
    owned: tuple[int, int]  # window starts [a, b) this segment owns
    hr_frames: tuple[str, ...]  # frame URLs; () for a video (Pair.hr is the video)
    lr_frames: tuple[tuple[int, tuple[str, ...]], ...] = ()  # per provided LR scale: frame URLs; () for videos
    names: tuple[str, ...] = ()  # the frames' source names (a video's: frame numbers)
    # a video's: the segment's presentation timestamps, from the one demux at scan time (HR; per LR scale),
    # so that its worker seeks straight to them instead of demuxing the whole video again
    hr_pts: tuple[int, ...] = ()
    lr_pts: tuple[tuple[int, tuple[int, ...]], ...] = ()


def plan_segments(frames: int, opts: ClipOptions) -> list[tuple[int, int, int, int]]:
    """``(first, count, owned_start, owned_stop)`` of each segment of a clip of ``frames`` frames."""
    if frames <= opts.segment:
        return [(0, frames, 0, frames)]
    overlap = opts.max_span - 1
    full = frames - overlap  # starts of windows of max_span frames
    stride = opts.segment - overlap
    n = -(-full // stride)
    sizes = [full // n + (i < full % n) for i in range(n)]
    out, a = [], 0
    for i, p in enumerate(sizes):
        last = i == n - 1
        stop = frames if last else a + p
        out.append((a, (frames if last else a + p + overlap) - a, a, stop))
        a += p
    return out
