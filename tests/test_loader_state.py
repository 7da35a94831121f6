"""Exact mid-epoch resume: save after N batches, load into a fresh loader, and the rest of the
epoch is byte for byte what one uninterrupted run gives (real DataLoader worker processes)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import wdsr
from tests.helpers import rewrite
from wdsr.env import World
from wdsr.pipeline.shuffle import fast_forward, shuffled


def _digest(item: tuple) -> str:
    lr, hr, keys = item
    h = hashlib.sha256(lr.numpy().tobytes())
    h.update(hr.numpy().tobytes())
    h.update(json.dumps(keys).encode())
    return h.hexdigest()[:16]


def _make(url: str, world: World, **kw) -> wdsr.SRDataset:
    return wdsr.SRDataset(url, world=world, return_keys=True, **kw)


def _run(ds: wdsr.SRDataset, workers: int, state: dict | None = None, stop: int | None = None) -> tuple[list[str], dict]:
    """The batches of one pass (or its first ``stop``), and the loader state after them."""
    loader = wdsr.make_loader(ds, num_workers=workers, persistent_workers=False, prefetch_factor=2)
    if state is not None:
        loader.load_state_dict(state)
    out: list[str] = []
    it = iter(loader)
    try:
        for item in it:
            out.append(_digest(item))
            if stop is not None and len(out) == stop:
                break
    finally:
        it.close()
    return out, loader.state_dict()


COMBOS = [  # world, workers, k, shuffle_buffer, batch_size, augment
    (World(0, 1), 0, 3, 16, 4, True),
    (World(0, 1), 1, 1, 0, 1, False),
    (World(0, 1), 2, 5, 64, 4, True),
    (World(1, 3), 2, 8, 7, 3, True),
    (World(2, 3), 1, 4, 1024, 2, False),
    (World(0, 2), 2, 16, 24, 5, True),
]


@pytest.mark.parametrize("world, workers, k, buffer, batch, augment", COMBOS)
def test_resume_gives_the_uninterrupted_batches(photo_shards, world, workers, k, buffer, batch, augment):
    kw = dict(scale=4, patch_size=48, patches_per_image=k, batch_size=batch, shuffle_buffer=buffer, augment=augment, seed=11)
    whole, end = _run(_make(str(photo_shards), world, **kw), workers)
    n = len(whole)
    assert n == len(wdsr.make_loader(_make(str(photo_shards), world, **kw), num_workers=workers)) and n >= 3
    assert end["epoch"] == 1 and end["batches"] == 0  # a finished epoch resumes at the next one
    stops = sorted({1, 2, n // 2, n - 1, n})
    for stop in stops:
        first, state = _run(_make(str(photo_shards), world, **kw), workers, stop=stop)
        assert first == whole[:stop]
        assert json.loads(json.dumps(state)) == state  # JSON-able as it is
        if stop < n:
            assert (state["epoch"], state["batches"]) == (0, stop)
        rest, _ = _run(_make(str(photo_shards), world, **kw), workers, state=state)
        assert (
            first + rest == whole
            if stop < n
            else rest == _run(_make(str(photo_shards), world, **kw), workers, state={**state, "epoch": 1, "batches": 0})[0]
        )


def test_resume_inside_a_later_epoch_and_persistent_workers(photo_shards):
    kw = dict(scale=2, patch_size=32, patches_per_image=6, batch_size=4, shuffle_buffer=40, seed=3)
    ds = _make(str(photo_shards), World(), **kw)
    loader = wdsr.make_loader(ds, num_workers=2, persistent_workers=True)
    [_digest(b) for b in loader]
    epoch1 = [_digest(b) for b in loader]  # the next pass is epoch 1
    assert loader.epoch == 1
    it = iter(loader)
    part = [_digest(next(it)) for _ in range(5)]
    state = loader.state_dict()
    it.close()
    assert (state["epoch"], state["batches"]) == (2, 5)
    fresh = wdsr.make_loader(_make(str(photo_shards), World(), **kw), num_workers=2)
    fresh.load_state_dict(state)
    rest = [_digest(b) for b in fresh]
    ref = wdsr.make_loader(_make(str(photo_shards), World(), **kw), num_workers=2)
    ref.set_epoch(2)
    assert part + rest == [_digest(b) for b in ref]
    assert epoch1 != part + rest
    assert fresh.epoch == 2 and [_digest(b) for b in fresh][:3] != rest[:3]  # and then epoch 3 follows


def test_resume_decodes_only_the_samples_that_still_owe_patches(photo_shards):
    kw = dict(scale=4, patch_size=48, patches_per_image=4, batch_size=4, shuffle_buffer=8, seed=5)
    ds = _make(str(photo_shards), World(), **kw)
    whole, _ = _run(ds, 0)
    full = ds.stats.totals()["samples"]
    stop = len(whole) - 2
    first, state = _run(_make(str(photo_shards), World(), **kw), 0, stop=stop)
    again = _make(str(photo_shards), World(), **kw)
    rest, _ = _run(again, 0, state=state)
    assert first + rest == whole
    read = again.stats.totals()["samples"]
    # the last 2 batches (8 patches) come from at most a few images; the whole epoch read all 10
    assert full == 10 and 1 <= read <= 4, (full, read)


def test_resume_with_skipped_bad_samples(photo_shards, tmp_path):
    ds_dir = Path(shutil.copytree(photo_shards, tmp_path / "copy"))
    doc = json.loads((ds_dir / "manifest.json").read_text())
    for shard_index in (0, 2):  # one bad sample in the middle of a shard, one at the start of another
        key = doc["shards"][shard_index]["keys"][1 if shard_index == 0 else 0]
        rewrite(ds_dir, shard_index, lambda n, d, key=key: (n, bytes(len(d))) if n == f"{key}.lr_x4.png" else (n, d))
    kw = dict(scale=4, patch_size=48, patches_per_image=5, batch_size=3, shuffle_buffer=20, seed=8, on_error="skip")
    for world, workers in ((World(), 0), (World(1, 2), 2)):
        whole, _ = _run(_make(str(ds_dir), world, **kw), workers)
        for stop in (1, len(whole) // 3, len(whole) - 1):
            first, state = _run(_make(str(ds_dir), world, **kw), workers, stop=stop)
            rest, _ = _run(_make(str(ds_dir), world, **kw), workers, state=state)
            assert first + rest == whole, (world, workers, stop)


def test_states_that_do_not_fit_are_refused(photo_shards, tmp_path):
    kw = dict(scale=4, patch_size=48, patches_per_image=4, batch_size=4, shuffle_buffer=8)
    _, state = _run(_make(str(photo_shards), World(), **kw), 0, stop=2)

    def load(st: object, **over) -> None:
        loader = wdsr.make_loader(_make(str(photo_shards), over.pop("world", World()), **{**kw, **over}), num_workers=0)
        loader.load_state_dict(st)  # type: ignore[arg-type]

    load(state)  # fits
    with pytest.raises(wdsr.LoaderStateError, match="patch_size=48, this loader 96"):
        load(state, patch_size=96)
    with pytest.raises(wdsr.LoaderStateError, match="lacks batches"):
        load({k: v for k, v in state.items() if k != "batches"})
    with pytest.raises(wdsr.LoaderStateError, match="format 'wdsr-loader/0'"):
        load({**state, "format": "wdsr-loader/0"})
    with pytest.raises(wdsr.LoaderStateError, match="a dict"):
        load([state])
    with pytest.raises(wdsr.LoaderStateError, match=r"batches must be an integer in \[0, "):
        load({**state, "batches": -1})
    elastic = wdsr.make_loader(_make(str(photo_shards), World(1, 2), **kw), num_workers=0)
    elastic.load_state_dict(state)  # another world: the rest of the epoch is re-planned, not refused
    assert elastic.elastic_report is not None and elastic.state_dict()["elastic"]["world_size"] == 1
    with pytest.raises(wdsr.LoaderStateError, match=r"elastic\.world_size must be an integer in \[1, 65536\], got '2'"):
        load({**state, "elastic": {"world_size": "2"}})
    with pytest.raises(wdsr.LoaderStateError, match="elastic origin is malformed: it lacks num_workers"):
        load({**state, "elastic": {"world_size": 2}})
    other = Path(shutil.copytree(photo_shards, tmp_path / "other"))
    doc = json.loads((other / "manifest.json").read_text())
    doc["build"]["note"] = "another build"
    (other / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(wdsr.LoaderStateError, match="another dataset"):
        loader = wdsr.make_loader(_make(str(other), World(), **kw), num_workers=0)
        loader.load_state_dict(state)
    with pytest.raises(ValueError, match="val loader"):
        wdsr.make_loader(wdsr.SRDataset(str(photo_shards), scale=4, split="val"), num_workers=0).state_dict()


@pytest.mark.parametrize("size", [0, 1, 2, 7, 64])
@pytest.mark.parametrize("total", [0, 1, 6, 63, 64, 65, 300, 9000])
def test_shuffle_fast_forward_matches_the_run_at_every_point(size, total):
    ref = list(shuffled(range(total), size, np.random.default_rng(7)))
    points = sorted({0, 1, total // 3, max(0, total - size), max(0, total - size) + 1, total - 1, total} & set(range(total + 1)))
    for emitted in points:
        rng = np.random.default_rng(7)
        at = fast_forward(size, rng, total, emitted)
        rest = list(shuffled(range(at.next_input, total) if at.tail is None else [], size, rng, at, resolve=lambda p: p))
        assert ref[:emitted] + rest == ref, (size, total, emitted)
        assert set(at.buffer if at.tail is None else at.tail) == set(ref[emitted:]) - set(range(at.next_input, total))


def test_dataset_options_are_keyword_only_and_checked(photo_shards):
    with pytest.raises(TypeError, match="keyword-only"):
        wdsr.SRDataset(str(photo_shards), 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unknown SRDataset option 'patchsize'"):
        wdsr.SRDataset(str(photo_shards), patchsize=48)
    cfg = wdsr.DatasetConfig(scale=4, patch_size=48, on_error="skip")
    assert cfg.on_error is wdsr.OnError.SKIP
    ds = wdsr.SRDataset(str(photo_shards), config=cfg, batch_size=2)
    assert ds.config.batch_size == 2 and ds.config.patch_size == 48
    with pytest.raises(ValueError, match="on_error must be one of fail, skip"):
        wdsr.DatasetConfig(on_error="ignore")
    assert torch.utils.data.IterableDataset in type(ds).__mro__


def _patches(
    ds: wdsr.SRDataset, workers: int, state: dict | None = None, stop: int | None = None
) -> tuple[list[str], dict, object]:
    """Per-patch digests (key + bytes) of one pass (or its first ``stop`` batches), the state after, the loader."""
    loader = wdsr.make_loader(ds, num_workers=workers, persistent_workers=False, prefetch_factor=2)
    if state is not None:
        loader.load_state_dict(state)
    out: list[str] = []
    it = iter(loader)
    n = 0
    try:
        for lr, hr, keys in it:
            n += 1
            for a, b, key in zip(lr, hr, keys):
                out.append(key + ":" + hashlib.sha256(a.numpy().tobytes() + b.numpy().tobytes()).hexdigest()[:16])
            if stop is not None and n == stop:
                break
    finally:
        it.close()
    return out, loader.state_dict(), loader


@pytest.mark.parametrize("old, new", [((2, 1), (3, 2)), ((4, 0), (1, 2)), ((2, 2), (3, 1))])
def test_elastic_resume_replans_the_rest_of_the_epoch_over_another_world(photo_shards, old, new):
    from collections import Counter

    url = str(photo_shards)
    kw = dict(scale=4, patch_size=48, patches_per_image=5, batch_size=3, shuffle_buffer=12, seed=21)
    (w0, n0), (w1, n1) = old, new
    # every patch of the epoch, as the old world plans it (batch 1, no shuffle: nothing left out)
    every = Counter(
        p for r in range(w0) for p in _patches(_make(url, World(r, w0), **{**kw, "batch_size": 1, "shuffle_buffer": 0}), n0)[0]
    )
    old_len = len(wdsr.make_loader(_make(url, World(0, w0), **kw), num_workers=n0))
    stop = old_len // 2
    consumed, state = Counter(), None
    for r in range(w0):
        got, st, _ = _patches(_make(url, World(r, w0), **kw), n0, stop=stop)
        consumed.update(got)
        state = st if state is None else state
        assert (st["epoch"], st["batches"]) == (state["epoch"], state["batches"]) == (0, stop)  # the same on every rank
    assert state is not None
    resumed, counts, reads, reports = Counter(), [], 0, []
    for r in range(w1):
        ds = _make(url, World(r, w1), **kw)
        got, after, loader = _patches(ds, n1, state=state)
        counts.append(len(got))
        resumed.update(got)
        reads += ds.stats.totals()["samples"]
        reports.append(loader.elastic_report)
        assert (after["epoch"], after["batches"]) == (1, 0)  # the re-planned epoch ran to its end
    report = reports[0]
    assert all(r == report for r in reports) and report is not None
    assert len(set(counts)) == 1  # equal batches on every new rank
    assert counts[0] % kw["batch_size"] == 0
    slots = w1 * max(1, n1)
    # nothing is handed out twice and nothing is made up ...
    assert not (consumed + resumed) - every
    # ... and what is missing is exactly what the re-plan reports dropped, plus each new slot's last partial batch
    missing = sum(every.values()) - sum(consumed.values()) - sum(resumed.values())
    assert missing == report["dropped"] + slots * (report["per_slot"] % kw["batch_size"])
    assert report["patches"] == sum(every.values()) - sum(consumed.values()) and report["partial_images"] >= 1
    # images whose patches were all consumed are not read again (an image split between two new slots is read by both)
    assert reads <= report["images"] + slots


def test_a_second_world_change_inside_one_epoch_is_refused(photo_shards):
    url = str(photo_shards)
    kw = dict(scale=4, patch_size=48, patches_per_image=5, batch_size=3, shuffle_buffer=12, seed=21)
    _, state, _ = _patches(_make(url, World(0, 2), **kw), 1, stop=3)
    _, inside, _ = _patches(_make(url, World(0, 3), **kw), 1, state=state, stop=1)
    assert inside["elastic"] == {"world_size": 2, "num_workers": 1, "batches": 3} and inside["batches"] == 1
    # the same new world resumes inside the re-planned epoch exactly
    full, _, _ = _patches(_make(url, World(0, 3), **kw), 1, state=state)
    rest, _, _ = _patches(_make(url, World(0, 3), **kw), 1, state=inside)
    assert full[3:] == rest
    with pytest.raises(wdsr.WorldChanged, match="second change of world"):
        wdsr.make_loader(_make(url, World(0, 4), **kw), num_workers=1).load_state_dict(inside)


def _readme_run(url: str, epochs: int, ckpt: dict | None, save_at: tuple[int, int] | None, start: int | None = None) -> list[str]:
    """The README's loop: load the checkpoint if any, then ``for epoch in range(loader.epoch, epochs)``
    with ``set_epoch`` (``start`` replaces ``loader.epoch``: the old snippet's ``range(epochs)``)."""
    kw = dict(scale=2, patch_size=32, patches_per_image=4, batch_size=4, shuffle_buffer=16, seed=7)
    loader = wdsr.make_loader(_make(url, World(), **kw), num_workers=2, persistent_workers=True, prefetch_factor=2)
    if ckpt is not None:
        loader.load_state_dict(json.loads(json.dumps(ckpt["loader"])))
    out: list[str] = []
    for epoch in range(loader.epoch if start is None else start, epochs):
        loader.set_epoch(epoch)
        for i, item in enumerate(loader):
            out.append(_digest(item))
            if (epoch, i) == save_at:  # "preempted" right after this checkpoint
                return out + [json.dumps({"loader": loader.state_dict()})]
    return out


def test_the_readme_resume_loop_continues_exactly_and_a_discarding_set_epoch_warns(photo_shards, caplog):
    url = str(photo_shards)
    whole = _readme_run(url, 2, None, None)
    *before, saved = _readme_run(url, 2, None, (1, 2))  # a checkpoint after batch 3 of epoch 1
    ckpt = json.loads(saved)
    assert before == whole[: len(before)] and (ckpt["loader"]["epoch"], ckpt["loader"]["batches"]) == (1, 3)
    with caplog.at_level("WARNING", logger="wdsr"):
        assert before + _readme_run(url, 2, ckpt, None) == whole
        assert not [r for r in caplog.records if "discards" in r.getMessage()]
        replayed = _readme_run(url, 2, ckpt, None, start=0)  # the old snippet: epoch 0 again, the state lost
    assert replayed == whole
    msg = [r.getMessage() for r in caplog.records if "discards" in r.getMessage()]
    assert len(msg) == 1 and "set_epoch(0) discards the loaded state (epoch 1, 3 batches" in msg[0], msg
    assert "loader.epoch" in msg[0]
