"""``wdsr upscale`` of a clip (a video file or a folder of frames), in bounded memory: frames are read one
at a time and at most a chunk of them is held.

An image model upscales frame by frame (``upscale_image``: tiled as images are). A video model (``tinyvsr``)
runs over sliding chunks of at most ``chunk`` frames that overlap by ``T // 2`` context frames each side,
the layout of the val pass (``wdsr.pipeline.clipval.chunks``): a recurrent model runs over a chunk and
keeps its own frames, so every frame has ``T // 2`` frames of context each side where the clip has them
(at the clip's ends, what the clip has); a centre-window model runs once per frame on the ``T`` frames
around it, padded at the clip's ends as BasicSR pads them (``reflection_circle``). ``T`` and the window
kind are the checkpoint's (``clip_frames``, ``clip_window``). Video models take whole frames (no tiles).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from wdsr.loader import to_float
from wdsr.pipeline.clips import MAX_FRAMES
from wdsr.pipeline.clipval import center_window, chunk_ranges
from wdsr.tools.frames import Clip
from wdsr.tools.upscale import Loaded, upscale_image
from wdsr.train.checkpoint import RunError
from wdsr.train.models import ModelName

X = TypeVar("X")
CHUNK = 16  # frames per chunk of a video model (at least 4 * (T // 2) + 1: half of each its own)
_WINDOWS_AT_ONCE = 4


@dataclasses.dataclass(frozen=True)
class VideoWindow:
    """How a video model sees a clip: windows of ``frames`` frames, ``center`` (one output per window) or not."""

    frames: int
    center: bool

    def __post_init__(self) -> None:
        if not 1 <= self.frames <= MAX_FRAMES or (self.center and self.frames % 2 == 0):
            raise ValueError(f"a video model's window must be 1..{MAX_FRAMES} frames (odd when centred), got {self.frames}")

    @property
    def context(self) -> int:
        return self.frames // 2

    @property
    def chunk(self) -> int:
        return max(CHUNK, 4 * self.context + 1)


def is_video_model(m: Loaded) -> bool:
    return m.name in {n.value for n in ModelName if n.video}


def trained_window(m: Loaded) -> VideoWindow:
    """The window a video model was trained on, from its checkpoint's config (``clip_frames``, ``clip_window``)."""
    frames, window = m.config.get("clip_frames"), m.config.get("clip_window")
    if isinstance(frames, bool) or not isinstance(frames, int) or window not in ("recurrent", "center"):
        raise RunError(f"{m.source}: a video model without its training window (clip_frames, clip_window) in its config")
    try:
        return VideoWindow(frames, window == "center")
    except ValueError as exc:
        raise RunError(f"{m.source}: {exc}") from None


def chunks(frames: Iterator[X], length: int, size: int, context: int) -> Iterator[tuple[list[X], int, int, int]]:
    """``(frames lo .. hi - 1, lo, a, b)`` per chunk of ``clipval.chunk_ranges(length, size, context)``,
    scoring frames ``a .. b - 1``, read from a stream of ``length`` frames with at most ``size`` held."""
    if size < 2 * context + 1:
        raise ValueError(f"chunks of {size} frames leave none of their own between {context} context frames each side")
    held: deque[X] = deque()
    first, it = 0, iter(frames)  # first: the frame held[0] is
    for lo, hi, a, b in chunk_ranges(length, size, context):
        while first < lo:
            held.popleft()
            first += 1
        while first + len(held) < hi:
            x = next(it, None)
            if x is None:
                raise ValueError(f"the clip ended at frame {first + len(held)}, not {length}")
            held.append(x)
        yield list(held), lo, a, b


def _frames_tensor(frames: Sequence[np.ndarray], channels: int) -> torch.Tensor:
    """HxW[x3] frames -> ``[n, channels, h, w]`` (a grey clip for an RGB model: its plane three times)."""
    x = torch.from_numpy(np.ascontiguousarray(np.stack([f if f.ndim == 3 else f[:, :, None] for f in frames])))
    x = x.permute(0, 3, 1, 2)
    if x.shape[1] == channels:
        return x
    if x.shape[1] == 1:
        return x.expand(-1, channels, -1, -1)
    raise ValueError(f"RGB frames for a grey ({channels}-channel) video model")


def _to_frames(sr: torch.Tensor, like: np.ndarray) -> list[np.ndarray]:
    """The model's float ``[n, C, H, W]`` -> HxW[x3] frames of ``like``'s dtype and channels (an RGB model's
    output of a grey clip: the mean of its planes)."""
    if like.ndim == 2 and sr.shape[1] > 1:
        sr = sr.mean(1, keepdim=True)
    top = 65535.0 if like.dtype == np.uint16 else 255.0
    q = (sr.clamp(0, 1) * top).round().to(torch.int32).numpy().astype(like.dtype)
    return [np.ascontiguousarray(f[0] if like.ndim == 2 else f.transpose(1, 2, 0)) for f in q]


@torch.no_grad()
def _run(m: Loaded, x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Integer clips ``[B, T, C, h, w]`` -> the model's float output on the CPU."""
    return m.model(to_float(x.to(device))).float().cpu()


def video_sr(m: Loaded, clip: Clip, win: VideoWindow, device: torch.device) -> Iterator[np.ndarray]:
    """The SR frames of ``clip`` in order, a chunk at a time."""
    for frames, lo, a, b in chunks(clip.frames(), clip.count, win.chunk, win.context):
        x = _frames_tensor(frames, m.channels)
        if win.center:
            rows = torch.tensor([[j - lo for j in center_window(f, clip.count, win.frames)] for f in range(a, b)])
            parts = [_run(m, x[rows[i : i + _WINDOWS_AT_ONCE]], device) for i in range(0, len(rows), _WINDOWS_AT_ONCE)]
            sr = torch.cat([p[:, win.context] for p in parts])
        else:
            sr = _run(m, x[None], device)[0, a - lo : b - lo]
        if not torch.isfinite(sr).all():
            raise RunError(f"{m.source}: the model's output holds inf or NaN for frames {a}..{b - 1}; stopped")
        yield from _to_frames(sr, frames[0])


def upscale_clip(m: Loaded, clip: Clip, writer: Any, tile: int | None, overlap: int, device: torch.device) -> int:
    """Every frame of ``clip`` upscaled into ``writer`` (``PngFrames`` or ``Ffv1Video``), in order; the count."""
    if is_video_model(m):
        out = video_sr(m, clip, trained_window(m), device)
    else:
        out = (upscale_image(m, f, tile, overlap, device) for f in clip.frames())
    with writer:
        for frame in out:
            writer.write(frame)
    if writer.written != clip.count:
        raise RunError(f"{clip.source}: {writer.written} frames upscaled of {clip.count}")
    return int(writer.written)
