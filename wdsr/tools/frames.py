"""The frames of one clip for ``wdsr upscale``: read one at a time from a video file (PyAV, the ``video``
extra; its declared size checked against ``max_pixels`` before anything is decoded, every decoded frame
against the declared size) or a folder of frames (natural order: ``frame2`` before ``frame10``); written
as numbered PNG frames or as a lossless FFV1 video (``.mkv``), never over an existing output unless asked."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

import shardmaker
from shardmaker import format as fmt
from shardmaker import imaging, storage
from shardmaker.errors import require_extra
from shardmaker.imaging import Codec
from wdsr.tools.references import IMAGE_EXTS
from wdsr.tools.upscale import commit_output, part_name, read_image, write_output

FRAME_NAME = "frame_{:06d}.png"  # the numbered PNG frames written into OUT
DEFAULT_RATE = Fraction(25)  # frames per second of a video written from a folder of frames


def is_video_file(path: str | Path) -> bool:
    return Path(path).suffix.lower() in shardmaker.VIDEO_EXTENSIONS


@dataclasses.dataclass(frozen=True)
class Clip:
    """A clip to upscale: its source, its frame count and rate; :meth:`frames` reads them one by one."""

    source: Path
    count: int
    rate: Fraction
    files: tuple[Path, ...] = ()  # a folder's frames; empty for a video file
    max_pixels: int = fmt.DEFAULT_MAX_PIXELS
    pts: tuple[int, ...] = ()  # a video's frame timestamps, from open_clip's one demux

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"{self.source}: no frames")

    def frames(self) -> Iterator[np.ndarray]:
        """HxW[x3] uint8/uint16 frames in order, each the first one's size and kind."""
        it = (read_image(f) for f in self.files) if self.files else self._video()
        first: np.ndarray | None = None
        for n, frame in enumerate(it):
            if first is None:
                first = frame
            elif frame.shape != first.shape or frame.dtype != first.dtype:
                where = self.files[n] if self.files else f"{self.source}: frame {n}"
                raise ValueError(f"{where}: {_kind(frame)}, where frame 0 is {_kind(first)}")
            yield frame

    def _video(self) -> Iterator[np.ndarray]:
        # open_clip demuxed it once (its declared size checked); video_frames checks the stream again
        yield from shardmaker.video_frames(str(self.source), 0, self.count, pts=self.pts, max_pixels=self.max_pixels)


def _kind(a: np.ndarray) -> str:
    return f"{a.shape[1]}x{a.shape[0]} {'grey' if a.ndim == 2 else 'RGB'} {a.dtype}"


def open_clip(source: Path, max_pixels: int = fmt.DEFAULT_MAX_PIXELS) -> Clip:
    """A video file or a folder of frames (the image files directly in it), checked before any frame is read."""
    if source.is_dir():
        files = sorted(
            (f for f in source.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_EXTS),
            key=lambda f: shardmaker.natural_key(f.name),
        )
        if not files:
            raise FileNotFoundError(f"{source}: no frames ({', '.join(IMAGE_EXTS)}) in this folder")
        return Clip(source, len(files), DEFAULT_RATE, tuple(files), max_pixels)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such video file or folder of frames")
    if not is_video_file(source):
        raise ValueError(f"{source}: not a video file ({', '.join(shardmaker.VIDEO_EXTENSIONS)}) nor a folder of frames")
    _, pts = shardmaker.video_info(str(source), max_pixels=max_pixels)
    return Clip(source, len(pts), _rate(source), (), max_pixels, tuple(pts))


def _rate(path: Path) -> Fraction:
    av = require_extra("av", f"{path}: reading a video")
    with storage.open_regular(str(path)) as f, av.open(f, "r") as c:
        rate = c.streams.video[0].average_rate
    return Fraction(rate) if rate else DEFAULT_RATE


class PngFrames:
    """``OUT/frame_000000.png`` ...: an existing frame is refused before any work unless ``overwrite``."""

    def __init__(self, out: Path, overwrite: bool = False) -> None:
        self.out, self.overwrite, self.written = out, overwrite, 0
        if out.exists() and not out.is_dir():
            raise ValueError(f"{out}: a file is where the folder of upscaled frames would go")
        old = sorted(out.glob("frame_*.png")) if out.is_dir() else []
        if old and not overwrite:
            raise ValueError(f"{old[0]}: exists; give --overwrite to replace the frames in {out}")

    def __enter__(self) -> PngFrames:
        self.out.mkdir(parents=True, exist_ok=True)
        return self

    def write(self, frame: np.ndarray) -> None:
        write_output(self.out / FRAME_NAME.format(self.written), imaging.encode(frame, Codec.PNG, 6), self.overwrite)
        self.written += 1

    def __exit__(self, *exc: object) -> None:
        return None


class Ffv1Video:
    """A lossless FFV1 video in Matroska (``.mkv``) at ``rate``, written beside the target and moved onto it
    when complete (a reader never sees half a video; an existing target only with ``overwrite``). 8-bit."""

    def __init__(self, target: Path, rate: Fraction, overwrite: bool = False) -> None:
        self.av = require_extra("av", "wdsr upscale --video (writing an FFV1 video)")
        if target.suffix.lower() != ".mkv":
            raise ValueError(f"{target}: --video writes a Matroska file: give -o NAME.mkv")
        if os.path.lexists(target) and (not overwrite or target.is_dir()):
            raise ValueError(f"{target}: exists; give --overwrite to replace it")
        self.target, self.rate, self.overwrite, self.written = target, rate, overwrite, 0
        self._tmp = part_name(target, ".mkv")
        self._c: Any = None
        self._s: Any = None

    def __enter__(self) -> Ffv1Video:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._c = self.av.open(str(self._tmp), "w")
        return self

    def write(self, frame: np.ndarray) -> None:
        if frame.dtype != np.uint8:
            raise ValueError(f"{self.target}: --video writes 8-bit frames; these are {frame.dtype} (leave out --video for PNGs)")
        grey = frame.ndim == 2
        if self._s is None:
            self._s = self._c.add_stream("ffv1", rate=self.rate)
            self._s.width, self._s.height = frame.shape[1], frame.shape[0]
            self._s.pix_fmt = "gray" if grey else "bgr0"
        vf = self.av.VideoFrame.from_ndarray(frame, format="gray" if grey else "rgb24")
        for packet in self._s.encode(vf):
            self._c.mux(packet)
        self.written += 1

    def __exit__(self, kind: object, *exc: object) -> None:
        try:
            if kind is None and self._s is not None:
                for packet in self._s.encode():
                    self._c.mux(packet)
            self._c.close()
            if kind is None:
                commit_output(self._tmp, self.target, self.overwrite)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
