"""Overlapping tiles for whole-image validation, and stitching the model's output back."""

from __future__ import annotations

import torch


def _starts(n: int, tile: int, overlap: int) -> list[int]:
    if n <= tile:
        return [0]
    step = tile - overlap
    starts = list(range(0, n - tile, step))
    return starts + [n - tile]


def tile_boxes(h: int, w: int, tile: int, overlap: int) -> list[tuple[int, int, int, int]]:
    """``(y, x, th, tw)`` boxes covering an ``h x w`` image; tiles overlap by at least ``overlap``."""
    th, tw = min(tile, h), min(tile, w)
    return [(y, x, th, tw) for y in _starts(h, tile, overlap) for x in _starts(w, tile, overlap)]


def stitch(tiles: torch.Tensor, boxes: list[tuple[int, int, int, int]], scale: int, lr_size: tuple[int, int]) -> torch.Tensor:
    """Average ``[T, C, s*th, s*tw]`` output tiles into one ``[C, s*h, s*w]`` image.

    ``lr_size`` is the whole LR image's ``(w, h)``, as every size in wdsr and the manifest is;
    ``boxes`` are ``(y, x, h, w)`` LR-pixel boxes, as ``ValSample.boxes`` gives them.
    """
    lw, lh = lr_size
    if boxes and (max(y + h for y, _, h, _ in boxes) != lh or max(x + w for _, x, _, w in boxes) != lw):
        raise ValueError(f"stitch: the boxes cover an LR image other than lr_size={lr_size} (w, h)")
    c = tiles.shape[1]
    out = torch.zeros((c, scale * lh, scale * lw), dtype=torch.float64)
    weight = torch.zeros((1, scale * lh, scale * lw), dtype=torch.float64)
    for t, (y, x, h, w) in zip(tiles, boxes, strict=True):
        ys, xs = slice(scale * y, scale * (y + h)), slice(scale * x, scale * (x + w))
        out[:, ys, xs] += t.double()
        weight[:, ys, xs] += 1
    return (out / weight).to(tiles.dtype if tiles.is_floating_point() else torch.float32)
