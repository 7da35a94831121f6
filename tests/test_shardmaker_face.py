"""``import shardmaker`` is enough to build, merge, index, verify and load, as the package docstring shows."""

from __future__ import annotations

import shardmaker
from tests.helpers import photos, save


def test_the_face_builds_verifies_and_loads(tmp_path):
    for i, img in enumerate(photos()[:3]):
        save(tmp_path / "src" / f"{i}.png", img[:96, :128])
    result = shardmaker.build(shardmaker.BuildConfig(hr_src=str(tmp_path / "src"), out=str(tmp_path / "x4"), progress=False))
    assert result.samples == 3 and result.complete
    assert shardmaker.verify(str(tmp_path / "x4"), deep=True, progress=False) == []
    m = shardmaker.load(str(tmp_path / "x4"))
    assert m.scales == [4] and m.samples == 3


def test_the_face_builds_parts_and_merges_them(tmp_path):
    for i, img in enumerate(photos()[:4]):
        save(tmp_path / "src" / f"{i}.png", img[:64, :64])
    out = str(tmp_path / "x2")
    for part in range(2):
        cfg = shardmaker.BuildConfig(
            hr_src=str(tmp_path / "src"), out=out, part=(part, 2), sample=shardmaker.SampleConfig(scales=(2,)), progress=False
        )
        shardmaker.build(cfg)
    assert shardmaker.merge(out).samples == 4
    assert shardmaker.load(out).scales == [2]


def test_the_face_names_what_it_offers():
    for name in ("build", "merge", "index", "verify", "load", "BuildConfig", "SampleConfig", "IndexConfig"):
        assert name in shardmaker.__all__ and hasattr(shardmaker, name), name
    assert callable(shardmaker.index) and shardmaker.IndexConfig.__dataclass_fields__["hr"]
