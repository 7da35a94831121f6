"""Windows of frames from clip datasets (issue 27): shapes, what a window holds (consecutive frames of a
pan, one crop and one transform, reversed when drawn so), the window distributions of BasicSR's
REDSRecurrentDataset / REDSDataset, determinism, ranks, resume, bad frames, and clear errors."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import wdsr
from shardmaker import format as fmt
from wdsr.env import World
from wdsr.pipeline.clips import ClipConfig, Segment, window_draws
from wdsr.seeds import patch_base
from tests.helpers import build_shards, mosaic, rewrite, save

SHIFT = 2  # pixels the scene moves right per frame, at HR


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    """Three REDS-style clips of a pan across real photos (31, 24 and 9 frames), built with x4 LR,
    segments of 16 frames spanning up to 9."""
    scene = mosaic(400, 1200)
    root = tmp_path_factory.mktemp("clips-src")
    for c, n in enumerate((31, 24, 9)):
        for t in range(n):
            x0 = 600 - SHIFT * t - 37 * c
            save(root / f"{c:03d}" / f"{t:08d}.png", np.ascontiguousarray(scene[20 + 30 * c : 20 + 30 * c + 128, x0 : x0 + 192]))
    return build_shards(root, tmp_path_factory.mktemp("clips") / "ds", "--clips", "--scale", "4", "--segment", "16", "--max-span", "9")


def _ds(url, cc: ClipConfig, world=World(0, 1), **kw) -> wdsr.SRDataset:
    opts = dict(scale=4, patch_size=48, patches_per_image=3, batch_size=4, shuffle_buffer=8, seed=3, return_keys=True)
    return wdsr.SRDataset(str(url), clip=cc, world=world, **{**opts, **kw})


def _shift_of(a: np.ndarray, b: np.ndarray) -> tuple[int, int] | None:
    """(dy, dx) with b == a moved by it on their overlap, for moves of up to 3 * SHIFT * 3 pixels."""
    for dy, dx in [(0, d) for d in range(-18, 19) if d] + [(d, 0) for d in range(-18, 19) if d]:
        h, w = a.shape[-2:]
        ya, yb = (slice(0, h - dy), slice(dy, h)) if dy >= 0 else (slice(-dy, h), slice(0, h + dy))
        xa, xb = (slice(0, w - dx), slice(dx, w)) if dx >= 0 else (slice(-dx, w), slice(0, w + dx))
        if np.array_equal(a[..., ya, xa], b[..., yb, xb]):
            return dy, dx
    return None


@pytest.mark.parametrize("interval,reverse", [((1,), 0.0), ((1, 2), 0.5)])
def test_a_window_is_consecutive_frames_under_one_crop_and_transform(clips, interval, reverse):
    cc = ClipConfig(frames=4, interval=interval, reverse=reverse)
    moves = Counter()
    for lr, hr, keys in wdsr.make_loader(_ds(clips, cc), num_workers=0):
        assert lr.shape[1:] == (4, 3, 12, 12) and hr.shape[1:] == (4, 3, 48, 48) and lr.dtype == torch.uint8
        for w in hr.numpy():
            steps = {_shift_of(w[i], w[i + 1]) for i in range(3)}
            assert len(steps) == 1 and None not in steps, steps  # one move per frame: same crop, same transform
            (dy, dx), = steps
            assert abs(dy + dx) in {SHIFT * i for i in interval}
            moves[(abs(dy) > 0, np.sign(dy + dx))] += 1
    assert len(moves) >= 3  # transforms turn the pan's direction; reversed windows run it backwards
    signs = Counter()
    for _, hr, _ in wdsr.make_loader(_ds(clips, cc, augment=False), num_workers=0):
        for w in hr.numpy():
            dy, dx = _shift_of(w[0], w[1])
            assert dy == 0  # no transform: the pan stays horizontal
            signs[np.sign(dx)] += 1
    assert len(signs) == (2 if reverse else 1)  # only reversed windows run the pan backwards


def test_center_windows_give_the_centre_frames_hr(clips):
    cc = ClipConfig(frames=5, window="center")
    loader = wdsr.make_loader(_ds(clips, cc), num_workers=2)
    for lr, hr, _ in loader:
        assert lr.shape[1:] == (5, 3, 12, 12) and hr.shape[1:] == (3, 48, 48)
        # the HR is the middle LR frame's: its x4 MATLAB downscale is that LR frame up to the crop's border
        from shardmaker.imaging.resize import downscale

        for l, h in zip(lr.numpy(), hr.numpy(), strict=True):
            small = downscale(np.ascontiguousarray(h.transpose(1, 2, 0)), 4).transpose(2, 0, 1).astype(int)
            inner = np.abs(small[:, 2:-2, 2:-2] - l[2, :, 2:-2, 2:-2].astype(int))
            assert inner.max() <= 2  # the other frames are shifted by SHIFT / 4 LR px or more: far off
            assert np.abs(small[:, 2:-2, 2:-2] - l[0, :, 2:-2, 2:-2].astype(int)).max() > 2


def _basicsr_recurrent(rng: random.Random, length: int, t: int, intervals: list[int]) -> tuple[int, int]:
    """BasicSR's REDSRecurrentDataset (and mmagic's GenerateSegmentIndices): (interval, start)."""
    interval = rng.choice(intervals)
    return interval, rng.randint(0, length - t * interval)


def _basicsr_center(rng: random.Random, length: int, t: int, intervals: list[int]) -> tuple[int, int]:
    """BasicSR's REDSDataset (EDVR; mmagic's GenerateFrameIndices): (interval, centre frame)."""
    interval = rng.choice(intervals)
    half = t // 2
    c = rng.randint(0, length - 1)
    while c - half * interval < 0 or c + half * interval > length - 1:
        c = rng.randint(0, length - 1)
    return interval, c


def _chi2_same(a: Counter, b: Counter) -> float:
    """Pearson's chi-square statistic over the union of cells, per degree of freedom, of two samples of equal size."""
    cells = set(a) | set(b)
    stat = sum((a[c] - b[c]) ** 2 / (a[c] + b[c]) for c in cells if a[c] + b[c])
    return stat / max(1, len(cells) - 1)


