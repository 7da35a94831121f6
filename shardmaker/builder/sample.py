"""Per-sample work for image samples, run in build worker processes: read, check, make LR, encode,
describe (clip samples: :mod:`.segment`; what both share: :mod:`.images`, :mod:`.pack`)."""

from __future__ import annotations

import numpy as np

from shardmaker import deprecation
from shardmaker.builder.images import (
    AUTO_TILE_PIXELS,
    MAX_REGION,
    MIN_REGION,
    LrMethod,
    SampleConfig,
    SourceImage,
    check_kind,
    check_lr,
    check_scale,
    describe_kind,
    encode_image,
    load_whole,
    tile_side,
    whole_lr,
)
from shardmaker.builder.pack import EncodedSample, pack_sample
from shardmaker.builder.regions import region_lr, valid_share
from shardmaker.builder.segment import encode_segment
from shardmaker.builder.sources import Pair, Skipped
from shardmaker.errors import InputError, OnError
from shardmaker.format import TILED, SampleHeader, hr_member, lr_member
from shardmaker.imaging.codecs import Codec, ImageDataError
from shardmaker.imaging.resize import ResizeMethod

__all__ = [
    "AUTO_TILE_PIXELS",
    "MAX_REGION",
    "MIN_REGION",
    "EncodedSample",
    "LrMethod",
    "OnError",
    "SampleConfig",
    "SourceImage",
    "encode_or_skip",
    "encode_sample",
]


def _lr_images(pair: Pair, hr: np.ndarray, cfg: SampleConfig) -> dict[int, tuple[np.ndarray, str | None]]:
    """scale -> (LR array, LR source relative path or None when generated)."""
    h, w = hr.shape[:2]
    out: dict[int, tuple[np.ndarray, str | None]] = {}
    if cfg.lr_method is LrMethod.PROVIDED:
        for s, url, rel in pair.lr:
            lr = load_whole(url, cfg)
            check_lr(url, (h, w), lr.shape[:2], s, cfg.mod_crop)
            check_kind(url, lr, describe_kind(hr))
            out[s] = (lr, rel)
        return out
    if cfg.lr_method is LrMethod.NONE:
        return out
    method = cfg.lr_method.resize
    assert method is not None
    if method is ResizeMethod.MATLAB_UINT8 and hr.dtype != np.uint8:
        raise InputError(pair.hr, "16-bit image: --lr-method matlab-uint8 takes 8-bit images only (use matlab)")
    for s in sorted(cfg.scales):
        check_scale(pair.hr, (h, w), s, cfg.mod_crop)
        out[s] = (whole_lr(hr, s, method), None)
    return out


