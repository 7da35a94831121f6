"""``wdsr preview``: a contact sheet of patch pairs, LR (nearest-upscaled) left of its HR, each row under
a label: the key of the image it was cut from, the patch's index and its transform.

The patches are the ones epoch 0 of training cuts from the dataset's first images (the stream's own
``cut_patches``, with the same seed, draws and flat-patch rejection), ``per_image`` from each, in
manifest order rather than through the shuffle buffer: so each can say what it is. On a clip dataset, rows
are windows of frames (:func:`clip_sheet`), drawn the same way."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from shardmaker import imaging
from shardmaker.imaging import Codec
from wdsr.config import DatasetConfig, Split
from wdsr.dataset import SRDataset
from wdsr.degrade import Degrader
from wdsr.errors import SampleError
from wdsr.pipeline.batch import collate
from wdsr.pipeline.clips import Window
from wdsr.pipeline.degraded import as_batch, param_rows
from wdsr.pipeline.patches import Patch, PatchConfig, cut_patches
from wdsr.pipeline.sample import first_folder_clips
from wdsr.pipeline.whole import DecodedPair

LABEL_H = 12  # pixels of the label line above each row
# transform t: rotate t % 4 quarter turns counter-clockwise, then mirror left-right if t >= 4
TRANSFORMS = ("as is", "rot 90", "rot 180", "rot 270", "flip", "rot 90 + flip", "rot 180 + flip", "rot 270 + flip")


def label_of(key: str, patch: Patch) -> str:
    return f"{key}  #{patch.j}  {TRANSFORMS[patch.t]}"


def labelled_patches(url: str, config: DatasetConfig, count: int, per_image: int = 2) -> list[tuple[Patch, str]]:
    """The first ``count`` patches epoch 0 cuts, ``per_image`` from each image in manifest order,
    each with its label; images too small for a patch are passed over."""
    val = SRDataset(url, config=dataclasses.replace(config, split=Split.VAL, tile=None, return_keys=False))
    spec = PatchConfig(config.scale, config.patch_size, config.augment, config.min_patch_std)
    out: list[tuple[Patch, str]] = []
    for sample in val:
        lr, hr = (_hwc(t.numpy()[0]) for t in (sample.lr, sample.hr))
        pair = DecodedPair("", sample.key, 0, hr, lr, 0, 0)
        try:
            patches, _ = cut_patches(pair, spec, config.seed, 0, 0, min(per_image, count - len(out)))
        except SampleError:
            continue  # smaller than one patch
        out += [(p, label_of(sample.key, p)) for p in patches]
        if len(out) == count:
            break
    return out


def degraded_pairs(url: str, config: DatasetConfig, count: int, per_image: int = 2) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """``config.degrade``'s (LR, HR) pairs (CHW uint8; the HR is the training target, e.g. sharpened) of
    the first ``count`` patches epoch 0 cuts, ``per_image`` from each image in manifest order: each
    HR patch with the parameters training draws for it, degraded by ``wdsr.Degrader`` on the CPU."""
    ds = SRDataset(url, config=dataclasses.replace(config, return_keys=False))
    spec = config.patch_config()
    got: list[Patch] = []
    for pair in ds.decoded_in_order():
        try:
            patches, _ = cut_patches(pair, spec, config.seed, 0, 0, min(per_image, count - len(got)))
        except SampleError:
            continue  # smaller than one patch
        got += patches
        if len(got) == count:
            break
    if not got:
        return []
    hr, params = as_batch(collate(got, False, param_rows(got)))
    lr, target = Degrader(config.degrade)(hr, params)

    def u8(x: torch.Tensor) -> np.ndarray:
        return (x * 255.0).round().clamp(0, 255).to(torch.uint8).numpy()

    return [(u8(lr[i]), u8(target[i]), label_of(p.key, p)) for i, p in enumerate(got)]


def contact_sheet(url: str, config: DatasetConfig, count: int = 8, per_image: int = 2, gap: int = 4) -> np.ndarray:
    """HxWx3 uint8 image: one row per patch, ``[LR x s | HR]`` under its label (key, index, transform);
    with ``config.degrade``, the LR is the degraded one (:func:`degraded_pairs`; ``arbitrary``'s is
    nearest-upscaled to its HR, its float scale being the batch's)."""
    rows = []
    if config.degrade is not None:
        pairs = degraded_pairs(url, config, count, per_image)
    else:
        pairs = [(p.lr, p.hr, label) for p, label in labelled_patches(url, config, count, per_image)]
    for lr, hr, label in pairs:
        a8, b8 = _rgb8(lr), _rgb8(hr)
        up = _nearest(a8, b8.shape[0], b8.shape[1])
        sep = np.full((b8.shape[0], gap, 3), 255, np.uint8)
        row = np.concatenate([up, sep, b8], axis=1)
        rows.append(np.concatenate([label_strip(label, row.shape[1]), row], axis=0))
    if not rows:
        raise ValueError(f"{url}: no image is large enough for a {config.patch_size}-pixel patch")
    line = np.full((gap, rows[0].shape[1], 3), 255, np.uint8)
    return np.concatenate([x for r in rows for x in (r, line)][:-1], axis=0)


def labelled_windows(url: str, config: DatasetConfig, count: int, per_clip: int = 2) -> list[tuple[Window, str]]:
    """Clip datasets: the first ``count`` windows epoch 0 cuts (``config.clip``'s frames, crop and transform,
    as the stream's own ``cut_windows`` draws them), ``per_clip`` from each segment in manifest order, each
    labelled with its key, index, frames and transform; segments too small for a window are passed over."""
    ds = SRDataset(url, config=dataclasses.replace(config, return_keys=False))
    out: list[tuple[Window, str]] = []
    for clip in ds.decoded_in_order():
        try:
            windows, _ = cut_patches(clip, config.patch_config(), config.seed, 0, 0, min(per_clip, count - len(out)))
        except SampleError:
            continue  # smaller than one patch, or no window starts in it
        for w in windows:
            out.append((w, f"{w.key}  #{w.j}  frames {w.frames[0]}..{w.frames[-1]}  {TRANSFORMS[w.t]}"))
        if len(out) == count:
            break
    return out


def clip_sheet(url: str, config: DatasetConfig, count: int = 4, per_clip: int = 2, gap: int = 4) -> np.ndarray:
    """HxWx3 uint8 image of clip windows (``config.clip``, recurrent: every frame's HR): one row per window
    under its label, one cell per frame in the window's order, each ``[LR x s | HR]``; cells ``2 * gap`` apart."""
    rows = []
    for w, label in labelled_windows(url, config, count, per_clip):
        cells = []
        for lr, hr in zip(w.lr, w.hr, strict=True):
            a8, b8 = _rgb8(lr), _rgb8(hr)
            cells.append(np.concatenate([_nearest(a8, *b8.shape[:2]), np.full((b8.shape[0], gap, 3), 255, np.uint8), b8], 1))
        sep = np.full((cells[0].shape[0], 2 * gap, 3), 255, np.uint8)
        row = np.concatenate([x for c in cells for x in (c, sep)][:-1], axis=1)
        rows.append(np.concatenate([label_strip(label, row.shape[1]), row], axis=0))
    if not rows:
        raise ValueError(f"{url}: no clip segment holds a window of {config.patch_size}-pixel patches")
    line = np.full((gap, rows[0].shape[1], 3), 255, np.uint8)
    return np.concatenate([x for r in rows for x in (r, line)][:-1], axis=0)


def is_clips(url: str) -> bool:
    """Whether ``url``'s (first) dataset holds clips (``shardmaker build --clips``)."""
    return first_folder_clips(url)[1]


def _nearest(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """``img`` (HxWxC) nearest-upscaled to ``h x w``: each pixel repeated ``s`` times at an integer scale s."""
    rows = np.arange(h) * img.shape[0] // h
    cols = np.arange(w) * img.shape[1] // w
    return img[rows][:, cols]


def _hwc(chw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(chw[0] if chw.shape[0] == 1 else chw.transpose(1, 2, 0))


def label_strip(text: str, width: int) -> np.ndarray:
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
