"""A val pass: every image of a worker's share once, in manifest order, whole or cut into
overlapping tiles (``wdsr.stitch`` puts the model's tiles back together)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch

from wdsr.pipeline.patches import Pair
from wdsr.pipeline.plan import SampleRef, Span
from wdsr.pipeline.source import MixSource, Source
from wdsr.pipeline.tiles import tile_boxes


class ValSample(NamedTuple):
    """A whole image (``boxes`` None) or all its tiles; LR-pixel boxes ``(y, x, h, w)`` to stitch."""

    lr: torch.Tensor  # [1 or T, C, h, w]
    hr: torch.Tensor  # [1 or T, C, s*h, s*w]
    key: str
    boxes: list[tuple[int, int, int, int]] | None
    lr_size: tuple[int, int]  # (w, h) of the whole LR image, like every size in wdsr and the manifest


def val_pass(
    source: Source | MixSource, items: Sequence[SampleRef], worker: int, scale: int, tile: int | None, overlap: int
) -> Iterator[ValSample]:
    """The samples ``items`` in order; a sample that cannot be used is skipped (``on_error="skip"``:
    counted and logged by the source's policy) or raises (``fail``)."""
    for ref in items:
        for pair in source.pairs([Span(ref.shard_index, ref.sample, ref.sample + 1)], worker):
            if pair is not None:
                yield val_sample(pair, scale, tile, overlap)


def val_sample(pair: Pair, scale: int, tile: int | None, overlap: int) -> ValSample:
    s = scale
    hr_img, lr_img = pair.hwc()
    lh, lw = lr_img.shape[:2]
    if tile is None:
        boxes = None
        lr, hr = lr_img[None], hr_img[None]
    else:
        boxes = tile_boxes(lh, lw, tile, overlap)
        lr = np.stack([lr_img[y : y + h, x : x + w] for y, x, h, w in boxes])
        hr = np.stack([hr_img[s * y : s * (y + h), s * x : s * (x + w)] for y, x, h, w in boxes])
    return ValSample(torch.from_numpy(_nchw(lr)), torch.from_numpy(_nchw(hr)), pair.key, boxes, (lw, lh))


def _nchw(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a[:, None] if a.ndim == 3 else a.transpose(0, 3, 1, 2))
