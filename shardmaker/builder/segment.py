"""One clip segment encoded as a sample, in build worker processes: frames read (or decoded from a
video), checked and encoded one at a time, under the same rules as image samples (:mod:`.images`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from shardmaker.builder.clipplan import ClipPart
from shardmaker.builder.images import (
    LrMethod,
    SampleConfig,
    SourceImage,
    check_kind,
    check_lr,
    check_scale,
    describe_kind,
    encode_image,
    tile_side,
    whole_lr,
)
from shardmaker.builder.pack import EncodedSample, pack_sample
from shardmaker.builder.sources import Pair
from shardmaker.builder.video import video_frames
from shardmaker.errors import InputError
from shardmaker.format import TILED, ClipSpan, SampleHeader, hr_frame, lr_frame
from shardmaker.imaging.codecs import Codec, ImageDataError


def encode_segment(pair: Pair, cfg: SampleConfig) -> EncodedSample:
    """One segment's tar members: ``{key}.json`` then, frame by frame, ``{key}.hr_f{t:04d}.ext`` and
    ``{key}.lr_x{s}_f{t:04d}.ext`` (``tiles`` for frames stored tiled). Frames are read, checked
    (size, kind; a provided LR frame as a provided LR image is), their LR made (MATLAB per frame) or
    read, and encoded one at a time."""
    part = pair.clip
    assert part is not None
    w, h = pair.hr_size
    provided = cfg.lr_method is LrMethod.PROVIDED
    scales = sorted(s for s, _, _ in pair.lr) if provided else sorted(cfg.scales)  # () for --hr-only
    tile = tile_side(cfg, (h, w), scales)
    ext = Codec(cfg.codec).value if tile is None else TILED
    members: dict[str, bytes] = {}
    kind: tuple[int, int] | None = None
    lr_sizes: dict[int, tuple[int, int]] = {}
    lr_urls = {s: (url, dict(part.lr_frames).get(s, ())) for s, url, _ in pair.lr}
    lr_pts = dict(part.lr_pts)
    lr_iters = {s: _frames(url, frames, part, cfg, lr_pts.get(s, ())) for s, (url, frames) in lr_urls.items()}
    for t, hr in enumerate(_frames(pair.hr, part.hr_frames, part, cfg, part.hr_pts)):
        where = f"{pair.hr} ({part.names[t]})"
        if hr.shape[:2] != (h, w):
            raise InputError(where, f"frame is {hr.shape[1]}x{hr.shape[0]}, the clip's frames {w}x{h}")
        if kind is not None and describe_kind(hr) != kind:
            raise InputError(where, f"frame is {describe_kind(hr)} (bit depth, channels), the clip's {kind}")
        kind = describe_kind(hr)
        lrs: dict[int, np.ndarray] = {}
        for s in scales:
            if provided:
                lr = next(lr_iters[s])
                url, frames = lr_urls[s]
                lr_where = frames[t] if frames else f"{url} (frame {part.first + t})"
                check_lr(lr_where, (h, w), lr.shape[:2], s, cfg.mod_crop)
                check_kind(lr_where, lr, kind)
            else:
                check_scale(pair.hr, (h, w), s, cfg.mod_crop, " frames")
                method = cfg.lr_method.resize
                assert method is not None
                lr = whole_lr(hr, s, method)
            lrs[s] = lr
            lr_sizes[s] = (lr.shape[1], lr.shape[0])
        try:
            members[hr_frame(t, ext)] = encode_image(hr, cfg, tile)
            for s, lr in lrs.items():
                members[lr_frame(s, t, ext)] = encode_image(lr, cfg, None if tile is None else tile // s)
        except ImageDataError as exc:
            raise InputError(where, str(exc)) from None
    if len(members) != part.count * (1 + len(scales)):
        raise InputError(pair.hr, f"gave {len(members) // (1 + len(scales))} of the segment's {part.count} frames")
    assert kind is not None
    header = SampleHeader(
        key=pair.key,
        source=pair.hr_rel,
        hr_size=(w, h),
        scales=tuple(scales),
        bit_depth=kind[0],
        channels=kind[1],
        lr_method=cfg.lr_method.value,
        lr_sizes=lr_sizes,
        tiles=tile,
        lr_sources={s: rel for s, _, rel in pair.lr} if provided else None,
        clip=ClipSpan(part.clip, part.clip_frames, part.first, part.count, part.owned, part.names),
    )
    return pack_sample(header, members)


def _frames(url: str, frame_urls: Sequence[str], part: ClipPart, cfg: SampleConfig, pts: Sequence[int]) -> Iterator[np.ndarray]:
    """The segment's frames in order: each frame file read and checked as a source image, or the
    video decoded frame-exactly (at the timestamps ``pts`` the scan found)."""
    if frame_urls:
        for f in frame_urls:
            with SourceImage(f, cfg) as img:
                yield img.whole()
        return
    yield from video_frames(url, part.first, part.count, cfg.storage_options, tuple(pts), cfg.max_pixels, cfg.drop_alpha)
