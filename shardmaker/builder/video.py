"""Video files as clips: frame sizes and timestamps from packets alone, and frames decoded
frame-exactly (seek to the keyframe before, keep frames by their timestamps) through PyAV."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from fsspec.core import url_to_fs

from shardmaker import storage
from shardmaker.errors import InputError, require_extra
from shardmaker.format import MAX_CLIP_FRAMES

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".mov", ".avi", ".webm")


def video_info(url: str, storage_options: dict[str, Any] | None = None) -> tuple[tuple[int, int], list[int]]:
    """``((w, h), presentation timestamps of every frame in order)`` of a video's first video stream,
    from its packets alone (nothing is decoded)."""
    av = require_extra("av", f"{url}: reading a video")

    try:
        with _open_video(url, storage_options) as c:
            if not c.streams.video:
                raise InputError(url, "has no video stream")
            s = c.streams.video[0]
            pts: list[int] = []
            for p in c.demux(s):
                if p.pts is not None:
                    pts.append(int(p.pts))
                    if len(pts) > MAX_CLIP_FRAMES:
                        raise InputError(url, f"has over {MAX_CLIP_FRAMES} frames")
            w, h = int(s.codec_context.width), int(s.codec_context.height)
    except av.FFmpegError as exc:
        raise InputError(url, f"not a readable video ({exc})") from None
    if not pts or w < 1 or h < 1:
        raise InputError(url, "has no frames")
    return (w, h), sorted(pts)


class _open_video:  # noqa: N801 - a context manager used like open()
    """A video container on a local path or an fsspec URL (a regular file: never blocks)."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None) -> None:
        av = require_extra("av", f"{url}: reading a video")

        fs, path = url_to_fs(url, **(storage_options or {}))
        self._f = storage.open_input(fs, path)
        try:
            self._c = av.open(self._f, "r")
        except BaseException:
            self._f.close()
            raise

    def __enter__(self) -> Any:
        return self._c

    def __exit__(self, *exc: object) -> None:
        self._c.close()
        self._f.close()


def video_frames(
    url: str, first: int, count: int, storage_options: dict[str, Any] | None = None, pts: tuple[int, ...] = ()
) -> Iterator[np.ndarray]:
    """Frames ``first .. first + count - 1`` (in presentation order) of a video, frame-exactly: seek
    to the keyframe before the first, decode forward and keep frames by their timestamps. RGB (or
    grey) uint8, or uint16 for sources of more than 8 bits. ``pts``: those frames' timestamps, as
    :func:`video_info` gave them at scan time (a build demuxes each video once, not once a segment:
    that made a long video's build quadratic in its length); without them the video is demuxed here."""
    av = require_extra("av", f"{url}: reading a video")

    if pts:
        want, total = list(pts), first + len(pts)
    else:
        _, every = video_info(url, storage_options)
        want, total = every[first : first + count], len(every)
    if len(want) != count:
        raise InputError(url, f"has {total} frames, not {first + count}")
    try:
        with _open_video(url, storage_options) as c:
            s = c.streams.video[0]
            c.seek(want[0], stream=s, backward=True, any_frame=False)
            got = 0
            for frame in c.decode(s):
                if frame.pts is None or frame.pts < want[0]:
                    continue
                if frame.pts != want[got]:
                    raise InputError(url, f"frame {first + got}: decoded timestamp {frame.pts}, expected {want[got]}")
                yield _pixels(frame)
                got += 1
                if got == count:
                    return
    except av.FFmpegError as exc:
        raise InputError(url, f"decoding failed ({exc})") from None
    raise InputError(url, f"ended after {got} of frames {first}..{first + count - 1}")


def _pixels(frame: Any) -> np.ndarray:
    fmt = frame.format
    deep = max(c.bits for c in fmt.components) > 8
    grey = fmt.name.startswith("gray")
    out = frame.to_ndarray(format=("gray16le" if deep else "gray") if grey else ("rgb48le" if deep else "rgb24"))
    return np.ascontiguousarray(out)
