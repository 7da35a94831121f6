"""Validation of clip datasets (issue 27): every frame of every clip once across ranks and workers, in
order, from segments spread over shards; chunks of at most ``val_frames`` frames with their context;
BasicSR's padded centre windows; the per-clip PSNR/SSIM protocol; memory bounded by a chunk; bad data."""

from __future__ import annotations

import ast
import ctypes
import importlib.util
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import wdsr
from shardmaker import format as fmt
from shardmaker.imaging.resize import downscale
from wdsr.env import World
from wdsr.metrics import psnr_y
from wdsr.pipeline.clipval import PADDINGS, ClipMeter, center_window, context
from tests.helpers import build_shards, mosaic, rewrite, save

LENGTHS = {"000": 40, "001": 23, "002": 9}  # clip -> frames: 4 segments, 2 segments, 1 segment of 16


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> tuple[Path, Path]:
    """(source frames, dataset): pans across real photos, built as segments of 16 frames spanning up to 9,
    several shards, so a clip's segments lie in different shards, out of order."""
    scene = mosaic(300, 900)
    root = tmp_path_factory.mktemp("clipval-src")
    for c, (name, n) in enumerate(LENGTHS.items()):
        for t in range(n):
            x0 = 500 - 3 * t - 41 * c
            save(root / name / f"{t:08d}.png", np.ascontiguousarray(scene[10 + 40 * c : 10 + 40 * c + 64, x0 : x0 + 96]))
    out = tmp_path_factory.mktemp("clipval") / "ds"
    build_shards(root, out, "--clips", "--scale", "4", "--segment", "16", "--max-span", "9", "--shard-size", "150KB")
    return root, out


def _frame(root: Path, clip: str, f: int) -> np.ndarray:
    return np.asarray(Image.open(root / clip / f"{f:08d}.png"))


def _chw(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))


ONE = World(0, 1)


def _val(url, cc: wdsr.ClipConfig, world=ONE, workers: int = 0, **kw) -> list[wdsr.ValClip]:
    ds = wdsr.SRDataset(str(url), scale=4, split="val", clip=cc, world=world, **kw)
    # not persistent: the loader shuts its workers down as the pass ends
    return list(wdsr.make_loader(ds, num_workers=workers, persistent_workers=False)) if workers else list(ds)


def test_segments_are_spread_over_shards(clips):
    """The fixture makes the case the pass must handle: a clip's segments in several shards, not in frame order."""
    m = fmt.load(str(clips[1]))
    where = [(s, str(k)) for s, info in enumerate(m.shards) for k in info.keys if str(k).startswith("000_")]
    assert len(where) == 4 and len({s for s, _ in where}) > 1 and [k for _, k in where] != sorted(k for _, k in where)


@pytest.mark.parametrize("window,workers", [("recurrent", 0), ("center", 2)])
def test_every_frame_of_every_clip_once_in_order_with_its_context(clips, window, workers):
    root, url = clips
    cc = wdsr.ClipConfig(frames=5, window=window, val_frames=12)
    c = context(cc)
    items = _val(url, cc, workers=workers)
    by_clip = defaultdict(list)
    for it in items:
        by_clip[it.clip].append(it)
    assert set(by_clip) == set(LENGTHS)
    for clip, chunks in by_clip.items():
        n = LENGTHS[clip]
        own = [f for it in chunks for f in range(it.first + it.own.start, it.first + it.own.stop)]
        assert own == list(range(n))  # in order, each frame once, none missing
        for it in chunks:
            lo, hi = it.first, it.first + len(it.lr)
            a, b = lo + it.own.start, lo + it.own.stop
            assert it.clip_frames == n and len(it.lr) <= cc.val_frames and it.lr.dtype == torch.uint8
            assert a - lo >= min(c, a) and hi - b >= min(c, n - b)  # context frames each side, where the clip has them
            for i in range(len(it.lr)):  # frames of overlapping segments, each the right one
                hr = _frame(root, clip, lo + i)
                assert torch.equal(it.lr[i], _chw(downscale(hr, 4)))
                if a <= lo + i < b:
                    assert torch.equal(it.hr[lo + i - a], _chw(hr))
        assert len(chunks) > 1 or n <= cc.val_frames


@pytest.mark.parametrize("size,workers", [(2, 0), (3, 2), (4, 1)])
def test_each_clip_is_validated_by_one_slot_of_the_world(clips, size, workers):
    cc = wdsr.ClipConfig(frames=3, val_frames=10)
    whole = _val(clips[1], cc)
    seen: dict[str, int] = {}
    got = defaultdict(list)
    for rank in range(size):
        for it in _val(clips[1], cc, world=World(rank, size), workers=workers):
            assert seen.setdefault(it.clip, rank) == rank  # a clip never spans two ranks
            got[it.clip].append(it)
    assert set(seen) == set(LENGTHS)
    for it in whole:  # and each rank gives its clips' chunks exactly as one rank alone does
        mine = got[it.clip].pop(0)
        assert (mine.first, mine.own) == (it.first, it.own) and torch.equal(mine.lr, it.lr) and torch.equal(mine.hr, it.hr)
    assert not any(got.values())


