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
from shardmaker.imaging import codecs
from shardmaker.imaging.codecs import ImageDataError

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".mov", ".avi", ".webm")
DEFAULT_MAX_PIXELS = 1 << 28  # --max-pixels's default (a frame's declared width x height)


def video_info(
    url: str, storage_options: dict[str, Any] | None = None, max_pixels: int = DEFAULT_MAX_PIXELS, drop_alpha: bool = False
) -> tuple[tuple[int, int], list[int]]:
    """``((w, h), presentation timestamps of every frame in order)`` of a video's first video stream,
    from its packets alone (nothing is decoded). The stream's declared size is checked against
    ``max_pixels`` and its pixel format for alpha (refused unless ``drop_alpha``) before any packet is read."""
    av = require_extra("av", f"{url}: reading a video")

    try:
        with _open_video(url, storage_options) as c:
            if not c.streams.video:
                raise InputError(url, "has no video stream")
            s = c.streams.video[0]
            w, h = check_stream(url, s, max_pixels, drop_alpha)
            pts: list[int] = []
            for p in c.demux(s):
                if p.pts is not None:
                    pts.append(int(p.pts))
                    if len(pts) > MAX_CLIP_FRAMES:
                        raise InputError(url, f"has over {MAX_CLIP_FRAMES} frames")
    except av.FFmpegError as exc:
        raise InputError(url, f"not a readable video ({exc})") from None
    if not pts or w < 1 or h < 1:
        raise InputError(url, "has no frames")
    return (w, h), sorted(pts)


def check_stream(url: str, stream: Any, max_pixels: int, drop_alpha: bool) -> tuple[int, int]:
    """A video stream's declared ``(w, h)`` (from the container, nothing decoded), within ``max_pixels``;
    a pixel format with alpha is refused unless ``drop_alpha`` (the rule for images)."""
    cc = stream.codec_context
    w, h = int(cc.width), int(cc.height)
    try:
        codecs.check_pixels(w, h, max_pixels)
    except ImageDataError as exc:
        raise InputError(url, f"video stream: {exc}") from None
    fmt = cc.format
    if not drop_alpha and fmt is not None and _has_alpha(fmt):
        raise InputError(url, f"its pixel format {fmt.name} has an alpha channel; pass --drop-alpha to ignore it")
    return w, h


def _has_alpha(fmt: Any) -> bool:
    return any(c.is_alpha for c in fmt.components)


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
    url: str,
    first: int,
    count: int,
    storage_options: dict[str, Any] | None = None,
    pts: tuple[int, ...] = (),
    max_pixels: int = DEFAULT_MAX_PIXELS,
    drop_alpha: bool = False,
) -> Iterator[np.ndarray]:
    """Frames ``first .. first + count - 1`` (in presentation order) of a video, frame-exactly: seek
    to the keyframe before the first, decode forward and keep frames by their timestamps. RGB (or
    grey) uint8, or uint16 for sources of more than 8 bits. ``pts``: those frames' timestamps, as
    :func:`video_info` gave them at scan time (a build demuxes each video once, not once a segment:
    that made a long video's build quadratic in its length); without them the video is demuxed here.
    The stream is checked as :func:`video_info` checks it, and a decoded frame must be the stream's
    declared size before it is converted (a frame larger than declared is refused, never converted)."""
    av = require_extra("av", f"{url}: reading a video")

    if pts:
        want, total = list(pts), first + len(pts)
    else:
        _, every = video_info(url, storage_options, max_pixels, drop_alpha)
        want, total = every[first : first + count], len(every)
    if len(want) != count:
        raise InputError(url, f"has {total} frames, not {first + count}")
    try:
        with _open_video(url, storage_options) as c:
            s = c.streams.video[0]
            size = check_stream(url, s, max_pixels, drop_alpha)
            c.seek(want[0], stream=s, backward=True, any_frame=False)
            got = 0
            for frame in c.decode(s):
                if frame.pts is None or frame.pts < want[0]:
                    continue
                if frame.pts != want[got]:
                    raise InputError(url, f"frame {first + got}: decoded timestamp {frame.pts}, expected {want[got]}")
                if (frame.width, frame.height) != size:
                    raise InputError(
                        url, f"frame {first + got} is {frame.width}x{frame.height}, the stream declares {size[0]}x{size[1]}"
                    )
                if not drop_alpha and _has_alpha(frame.format):
                    raise InputError(url, f"frame {first + got} has an alpha channel; pass --drop-alpha to ignore it")
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
