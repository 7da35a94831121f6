"""Decode one sample's HR and requested LR image; check presence, sizes, depth, hashes.

Only ``{key}.json``, ``{key}.hr.{ext}`` and ``{key}.lr_x{s}.{ext}`` are ever decoded, and only
by image decoders (libspng/Pillow for PNG, QOI): nothing is unpickled.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time

import numpy as np

from shardmaker import codecs
from shardmaker.codecs import ImageDataError
from wdsr.errors import SampleError
from wdsr.read import RawSample


@dataclasses.dataclass
class DecodedPair:
    shard: str
    key: str
    rep: int
    hr: np.ndarray  # HxW[xC], cropped to exactly scale x LR
    lr: np.ndarray
    decode_ns: int


def wanted_members(codec: str, scale: int) -> frozenset[str]:
    return frozenset({"json", f"hr.{codec}", f"lr_x{scale}.{codec}"})


def decode_pair(raw: RawSample, codec: str, scale: int, check_hashes: bool = True) -> DecodedPair:
    t0 = time.perf_counter_ns()
    hr_name, lr_name = f"hr.{codec}", f"lr_x{scale}.{codec}"

    def fail(reason: str) -> SampleError:
        return SampleError(raw.shard, raw.key, reason)

    if "json" not in raw.members:
        raise fail("no json member")
    try:
        meta = json.loads(raw.members["json"])
    except ValueError as exc:
        raise fail(f"json member is not valid JSON ({exc})") from None
    for name in (hr_name, lr_name):
        if name not in raw.members:
            raise fail(f"no {name} member (this sample has scales {meta.get('scales')})")
    if check_hashes:
        digests = meta.get("sha256", {})
        for name in (hr_name, lr_name):
            if hashlib.sha256(raw.members[name]).hexdigest() != digests.get(name):
                raise fail(f"{name} does not match its sha256 in {raw.key}.json (corrupt shard)")
    try:
        hr = codecs.decode(raw.members[hr_name], codec)
    except ImageDataError as exc:
        raise fail(f"{hr_name}: {exc}") from None
    try:
        lr = codecs.decode(raw.members[lr_name], codec)
    except ImageDataError as exc:
        raise fail(f"{lr_name}: {exc}") from None
    (h, w), (lh, lw) = hr.shape[:2], lr.shape[:2]
    if not (0 <= h - scale * lh < scale and 0 <= w - scale * lw < scale):
        raise fail(f"HR {w}x{h} is not {scale} x LR {lw}x{lh} (wrong scale?)")
    if hr.dtype != lr.dtype or hr.shape[2:] != lr.shape[2:]:
        raise fail(f"HR {hr.dtype}{list(hr.shape[2:])} and LR {lr.dtype}{list(lr.shape[2:])} differ in depth or channels")
    hr = hr[: scale * lh, : scale * lw]
    return DecodedPair(raw.shard, raw.key, raw.rep, hr, lr, time.perf_counter_ns() - t0)