def _basicsr_generate_frame_indices():
    """BasicSR's own ``generate_frame_indices``, read from the installed package's source (importing
    ``basicsr.data`` pulls in torchvision, which is not installed here)."""
    spec = importlib.util.find_spec("basicsr")
    if spec is None or spec.origin is None:
        pytest.skip("basicsr: the Makefile installs it (--no-deps)")
    path = Path(spec.origin).parent / "data" / "data_util.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "generate_frame_indices")
    scope: dict = {}
    exec(compile(ast.Module([fn], []), str(path), "exec"), scope)
    return scope["generate_frame_indices"]


def test_center_windows_follow_basicsrs_padding_at_both_ends():
    # BasicSR's docstring examples (centre 0 of 5 frames), and the same at the other end of a 10-frame clip
    start = {
        "replicate": [0, 0, 0, 1, 2],
        "reflection": [2, 1, 0, 1, 2],
        "reflection_circle": [4, 3, 0, 1, 2],
        "circle": [3, 4, 0, 1, 2],
    }
    end = {
        "replicate": [7, 8, 9, 9, 9],
        "reflection": [7, 8, 9, 8, 7],
        "reflection_circle": [7, 8, 9, 6, 5],
        "circle": [7, 8, 9, 5, 6],
    }
    for mode in PADDINGS:
        assert center_window(0, 10, 5, mode) == start[mode], mode
        assert center_window(9, 10, 5, mode) == end[mode], mode
        assert center_window(4, 10, 5, mode) == [2, 3, 4, 5, 6]  # no padding inside the clip
    assert center_window(1, 10, 7, "reflection_circle") == [6, 5, 0, 1, 2, 3, 4]  # center + h - i
    assert center_window(8, 10, 7, "circle") == [5, 6, 7, 8, 9, 3, 4]  # i - frames
    generate = _basicsr_generate_frame_indices()
    for mode in PADDINGS:
        for frames in (1, 3, 5, 7):
            for length in range(frames, 16):
                for c in range(length):
                    assert center_window(c, length, frames, mode) == generate(c, length, frames, padding=mode), (mode, c)
    assert center_window(0, 2, 7, "reflection") == [1, 1, 1, 0, 1, 0, 0]  # shorter than the window: clamped into the clip
    with pytest.raises(ValueError, match="padding must be one of"):
        center_window(0, 10, 5, "zeros")


@pytest.mark.parametrize("padding", PADDINGS)
def test_center_chunks_carry_each_frames_padded_window(clips, padding):
    root, url = clips
    cc = wdsr.ClipConfig(frames=5, window="center", val_frames=9, val_padding=padding)
    for it in _val(url, cc):
        assert it.windows.shape == (len(it.hr), 5)
        for i, row in enumerate(it.windows.tolist()):
            f = it.first + it.own.start + i
            want = center_window(f, it.clip_frames, 5, padding)
            assert [it.first + j for j in row] == want
            assert torch.equal(it.lr[row[2]], _chw(downscale(_frame(root, it.clip, f), 4)))  # the centre is the frame itself


