"""BasicSR's PairedImageDataset augmentation as the peer arms run it: one aligned random patch of a
decoded (BGR, HWC) pair, random h/v flips and transpose, then RGB CHW tensors. Shared by
``bench.peers`` (BasicSR's LMDB recipe) and ``bench.litdata_arm`` (LitData's raw path)."""

from __future__ import annotations

import cv2
import numpy as np
import torch

SCALE, PATCH = 4, 192


def paired_crop(gt: np.ndarray, lq: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lq, gt)`` patches as CHW tensors of the inputs' dtype: BasicSR's ``paired_random_crop`` then
    ``augment`` (global ``np.random``, as BasicSR draws)."""
    p = PATCH // SCALE
    top, left = np.random.randint(0, lq.shape[0] - p + 1), np.random.randint(0, lq.shape[1] - p + 1)
    lq = lq[top : top + p, left : left + p]
    gt = gt[top * SCALE : (top + p) * SCALE, left * SCALE : (left + p) * SCALE]
    hflip, vflip, rot = np.random.random() < 0.5, np.random.random() < 0.5, np.random.random() < 0.5
    out = []
    for img in (lq, gt):
        if hflip:
            img = cv2.flip(img, 1)
        if vflip:
            img = cv2.flip(img, 0)
        if rot:
            img = img.transpose(1, 0, 2)
        img = cv2.cvtColor(np.ascontiguousarray(img), cv2.COLOR_BGR2RGB)
        out.append(torch.from_numpy(img.transpose(2, 0, 1).copy()))
    return out[0], out[1]