def _region_images(
    pair: Pair, src: SourceImage, cfg: SampleConfig
) -> tuple[np.ndarray, dict[int, tuple[np.ndarray, str | None]]] | Skipped:
    """A region sample's HR and LR images, read by region (the whole source is never held): LR made
    MATLAB-exactly from the region and a margin (equal to the crop of the whole image's LR), or the
    matching region of each provided LR image. ``Skipped`` (``valid`` set) for a region under
    ``--min-valid``."""
    r, (W, H) = pair.region, pair.image_size or pair.hr_size
    assert r is not None
    if (src.width, src.height) != (W, H):
        raise InputError(pair.hr, f"is {src.width}x{src.height} now, {W}x{H} when the build planned its regions")
    if cfg.min_valid > 0 and src.sparse(r.y, r.x, r.h, r.w):  # zeros, 0% content: dropped without a decode
        return Skipped(pair.hr, f"region is sparse (no TIFF segment written), under --min-valid {cfg.min_valid:g}", pair.key, 0.0)
    if cfg.lr_method is LrMethod.PROVIDED:
        hr = src.read(r.y, r.x, r.h, r.w)
        if (dropped := _dropped(pair, hr, cfg)) is not None:
            return dropped
        lrs: dict[int, tuple[np.ndarray, str | None]] = {}
        for s, url, rel in pair.lr:
            with SourceImage(url, cfg) as lsrc:
                lh, lw = (min(r.y + r.h, s * lsrc.height) - r.y) // s, (min(r.x + r.w, s * lsrc.width) - r.x) // s
                check_lr(url, (H, W), (lsrc.height, lsrc.width), s, cfg.mod_crop)
                if lh < 1 or lw < 1:
                    raise InputError(url, f"LR {lsrc.width}x{lsrc.height} does not fit HR {W}x{H} at scale {s}")
                lr = np.ascontiguousarray(lsrc.read(r.y // s, r.x // s, lh, lw))
            check_kind(url, lr, describe_kind(hr))
            lrs[s] = (lr, rel)
        return hr, lrs
    if cfg.lr_method is LrMethod.NONE:  # HR only: a region sample is an image of its own
        hr = src.read(r.y, r.x, r.h, r.w)
        dropped = _dropped(pair, hr, cfg)
        return (hr, {}) if dropped is None else dropped
    method = cfg.lr_method.resize
    assert method is not None
    m = 3 * max(cfg.scales)  # region_lr's margin at the largest scale
    by, bx = max(0, r.y - m), max(0, r.x - m)
    buf = src.read(by, bx, min(H, r.y + r.h + m) - by, min(W, r.x + r.w + m) - bx)
    hr = buf[r.y - by : r.y - by + r.h, r.x - bx : r.x - bx + r.w]
    if (dropped := _dropped(pair, hr, cfg)) is not None:
        return dropped
    if method is ResizeMethod.MATLAB_UINT8 and hr.dtype != np.uint8:
        raise InputError(pair.hr, "16-bit image: --lr-method matlab-uint8 takes 8-bit images only (use matlab)")

    def read(y: int, x: int, h: int, w: int) -> np.ndarray:
        return buf[y - by : y - by + h, x - bx : x - bx + w]

    lrs = {}
    for s in sorted(cfg.scales):
        check_scale(pair.hr, (H, W), s, cfg.mod_crop)
        try:
            lrs[s] = (region_lr(read, (H, W), r, s, method), None)
        except ValueError as exc:  # a region thinner than the scale (an image of a few pixels on one side)
            raise InputError(pair.hr, str(exc)) from None
    return hr, lrs


def _dropped(pair: Pair, hr: np.ndarray, cfg: SampleConfig) -> Skipped | None:
    """A sample under ``--min-valid``: its share of non-flat content is too small (not an error)."""
    if cfg.min_valid <= 0:
        return None
    share = valid_share(hr)
    if share >= cfg.min_valid:
        return None
    what = "region" if pair.region is not None else "image"
    return Skipped(pair.hr, f"{what} is {share:.1%} content, under --min-valid {cfg.min_valid:g}", pair.key, round(share, 4))


def encode_sample(pair: Pair, cfg: SampleConfig) -> EncodedSample | Skipped:
    """Build one sample's tar members: ``{key}.json``, ``{key}.hr.ext``, ``{key}.lr_x{s}.ext`` (ext
    ``tiles`` for an image stored tiled: :func:`tile_side`). A region sample (``pair.region``) is
    read by region. A ``Skipped`` with ``valid`` set for a sample under ``--min-valid``."""
    with SourceImage(pair.hr, cfg) as src:
        if pair.region is None:
            hr = src.whole()
            if (dropped := _dropped(pair, hr, cfg)) is not None:
                return dropped
            lrs = _lr_images(pair, hr, cfg)
        else:
            got = _region_images(pair, src, cfg)
            if isinstance(got, Skipped):
                return got
            hr, lrs = got
    h, w = hr.shape[:2]
    tile = tile_side(cfg, (h, w), sorted(lrs))
    ext = Codec(cfg.codec).value if tile is None else TILED
    members: dict[str, bytes] = {}
    try:
        members[hr_member(ext)] = encode_image(hr, cfg, tile)
        for s, (lr, _) in lrs.items():
            members[lr_member(s, ext)] = encode_image(lr, cfg, None if tile is None else tile // s)
    except ImageDataError as exc:
        raise InputError(pair.hr, str(exc)) from None
    bit_depth, channels = describe_kind(hr)
    header = SampleHeader(
        key=pair.key,
        source=pair.hr_rel,
        hr_size=(w, h),
        scales=tuple(sorted(lrs)),
        bit_depth=bit_depth,
        channels=channels,
        lr_method=cfg.lr_method.value,
        lr_sizes={s: (lr.shape[1], lr.shape[0]) for s, (lr, _) in lrs.items()},
        tiles=tile,
        lr_sources={s: rel for s, (_, rel) in lrs.items() if rel is not None} if cfg.lr_method is LrMethod.PROVIDED else None,
        region=None if pair.region is None else (pair.region.y, pair.region.x, pair.region.h, pair.region.w),
        image_size=None if pair.region is None else pair.image_size,
    )
    del hr, lrs
    return pack_sample(header, members)


def encode_or_skip(pair: Pair, cfg: SampleConfig, on_error: OnError) -> EncodedSample | Skipped:
    """``encode_sample``, turning bad input into a ``Skipped`` record when skipping."""
    try:
        return encode_sample(pair, cfg) if pair.clip is None else encode_segment(pair, cfg)
    except InputError as exc:
        if on_error is not OnError.SKIP:
            raise
        return Skipped(exc.path, exc.reason)


__getattr__ = deprecation.module_getattr(
    __name__, {"PROVIDED": ("shardmaker.builder.sample.LrMethod.PROVIDED", LrMethod.PROVIDED)}
)