@pytest.mark.parametrize("window,t,intervals", [("recurrent", 15, [1]), ("recurrent", 7, [1, 2, 3]), ("center", 5, [1, 2, 3])])
def test_window_distributions_are_basicsrs(window, t, intervals):
    """100-frame clips as one segment (REDS): wdsr's (interval, start/centre) draws against BasicSR's
    formulas, 30,000 windows each, by a two-sample chi-square per degree of freedom (about 1 when
    they agree; an off-by-one in the valid starts puts it far above 2)."""
    n, length = 30_000, 100
    cc = ClipConfig(frames=t, interval=tuple(intervals), window=window)
    seg = Segment("000", length, 0, length, (0, length), "png")
    got = Counter()
    for key in range(10):  # several samples' draws: the keys' bases differ
        for frames, _, _, _ in window_draws(patch_base(7, 0, f"k{key}"), np.arange(n // 10), cc, seg, (180, 320), 16, True):
            iv = frames[1] - frames[0] if t > 1 else 1
            got[(iv, frames[0] if window == "recurrent" else frames[t // 2])] += 1
    rng = random.Random(5)
    ref = Counter((_basicsr_recurrent if window == "recurrent" else _basicsr_center)(rng, length, t, intervals) for _ in range(n))
    assert set(got) == set(ref)  # the same support: no start they never draw, none they draw missing
    assert _chi2_same(got, ref) < 1.6


def test_segments_of_long_clips_cover_the_starts_uniformly():
    """A 1000-frame clip built as segments of 100 frames spanning up to 16: windows of 16 frames
    drawn k per segment are uniform over the clip's valid starts (each start owned once)."""
    from shardmaker.builder.clips import ClipOptions, plan_segments

    cc = ClipConfig(frames=16)
    got = Counter()
    for i, (first, count, a, b) in enumerate(plan_segments(1000, ClipOptions(100, 16))):
        seg = Segment("c", 1000, first, count, (a, b), "png")
        for frames, _, _, _ in window_draws(patch_base(1, 0, f"s{i}"), np.arange(4000), cc, seg, (64, 64), 8, False):
            assert first <= min(frames) and max(frames) < first + count
            got[frames[0]] += 1
    starts = range(0, 1000 - 16 * 1 + 1)  # BasicSR's valid starts: s + T <= L
    assert set(got) == set(starts)
    counts = np.array([got[s] for s in starts])
    per_segment = len(plan_segments(1000, ClipOptions(100, 16)))
    expected = 4000 * per_segment / len(starts)
    assert abs(counts.mean() - expected) < 0.01 * expected and counts.std() < 0.25 * expected  # no segment over- or under-drawn


def _digests(ds, workers=2, state=None, stop=None):
    loader = wdsr.make_loader(ds, num_workers=workers, persistent_workers=False)
    if state is not None:
        loader.load_state_dict(state)
    out = []
    it = iter(loader)
    try:
        for lr, hr, keys in it:
            out.append(hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes() + json.dumps(keys).encode()).hexdigest()[:12])
            if stop is not None and len(out) == stop:
                break
    finally:
        it.close()
    return out, loader.state_dict()


def test_determinism_ranks_and_exact_resume(clips):
    cc = ClipConfig(frames=3, interval=(1, 3), reverse=0.5)
    a, _ = _digests(_ds(clips, cc), 2)
    assert a == _digests(_ds(clips, cc), 2)[0] and len(a) >= 4  # the same seed, epoch and world: the same batches
    counts = []
    for rank in (0, 1):
        whole, _ = _digests(_ds(clips, cc, World(rank, 2)), 2)
        counts.append(len(whole))
        for stop in (1, len(whole) // 2, len(whole) - 1):
            first, state = _digests(_ds(clips, cc, World(rank, 2)), 2, stop=stop)
            rest, _ = _digests(_ds(clips, cc, World(rank, 2)), 2, state=state)
            assert first + rest == whole, (rank, stop)
    assert counts[0] == counts[1]
    e1 = _digests(_ds(clips, cc), 2)[0]
    ds = _ds(clips, cc)
    ds.set_epoch(1)
    assert _digests(ds, 2)[0] != e1


def test_bad_frames_fail_or_skip_their_segment(clips, tmp_path, caplog):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(clips, bad)
    m = fmt.load(str(bad))
    victim = m.shards[0].keys[0]

    def corrupt(name: str, data: bytes) -> tuple[str, bytes]:  # frame 2 truncated: its digest and decode fail
        return (name, data[:100]) if name == f"{victim}.hr_f0002.png" else (name, data)

    rewrite(bad, 0, corrupt)
    cc = ClipConfig(frames=3)
    with pytest.raises(wdsr.SampleError, match=rf"{victim}.*hr_f0002.png"):
        list(wdsr.make_loader(_ds(bad, cc, patches_per_image=8), num_workers=0))
    ds = _ds(bad, cc, on_error="skip", patches_per_image=8)
    n = sum(len(b[2]) for b in wdsr.make_loader(ds, num_workers=0))
    assert n > 0 and ds.stats.totals()["skipped"] == 1


def test_clear_errors(clips, photo_shards):
    with pytest.raises(ValueError, match="a clip dataset .* clip=wdsr.ClipConfig"):
        wdsr.SRDataset(str(clips), scale=4, patch_size=48)
    with pytest.raises(ValueError, match="this one holds images"):
        wdsr.SRDataset(str(photo_shards), scale=4, patch_size=48, clip=ClipConfig(frames=3))
    with pytest.raises(ValueError, match="a clip dataset"):
        wdsr.SRDataset([str(clips), str(photo_shards)], scale=4, patch_size=48)
    for made in ("bicubic", "bicubic-uint8"):  # LR made from HR: what the clip kind does not serve yet, before any read
        with pytest.raises(ValueError, match=f"a clip dataset; lr='{made}' of clips is not there yet"):
            wdsr.SRDataset(str(clips), scale=4, patch_size=48, clip=ClipConfig(frames=3), lr=made)
    with pytest.raises(ValueError, match="a clip dataset; degrade= of clips is not there yet"):
        d = wdsr.RealESRGANConfig()
        wdsr.SRDataset(str(clips), scale=d.scale, patch_size=d.gt_size, degrade=d)
    with pytest.raises(ValueError, match="this one holds images"):  # clip= asks for windows of a clip dataset
        wdsr.SRDataset(str(photo_shards), scale=4, patch_size=48, clip=ClipConfig(frames=3), lr="bicubic")
    for bad, msg in (
        (dict(frames=0), "clip frames must be"),
        (dict(frames=4, window="center"), "odd number of frames"),
        (dict(interval=()), "clip interval must be"),
        (dict(reverse=2.0), "clip reverse must be"),
    ):
        with pytest.raises(ValueError, match=msg):
            ClipConfig(**bad)
    with pytest.raises(wdsr.SampleError, match="need a dataset built with --max-span 13 or more"):
        list(wdsr.make_loader(_ds(clips, ClipConfig(frames=7, interval=(2,)), patches_per_image=16), num_workers=0))


@pytest.mark.s3
def test_clips_stream_from_s3_through_faults(clips, s3):
    """The clip dataset on S3 (SeaweedFS on 127.0.0.1) behind a proxy that cuts replies and answers 503:
    the batches of local disk, byte for byte, and the retries counted."""
    from tests.faultproxy import FaultProxy
    from tests.test_tiled_s3 import AMPLE, _upload

    url = _upload(s3, clips, "clips-faults")
    cc = ClipConfig(frames=3, interval=(1, 2))
    want, _ = _digests(_ds(clips, cc), 2)
    proxy = FaultProxy(s3.port)
    try:
        proxy.cut_after(30_000, times=4)
        proxy.fail_503(times=2)
        ds = _ds(url, cc, storage_options={"endpoint_url": proxy.endpoint}, retry=AMPLE)
        got, _ = _digests(ds, 2)
        assert got == want
        assert ds.stats.totals()["retries"] >= 1
    finally:
        proxy.close()


def test_a_mix_of_clip_datasets(clips, tmp_path):
    """Two clip datasets streamed as one mix (weights): windows from both, equal batches per rank."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(clips, other)
    (other / "manifest.json.idx").unlink(missing_ok=True)
    doc = json.loads((other / "manifest.json").read_text())
    doc["build"]["seed"] = 99  # another dataset (another manifest digest), the same clips
    (other / "manifest.json").write_text(json.dumps(doc))
    cc = ClipConfig(frames=3)
    mix = wdsr.SRDataset([str(clips), str(other)], weights=[1, 2], epoch_samples=18, scale=4, patch_size=48,
                         patches_per_image=2, batch_size=4, shuffle_buffer=8, clip=cc, return_keys=True)
    lens = []
    for rank in (0, 1):
        m = wdsr.SRDataset([str(clips), str(other)], weights=[1, 2], epoch_samples=18, scale=4, patch_size=48,
                           patches_per_image=2, batch_size=4, shuffle_buffer=8, clip=cc, world=World(rank, 2))
        lens.append(sum(1 for _ in wdsr.make_loader(m, num_workers=0)))
    assert lens[0] == lens[1] > 0
    got = [lr for lr, _, _ in wdsr.make_loader(mix, num_workers=2)]
    assert got and all(x.shape[1:] == (3, 3, 12, 12) for x in got)


def test_the_decoded_cache_keeps_clip_frames(clips, tmp_path):
    """With decoded_cache=, a clip's frames are kept one entry each (``{segment}#f{t}``): the second
    epoch maps them instead of decoding, and the batches are those of a run without the cache."""
    cc = ClipConfig(frames=3, interval=(1, 2))
    plain = _ds(clips, cc)
    want = [_digests(plain, 2)[0]]
    plain.set_epoch(1)
    want.append(_digests(plain, 2)[0])
    ds = _ds(clips, cc, decoded_cache=str(tmp_path / "cache"))
    got = [_digests(ds, 2)[0]]
    first = ds.stats.totals()
    ds.set_epoch(1)
    got.append(_digests(ds, 2)[0])
    after = ds.stats.totals()
    assert got == want
    assert first["decoded_stores"] > 0 and after["decoded_hits"] - first["decoded_hits"] > 0
    entries = list((tmp_path / "cache").rglob("*.pair"))
    assert len(entries) == after["decoded_stores"]  # each frame stored once, by whichever epoch decoded it first


def test_elastic_resume_of_clip_windows(clips):
    """A clip stream's state from a world of 2 resumes on a world of 1 (the rest of the epoch re-planned):
    the same windows whatever the worker count of the new world, none handed out twice."""
    cc = ClipConfig(frames=3, interval=(1, 2))
    kw = dict(batch_size=1, shuffle_buffer=0)
    first, state = _digests(_ds(clips, cc, World(0, 2), **kw), 1, stop=3)
    other, _ = _digests(_ds(clips, cc, World(1, 2), **kw), 1, stop=3)
    a, _ = _digests(_ds(clips, cc, World(0, 1), **kw), 1, state=state)
    b, _ = _digests(_ds(clips, cc, World(0, 1), **kw), 2, state=state)
    assert a and sorted(a) == sorted(b)
    assert not (set(a) & set(first + other))  # nothing consumed before the change is handed out again
