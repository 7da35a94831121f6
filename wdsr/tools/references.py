"""``wdsr upscale --hr``: each input image's HR reference, paired by name as ``shardmaker build --lr``
pairs LR files (:func:`shardmaker.hr_stem_of`: the same stem, or the stem with an ``x{s}`` suffix
removed, ``babyx4.png`` -> ``baby.png``; or as ``--lr-pattern`` says), and every pair checked by its
headers before any image is upscaled or written."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import shardmaker
from shardmaker import imaging, storage

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp")
_HEAD = 1 << 16


def image_size(path: Path) -> tuple[int, int]:
    """``(w, h)`` from the file's header (its first 64 KiB, or the whole file where needed: TIFF)."""
    try:
        with storage.open_regular(str(path)) as f:  # never a FIFO's hang
            head = f.read(_HEAD)
            try:
                return imaging.image_size(head, path.suffix)
            except imaging.ImageDataError:
                if len(head) < _HEAD:
                    raise
                head += f.read()
        return imaging.image_size(head, path.suffix)
    except imaging.ImageDataError as exc:
        raise ValueError(f"{path}: {exc}") from None


def fits(hr_size: tuple[int, int], lr_size: tuple[int, int], scale: int) -> bool:
    """HR is ``scale`` x LR, plus less than ``scale`` on a side (the usual mod-crop)."""
    return all(scale * lo <= hi < scale * lo + scale for hi, lo in zip(hr_size, lr_size, strict=True))


def pair_references(images: list[Path], hr_dir: Path, scale: int, lr_pattern: str | None = None) -> dict[Path, Path]:
    """Each image's HR file in ``hr_dir``, every pair checked before any work: an image without an HR
    image, whose name says another scale than the model's, or whose HR is not ``scale`` x its size
    (+ a mod-crop) is a ``ValueError`` (a ``FileNotFoundError`` when no HR is found) naming the file."""
    if not hr_dir.is_dir():
        raise FileNotFoundError(f"--hr {hr_dir}: no such folder")
    names = shardmaker.lr_name_pattern(lr_pattern) if lr_pattern is not None else None
    hr_files: dict[str, Path] = {}
    for f in sorted(hr_dir.iterdir()):
        if f.suffix.lower() in IMAGE_EXTS and f.is_file():
            hr_files.setdefault(f.stem, f)
    out: dict[Path, Path] = {}
    for image in images:
        stem, said = shardmaker.hr_stem_of(image.stem, hr_files, names)
        if stem is None:
            if names is not None:
                raise FileNotFoundError(f"{image}: no HR image in {hr_dir} named by --lr-pattern {lr_pattern!r}")
            raise FileNotFoundError(
                f"{image}: no HR image named {image.stem}.* in {hr_dir} (or, for a name ending in x<scale>, "
                "the name without it: babyx4.png pairs with baby.png)"
            )
        if said is not None and said != scale:
            raise ValueError(f"{image}: its name says x{said}, the model upscales x{scale} (HR: {hr_files[stem]})")
        lr_size, hr_size = image_size(image), image_size(hr_files[stem])
        if not fits(hr_size, lr_size, scale):
            raise ValueError(
                f"{hr_files[stem]}: HR {hr_size[0]}x{hr_size[1]} is not x{scale} the size of {image} "
                f"({lr_size[0]}x{lr_size[1]}; a mod-crop of less than {scale} px allowed)"
            )
        out[image] = hr_files[stem]
    return out


def crop_reference(hr: np.ndarray, path: Path, shape: tuple[int, ...], scale: int) -> np.ndarray:
    """The decoded HR image, mod-cropped to the SR size (larger by less than the scale)."""
    h, w = shape[:2]
    if not (h <= hr.shape[0] < h + scale and w <= hr.shape[1] < w + scale):
        raise ValueError(f"{path}: HR {hr.shape[1]}x{hr.shape[0]} does not match SR {w}x{h} (x{scale})")
    return hr[:h, :w]
