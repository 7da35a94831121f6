"""The decoder's table of kinds (``wdsr.pipeline.kinds``): a sample is decoded by the first kind that
claims it, and a new kind of sample is one row: here samples stored as raw ``.npy`` arrays, the way
3D volumes would come, cut into aligned patches through the one ``Pair`` interface."""

from __future__ import annotations

import io

import numpy as np
import pytest

from shardmaker import format as fmt
from wdsr.errors import SampleError
from wdsr.pipeline import kinds
from wdsr.pipeline.decode import decode_sample
from wdsr.pipeline.patches import PatchConfig, cut_patches
from wdsr.pipeline.read import RawSample
from wdsr.pipeline.sample import DecodeSpec, LrMode, SampleKind
from wdsr.pipeline.whole import DecodedPair
from tests.helpers import photos


def _npy(a: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, a, allow_pickle=False)
    return out.getvalue()


def _npy_pair(raw: RawSample, meta: dict, spec: DecodeSpec) -> DecodedPair:
    hr, lr = (np.load(io.BytesIO(raw.members[n]), allow_pickle=False) for n in ("hr.npy", f"lr_x{spec.scale}.npy"))
    return DecodedPair(raw.shard, raw.key, raw.rep, hr, lr, 0, 0)


NPY = SampleKind(
    name="npy",
    what="an array dataset",
    plural="arrays",
    claims=lambda raw: "hr.npy" in raw.members,
    holds=lambda m: False,
    members=lambda m, scale, lr: frozenset({fmt.JSON_MEMBER, "hr.npy", f"lr_x{scale}.npy"}),
    pair=_npy_pair,
    options=lambda folder, clip: None,
)


def _raw(key: str, members: dict, hw: tuple[int, int] = (80, 96)) -> RawSample:
    """A sample of ``members`` with its ``{key}.json``: the one header schema (``shardmaker.format.SampleHeader``)."""
    h, w = hw
    header = fmt.SampleHeader(
        key, f"{key}.npy", (w, h), (2,), 8, 3, "provided", {2: (w // 2, h // 2)}, digests=fmt.Digests.of(members)
    )
    return RawSample("shard-000000.tar", key, 0, 0, {fmt.JSON_MEMBER: header.encode(), **members}, 0, 0)


def test_a_new_kind_is_one_row_of_the_table(monkeypatch):
    lr = np.ascontiguousarray(photos()[0][::8, ::8][:40, :48])
    hr = np.kron(lr, np.ones((2, 2, 1), dtype=np.uint8))
    spec = DecodeSpec(("hr.npy", "lr_x2.npy"), 2, kind=None)
    arrays = _raw("vol", {"hr.npy": _npy(hr), "lr_x2.npy": _npy(lr)})
    with pytest.raises(SampleError, match="hr.npy: no decoder for .npy members"):  # not in the table: not an image
        decode_sample(arrays, spec)
    monkeypatch.setattr(kinds, "SAMPLE_KINDS", (NPY, *kinds.SAMPLE_KINDS))
    assert kinds.sample_kind(arrays) is NPY
    pair = decode_sample(arrays, spec)
    patches, rejected = cut_patches(pair, PatchConfig(2, 16), seed=1, epoch=0, first=0, count=6)
    assert rejected == 0 and [p.j for p in patches] == list(range(6))
    for p in patches:  # aligned: each HR patch is its LR patch, every pixel doubled (after the same transform)
        np.testing.assert_array_equal(p.hr, np.kron(p.lr, np.ones((1, 2, 2), dtype=np.uint8)))
    png = _raw("img", {"hr.png": b"", "lr_x2.png": b""})
    assert kinds.sample_kind(png) is kinds.SAMPLE_KINDS[-1] and kinds.sample_kind(png).name == "whole"


def test_every_lr_mode_has_one_source_and_only_stored_pairs_are_cached():
    assert set(kinds.LR_SOURCES) == set(LrMode)
    assert [m for m, s in kinds.LR_SOURCES.items() if s.cacheable] == [LrMode.STORED]
    assert [k.name for k in kinds.SAMPLE_KINDS] == ["clip", "tiled", "whole"]  # whole last: it takes what no other claims
    assert [k.name for k in kinds.SAMPLE_KINDS if not k.serves(LrMode.BICUBIC)] == ["clip"]
