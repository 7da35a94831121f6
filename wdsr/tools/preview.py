"""``wdsr preview``: a contact sheet of patch pairs, LR (nearest-upscaled) left of its HR."""

from __future__ import annotations

import numpy as np

from shardmaker import imaging
from shardmaker.imaging import Codec
from wdsr.dataset import SRDataset


def contact_sheet(ds: SRDataset, count: int = 8, gap: int = 4) -> np.ndarray:
    """HxWx3 uint8 image: one row per patch, ``[LR x s | HR]``."""
    s = ds.config.scale
    rows = []
    for lr, hr in iter(ds):
        for a, b in zip(lr, hr, strict=True):
            a8, b8 = _rgb8(a.numpy()), _rgb8(b.numpy())
            up = a8.repeat(s, axis=0).repeat(s, axis=1)
            sep = np.full((b8.shape[0], gap, 3), 255, np.uint8)
            rows.append(np.concatenate([up, sep, b8], axis=1))
            if len(rows) == count:
                break
        if len(rows) == count:
            break
    if not rows:
        raise ValueError(f"{ds.url}: no patches to show")
    line = np.full((gap, rows[0].shape[1], 3), 255, np.uint8)
    return np.concatenate([x for r in rows for x in (r, line)][:-1], axis=0)


def _rgb8(chw: np.ndarray) -> np.ndarray:
    img = chw.transpose(1, 2, 0)
    if img.dtype == np.uint16:
        img = (img >> 8).astype(np.uint8)
    return np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img


def write_png(path: str, img: np.ndarray) -> None:
    import fsspec

    with fsspec.open(path, "wb") as f:
        f.write(imaging.encode(img, Codec.PNG, 6))
