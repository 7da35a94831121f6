"""``wdsr preview``: a contact sheet of patch pairs, LR (nearest-upscaled) left of its HR, each row under
the key of the image it was cut from (when the dataset returns keys)."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from shardmaker import imaging
from shardmaker.imaging import Codec
from wdsr.dataset import SRDataset

LABEL_H = 12  # pixels of the key line above each row


def contact_sheet(ds: SRDataset, count: int = 8, gap: int = 4) -> np.ndarray:
    """HxWx3 uint8 image: one row per patch, ``[LR x s | HR]``; above it its key if ``ds`` returns keys."""
    s = ds.config.scale
    rows = []
    for batch in iter(ds):
        lr, hr = batch[0], batch[1]
        keys = batch[2] if ds.config.return_keys else [None] * len(lr)
        for a, b, key in zip(lr, hr, keys, strict=True):
            a8, b8 = _rgb8(a.numpy()), _rgb8(b.numpy())
            up = a8.repeat(s, axis=0).repeat(s, axis=1)
            sep = np.full((b8.shape[0], gap, 3), 255, np.uint8)
            row = np.concatenate([up, sep, b8], axis=1)
            rows.append(row if key is None else np.concatenate([_label(str(key), row.shape[1]), row], axis=0))
            if len(rows) == count:
                break
        if len(rows) == count:
            break
    if not rows:
        raise ValueError(f"{ds.url}: no patches to show")
    line = np.full((gap, rows[0].shape[1], 3), 255, np.uint8)
    return np.concatenate([x for r in rows for x in (r, line)][:-1], axis=0)


def _label(text: str, width: int) -> np.ndarray:
    """A white ``LABEL_H x width`` strip with ``text`` in black (cut to fit, ``...`` marking the cut)."""
    img = Image.new("RGB", (width, LABEL_H), "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    while len(text) > 1 and draw.textlength(text, font=font) > width - 2:
        text = text[:-4] + "..." if len(text) > 4 else text[:-1]
    draw.text((1, 0), text, fill="black", font=font)
    return np.asarray(img)


def _rgb8(chw: np.ndarray) -> np.ndarray:
    img = chw.transpose(1, 2, 0)
    if img.dtype == np.uint16:
        img = (img >> 8).astype(np.uint8)
    return np.repeat(img, 3, axis=2) if img.shape[2] == 1 else img


def write_png(path: str, img: np.ndarray) -> None:
    import fsspec

    with fsspec.open(path, "wb") as f:
        f.write(imaging.encode(img, Codec.PNG, 6))
