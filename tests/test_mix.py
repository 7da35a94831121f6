"""Several datasets in one stream (DF2K-style unions and weighted mixes): the plan's guarantees
hold over the union (equal batches per rank, determinism, exact resume), weights decide the
samples each source gives per epoch, sources may differ in codec."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

import wdsr
from tests.helpers import build_shards
from wdsr.env import World

KW = dict(scale=4, patch_size=48, patches_per_image=1, batch_size=1, shuffle_buffer=0, seed=2, return_keys=True)


@pytest.fixture(scope="module")
def two_sets(photo_src, tmp_path_factory) -> tuple[str, str]:
    """5 photos as PNG shards and the other 5 as QOI shards."""
    root = tmp_path_factory.mktemp("mix")
    for name, pick in (("a", range(0, 5)), ("b", range(5, 10))):
        src = root / f"src_{name}"
        src.mkdir()
        for i in pick:
            shutil.copy(photo_src / f"p{i:02d}.png", src)
    a = build_shards(root / "src_a", root / "a", "--scale", "2,4", "--max-samples", "2")
    b = build_shards(root / "src_b", root / "b", "--scale", "4", "--codec", "qoi", "--max-samples", "2")
    return str(a), str(b)


def _keys_of(folder: str) -> set[str]:
    return {k for s in json.loads(Path(folder, "manifest.json").read_text())["shards"] for k in s["keys"]}


def _run(ds: wdsr.SRDataset, workers: int = 0, state: dict | None = None) -> list[tuple[str, str]]:
    loader = wdsr.make_loader(ds, num_workers=workers)
    if state is not None:
        loader.load_state_dict(state)
    return [(keys[0], hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes()).hexdigest()[:16]) for lr, hr, keys in loader]


def test_a_union_of_two_codecs_gives_every_image_once_on_three_ranks(two_sets):
    a, b = two_sets
    runs = [_run(wdsr.SRDataset([a, b], world=World(r, 3), **KW), workers=1) for r in range(3)]
    assert len({len(r) for r in runs}) == 1  # equal batches on every rank
    seen = Counter(k for r in runs for k, _ in r)
    assert set(seen) == _keys_of(a) | _keys_of(b)  # PNG and QOI sources in one stream
    assert sum(seen.values()) == 12 and max(seen.values()) <= 2  # 10 images, 2 padding repeats for 3 x 4 slots
    assert runs == [_run(wdsr.SRDataset([a, b], world=World(r, 3), **KW), workers=1) for r in range(3)]  # deterministic
    val = [it.key for it in wdsr.make_loader(wdsr.SRDataset([a, b], scale=4, split="val"), num_workers=2)]
    assert Counter(val) == Counter(_keys_of(a) | _keys_of(b))  # val: every image of the union once


@pytest.mark.parametrize("weights, total, want", [([3, 1], 12, (9, 3)), ([1, 1], 7, (4, 3)), ([0, 2], 6, (0, 6))])
def test_weights_decide_the_samples_each_source_gives(two_sets, weights, total, want):
    a, b = two_sets
    ds = wdsr.SRDataset([a, b], weights=weights, epoch_samples=total, **KW)
    assert ds.mix is not None and ds.mix.counts == want and ds.epoch_samples == total
    got = _run(ds)
    assert len(got) == total
    per = Counter("a" if k in _keys_of(a) else "b" for k, _ in got)
    assert (per["a"], per["b"]) == want  # exactly, one patch per sample occurrence here
    # a source asked for more than it has repeats its images with new patches (with replacement)
    if want[0] > 5:
        assert len({p for k, p in got if k in _keys_of(a)}) == want[0]
    other_epoch = wdsr.SRDataset([a, b], weights=weights, epoch_samples=total, **KW)
    other_epoch.set_epoch(1)
    assert _run(other_epoch) != got


def test_a_mix_resumes_exactly(two_sets):
    a, b = two_sets
    kw = {**KW, "patches_per_image": 3, "batch_size": 2, "shuffle_buffer": 6}
    whole = _run(wdsr.SRDataset([a, b], weights=[2, 1], **kw), workers=2)
    loader = wdsr.make_loader(wdsr.SRDataset([a, b], weights=[2, 1], **kw), num_workers=2)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    it.close()
    rest = _run(wdsr.SRDataset([a, b], weights=[2, 1], **kw), workers=2, state=state)
    assert len(first) + len(rest) == len(whole) and rest == whole[3:]
    with pytest.raises(wdsr.LoaderStateError, match="another dataset"):  # other weights: another stream
        wdsr.make_loader(wdsr.SRDataset([a, b], weights=[1, 2], **kw), num_workers=2).load_state_dict(state)


def test_mix_errors_name_what_is_wrong(two_sets, photo_shards):
    a, b = two_sets
    with pytest.raises(ValueError, match=r"/b: no x2 LR"):
        wdsr.SRDataset([a, b], **{**KW, "scale": 2, "patch_size": 32})
    with pytest.raises(ValueError, match=r"weights must be one number per dataset \(2\)"):
        wdsr.SRDataset([a, b], weights=[1], **KW)
    with pytest.raises(ValueError, match="not both"):
        wdsr.SRDataset([a, f"{photo_shards}/shard-000000.tar"], **KW)
    with pytest.raises(ValueError, match="give a list of dataset folders"):
        wdsr.SRDataset(a, weights=[1], **KW)
    with pytest.raises(ValueError, match="given twice"):
        wdsr.SRDataset([a, a + "/"], **KW)