def _sr(it: wdsr.ValClip, seed: int) -> torch.Tensor:
    """A stand-in model's output for the chunk's own frames: HR with clip-dependent noise."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randint(-1 - 5 * seed, 2 + 5 * seed, it.hr.shape, generator=g)
    return (it.hr.to(torch.int32) + noise).clamp(0, 255).to(torch.uint8)


def test_clip_meter_averages_per_clip_then_over_clips(clips):
    cc = wdsr.ClipConfig(frames=3, val_frames=10)
    items = _val(clips[1], cc)
    seeds = {k: i for i, k in enumerate(LENGTHS)}
    meter = ClipMeter(crop_border=4, ssim=False)
    frames = defaultdict(list)
    for it in items:
        sr = _sr(it, seeds[it.clip])
        meter.add(it, sr)
        frames[it.clip] += [psnr_y(sr[i], it.hr[i], 4) for i in range(len(sr))]
    got = meter.result()
    per_clip = {k: float(np.mean(v)) for k, v in frames.items()}
    assert got["clips"].keys() == per_clip.keys() and not got["incomplete"]
    assert all(abs(got["clips"][k]["psnr_y"] - v) < 1e-9 and got["clips"][k]["frames"] == LENGTHS[k] for k, v in per_clip.items())
    assert abs(got["psnr_y"] - np.mean(list(per_clip.values()))) < 1e-9
    assert abs(got["psnr_y"] - np.mean([p for v in frames.values() for p in v])) > 0.05  # not a mean over frames
    with pytest.raises(ValueError, match="scored twice"):
        meter.add(items[0], _sr(items[0], 0))
    # two ranks' meters merged give the one result; a rank's clip missing a chunk is left out, named
    halves = [ClipMeter(crop_border=4, ssim=False), ClipMeter(crop_border=4, ssim=False)]
    for n, it in enumerate(items):
        halves[n % 2].add(it, _sr(it, seeds[it.clip]))
    halves[0].merge(halves[1].state())
    both = halves[0].result()
    assert both["incomplete"] == [] and abs(both["psnr_y"] - got["psnr_y"]) < 1e-9
    assert {k: v["frames"] for k, v in both["clips"].items()} == {k: v["frames"] for k, v in got["clips"].items()}
    with pytest.raises(ValueError, match="scored on two ranks"):
        halves[0].merge(halves[1].state())
    part = ClipMeter(crop_border=4, ssim=False)
    for it in items[1:]:
        part.add(it, _sr(it, seeds[it.clip]))
    short = part.result()
    assert short["incomplete"] == [items[0].clip]
    assert abs(short["psnr_y"] - np.mean([v for k, v in per_clip.items() if k != items[0].clip])) < 1e-9


def test_ssim_is_averaged_the_same_way(clips):
    cc = wdsr.ClipConfig(frames=3, val_frames=30)
    items = _val(clips[1], cc)
    meter = ClipMeter(crop_border=4)
    for it in items:
        meter.add(it, it.hr)  # a perfect model: SSIM 1 on every clip
    got = meter.result()
    assert abs(got["ssim_y"] - 1.0) < 1e-12 and got["psnr_y"] == float("inf")


def _heap_in_use() -> int:
    """Bytes glibc's malloc has handed out and not got back (what pyspng's decoded frames live in, which
    tracemalloc does not see)."""

    class Info(ctypes.Structure):
        _fields_ = [
            (n, ctypes.c_size_t)
            for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
        ]

    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc's mallinfo2 (glibc 2.33+) measures the heap")
    libc.mallinfo2.restype = Info
    got = libc.mallinfo2()
    return got.uordblks + got.hblkhd


def test_a_500_frame_clip_is_never_held_whole(tmp_path):
    """Heap in use during the pass over a 500-frame clip (26 MB decoded, two segments of 250 frames) stays
    near one chunk's frames plus a segment's compressed bytes: neither the clip nor a segment is held decoded.
    (Frames of a photo enlarged 4x, so the compressed segments are small beside the decoded frames.)"""
    scene = np.repeat(np.repeat(mosaic(40, 400), 4, 0), 4, 1)
    for t in range(500):
        save(tmp_path / "src" / "long" / f"{t:08d}.png", np.ascontiguousarray(scene[16:144, 1000 - 2 * t : 1128 - 2 * t]))
    url = build_shards(tmp_path / "src", tmp_path / "ds", "--clips", "--scale", "4", "--segment", "250", "--max-span", "9")
    cc = wdsr.ClipConfig(frames=5, val_frames=16)
    ds = wdsr.SRDataset(str(url), scale=4, split="val", clip=cc, world=World(0, 1))
    whole = 500 * (128 * 128 * 3 + 32 * 32 * 3)
    frames, peak = 0, 0
    base = _heap_in_use()
    for it in ds:
        frames += len(it.hr)
        del it
        peak = max(peak, _heap_in_use() - base)
    assert frames == 500
    assert peak < whole / 4, (peak, whole)  # held whole: > whole; one segment decoded: > whole / 2


def _corrupt_frame(ds: Path, key: str, frame: int) -> None:
    m = fmt.load(str(ds))
    shard = next(s for s, info in enumerate(m.shards) if key in [str(k) for k in info.keys])

    def edit(name, data):
        if name == f"{key}.hr_f{frame:04d}.png":
            data = data[:-40] + bytes(40)
        return name, data

    rewrite(ds, shard, edit)


def test_a_bad_segment_fails_or_ends_only_its_clip(clips, tmp_path):
    import shutil

    url = tmp_path / "ds"
    shutil.copytree(clips[1], url)
    _corrupt_frame(url, "000_f000016", 3)  # clip 000's third segment (frames 16..31)
    cc = wdsr.ClipConfig(frames=3, val_frames=10)
    with pytest.raises(wdsr.SampleError, match="000_f000016"):
        _val(url, cc)
    ds = wdsr.SRDataset(str(url), scale=4, split="val", clip=cc, world=World(0, 1), on_error="skip")
    items = list(ds)
    meter = ClipMeter(crop_border=4, ssim=False)
    for it in items:
        meter.add(it, it.hr)
    got = meter.result()
    assert got["incomplete"] == ["000"] and set(got["clips"]) == set(LENGTHS)
    assert 0 < got["clips"]["000"]["frames"] < 24  # frames 24.. are only in the bad segment: none scored
    assert ds.stats.totals()["skipped"] == 1


def test_val_options_are_checked(clips):
    with pytest.raises(ValueError, match="val_frames >= 7"):
        wdsr.SRDataset(str(clips[1]), scale=4, split="val", clip=wdsr.ClipConfig(frames=7, val_frames=6))
    with pytest.raises(ValueError, match="tile= cuts images"):
        wdsr.SRDataset(str(clips[1]), scale=4, split="val", tile=16, clip=wdsr.ClipConfig(frames=3))
