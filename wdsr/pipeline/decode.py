"""Decode one sample: read its header (``{key}.json``), pick its kind from the table
(``wdsr.pipeline.kinds``: whole image, tiled image, clip segment) and its LR source (stored, made per
patch, made on the device), and let them check and decode it into a ``wdsr.pipeline.patches.Pair``.

Only ``{key}.json``, ``{key}.hr.{ext}`` and ``{key}.lr_x{s}.{ext}`` are ever decoded, and only
by image decoders (libspng/Pillow for PNG, QOI): nothing is unpickled. Every pair is checked from
its headers first (``checks.check_headers``: sizes, scale, ``max_pixels``, channels and depth against
the dataset's ``Kind``), by ``SRDataset`` and ``wdsr.wds`` alike, so nothing too large or of
another kind ever reaches a decoder.
"""

from __future__ import annotations

from typing import Any

from shardmaker import format as fmt
from shardmaker.format import Manifest
from wdsr.errors import SampleError
from wdsr.pipeline import kinds
from wdsr.pipeline.checks import Kind, Verify
from wdsr.pipeline.patches import Pair
from wdsr.pipeline.read import RawSample
from wdsr.pipeline.sample import DecodeSpec, LrMode

__all__ = ["decode_pair", "decode_sample", "wanted_members"]


def wanted_members(m: Manifest, scale: int, lr_mode: str = "stored") -> frozenset[str]:
    """The members a sample is read with: HR, the x``scale`` LR and (our shards) ``{key}.json``; of a
    clip dataset's sample, every frame's; with LR made per patch (``lr="bicubic"``), HR alone."""
    return kinds.wanted_members(m, scale, LrMode(lr_mode))


def decode_pair(
    raw: RawSample,
    names: tuple[str, str],
    scale: int,
    verify: Verify = Verify.XXH3,
    max_pixels: int = fmt.DEFAULT_MAX_PIXELS,
    kind: Kind | None = None,
    clip: Any = None,
    lr_mode: str = "stored",
    degrade: Any = None,
) -> Any:
    """Check headers (sizes against the manifest, scale, ``max_pixels``, channels and depth against
    ``kind``) and digests, then decode the members ``names`` (HR, LR); every failure is a SampleError
    naming shard and key. Digests come from ``{key}.json`` in our shards, from the manifest in an
    index of foreign shards (``raw.digests``, xxh3_64)."""
    spec = DecodeSpec(names, scale, Verify(verify), max_pixels, kind, clip, LrMode(lr_mode), degrade)
    return decode_sample(raw, spec)


def _sample_json(raw: RawSample) -> dict[str, Any]:
    """``{key}.json``, checked (``shardmaker.format.SampleHeader.parse``), as the JSON object the kinds read."""
    if "json" not in raw.members:
        raise SampleError(raw.shard, raw.key, "no json member")
    try:
        return fmt.SampleHeader.parse(raw.members["json"], raw.shard, raw.key).to_json()
    except fmt.SampleHeaderError as exc:
        raise SampleError(raw.shard, raw.key, exc.reason) from None


def decode_sample(raw: RawSample, spec: DecodeSpec) -> Pair:
    """The sample decoded by its kind (the first in ``kinds.SAMPLE_KINDS`` that claims it): with its
    stored LR, or its HR alone made into a pair by the LR source ``spec.lr``."""
    meta: dict[str, Any] = {} if raw.digests is not None else _sample_json(raw)
    sample_kind = kinds.sample_kind(raw)
    if not spec.lr.made or sample_kind.hr is None:  # a kind that cannot make LR is refused before any read
        return sample_kind.pair(raw, meta, spec)  # type: ignore[no-any-return]
    make = kinds.LR_SOURCES[spec.lr].make
    assert make is not None
    return make(raw, sample_kind.hr(raw, meta, spec), spec)  # type: ignore[no-any-return]
