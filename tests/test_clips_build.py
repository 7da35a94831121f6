"""Video clips built into shards (issue 27): REDS, Vimeo-90K and SurgiSR4K folder layouts and video
files (FFV1 lossless and H.264, written in the test with PyAV) from real photos panned by a known
shift per frame; segments that own every window start once; bad clips named or skipped."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from shardmaker import format as fmt
from shardmaker.builder import video
from shardmaker.builder.clips import ClipOptions, natural_key, plan_segments
from shardmaker.format import frame_member
from shardmaker.imaging import codecs
from shardmaker.imaging.resize import downscale
from tests.helpers import build_shards, mosaic, save, sm

av = pytest.importorskip("av")
real_video_info = video.video_info
SHIFT = 3  # pixels the scene moves right per frame


@pytest.fixture(scope="module")
def scene() -> np.ndarray:
    return mosaic(400, 900)


def frame(scene: np.ndarray, t: int, h: int = 96, w: int = 160) -> np.ndarray:
    """Frame ``t`` of a pan across real photos: frame t + 1 is frame t moved SHIFT pixels."""
    return np.ascontiguousarray(scene[40 : 40 + h, 400 - SHIFT * t : 400 - SHIFT * t + w])


def _segments(ds: Path) -> dict[str, tuple[dict, dict[str, np.ndarray]]]:
    out = {}
    for sh in fmt.load(str(ds)).shards:
        with open(ds / sh.name, "rb") as f:
            for key, _, members in fmt.iter_samples(f):
                meta = json.loads(members.pop("json"))
                out[key] = (meta, {n.split(".")[0]: codecs.decode(bytes(d), n.split(".")[-1]) for n, d in members.items()})
    return out


def _clip_frames(segs: dict, clip: str, side: str = "hr") -> list[np.ndarray]:
    """A clip's frames in order, from its segments (each frame once)."""
    got: dict[int, np.ndarray] = {}
    for meta, pix in segs.values():
        if meta["clip"] == clip:
            for t in range(meta["frames"]):
                got.setdefault(meta["first_frame"] + t, pix[frame_member(side, t, "x").rsplit(".", 1)[0]])
    assert sorted(got) == list(range(len(got)))
    return [got[i] for i in range(len(got))]


def _write_video(path: Path, frames: list[np.ndarray], codec: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as c:
        st = c.add_stream(codec, rate=30)
        st.width, st.height = frames[0].shape[1], frames[0].shape[0]
        st.pix_fmt = "bgr0" if codec == "ffv1" else "yuv420p"
        if codec != "ffv1":
            st.options = {"g": "8", "bf": "2"}  # keyframes every 8 frames, B-frames: seeking must be frame-exact
        for f in frames:
            for p in st.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(p)
        for p in st.encode():
            c.mux(p)


def test_reds_layout_with_provided_lr_and_segments(tmp_path, scene):
    hr, lr = tmp_path / "train_sharp", tmp_path / "train_sharp_bicubic" / "X4"
    for c in range(2):
        for t in range(23):
            f = frame(scene, t + 5 * c)
            save(hr / f"{c:03d}" / f"{t:08d}.png", f)
            save(lr / f"{c:03d}" / f"{t:08d}.png", downscale(f, 4))
    ds = build_shards(hr, tmp_path / "ds", "--clips", "--lr", str(lr), "--segment", "12", "--max-span", "5")
    m = fmt.load(str(ds))
    assert m.build["clips"] == {"segment": 12, "max_span": 5, "clips": 2, "frames": 46} and m.build["sources"] == 2
    segs = _segments(ds)
    assert sorted(segs) == ["000_f000000", "000_f000007", "000_f000013", "001_f000000", "001_f000007", "001_f000013"]
    for c in range(2):
        frames = _clip_frames(segs, f"{c:03d}")
        assert len(frames) == 23
        for t, f in enumerate(frames):
            np.testing.assert_array_equal(f, frame(scene, t + 5 * c))
        for t, f in enumerate(_clip_frames(segs, f"{c:03d}", "lr_x4")):
            np.testing.assert_array_equal(f, downscale(frame(scene, t + 5 * c), 4))
    meta = segs["000_f000007"][0]
    assert meta["frame_names"][0] == "00000007.png" and meta["lr_sources"] == {"4": "000"} and meta["clip_frames"] == 23


def test_vimeo_septuplets_and_generated_lr(tmp_path, scene):
    root = tmp_path / "sequences"
    for s, seq in enumerate(("00001/0001", "00001/0002", "00002/0001")):
        for t in range(1, 8):
            save(root / seq / f"im{t}.png", frame(scene, t + 9 * s, 64, 112))
    ds = build_shards(root, tmp_path / "ds", "--clips", "--scale", "2,4")
    segs = _segments(ds)
    assert sorted(segs) == ["00001/0001_f000000", "00001/0002_f000000", "00002/0001_f000000"]
    meta, pix = segs["00001/0002_f000000"]
    assert (meta["frames"], meta["owned"], meta["clip"]) == (7, [0, 7], "00001/0002")
    for t in range(7):
        hr = frame(scene, t + 1 + 9, 64, 112)
        np.testing.assert_array_equal(pix[f"hr_f{t:04d}"], hr)
        for s in (2, 4):
            np.testing.assert_array_equal(pix[f"lr_x{s}_f{t:04d}"], downscale(hr, s))


def test_surgisr4k_names_sort_naturally_and_tile(tmp_path, scene):
    root = tmp_path / "surg"
    for t in range(1, 13):  # frame1 .. frame12: lexicographic order would put frame10 after frame1
        save(root / "case07" / f"frame{t}.png", frame(scene, t))
    assert sorted([f"frame{t}.png" for t in (1, 2, 10)], key=natural_key) == ["frame1.png", "frame2.png", "frame10.png"]
    ds = build_shards(root, tmp_path / "ds", "--clips", "--scale", "4", "--codec", "qoi", "--tiles", "32")
    m = fmt.load(str(ds))
    assert [t for sh in m.shards for t in sh.tiles] == [32]
    with open(ds / m.shards[0].name, "rb") as f:
        _, _, members = next(fmt.iter_samples(f))
    from shardmaker.imaging import TiledImage

    for t in range(12):
        np.testing.assert_array_equal(np.asarray(TiledImage(bytes(members[f"hr_f{t:04d}.tiles"]))), frame(scene, t + 1))
    assert json.loads(members["json"])["frame_names"][9] == "frame10.png"


@pytest.mark.parametrize("codec", ["ffv1", "libx264"])
def test_video_files_decode_frame_exactly(tmp_path, scene, codec, monkeypatch):
    demuxed: list[str] = []  # the segments' own demuxes of the whole video (each made the build quadratic)
    monkeypatch.setattr(video, "video_info", lambda url, *a: demuxed.append(url) or real_video_info(url, *a))
    frames = [frame(scene, t) for t in range(40)]
    _write_video(tmp_path / "vids" / "op1.mkv", frames, codec)
    with av.open(str(tmp_path / "vids" / "op1.mkv")) as c:
        ref = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]  # decoded front to back
    if codec == "ffv1":
        assert all(np.array_equal(a, b) for a, b in zip(ref, frames, strict=True))  # lossless
    ds = build_shards(tmp_path / "vids", tmp_path / "ds", "--clips", "--scale", "4", "--segment", "16", "--max-span", "6")
    segs = _segments(ds)
    assert len(segs) == 4 and {m["clip"] for m, _ in segs.values()} == {"op1"}
    assert demuxed == []  # demuxed once, by the scan: each segment seeks straight to the timestamps it was given
    got = _clip_frames(segs, "op1")
    assert len(got) == 40
    for t in range(40):  # segments start mid-GOP: each frame is the one at its timestamp
        np.testing.assert_array_equal(got[t], ref[t], err_msg=f"frame {t}")


@pytest.mark.parametrize("frames,segment,span", [(5, 100, 16), (100, 100, 16), (101, 100, 16), (1000, 100, 32), (37, 10, 10), (9, 4, 1)])
def test_segments_own_every_window_start_once(frames, segment, span):
    segs = plan_segments(frames, ClipOptions(segment, span))
    owned = [s for _, _, a, b in segs for s in range(a, b)]
    assert owned == list(range(frames))  # a partition of the starts, in order
    for first, count, a, b in segs:
        assert count <= segment and first == a
        for w in range(1, span + 1):  # every window of up to span frames starting here lies in this segment
            for s in range(a, min(b, frames - w + 1)):
                assert first <= s and s + w <= first + count
    full = [min(b, frames - span + 1) - a for _, _, a, b in segs]  # starts of the longest windows
    assert max(full) - min(full) <= 1 or len(segs) == 1


def test_bad_clips_are_named_or_skipped(capsys, tmp_path, scene):
    root = tmp_path / "clips"
    for t in (0, 1, 2, 4, 5):  # frame 3 is missing
        save(root / "gap" / f"{t:08d}.png", frame(scene, t))
    for t in range(5):
        save(root / "size" / f"{t:08d}.png", frame(scene, t, 96, 160 if t != 2 else 158))
        save(root / "good" / f"{t:08d}.png", frame(scene, t))
    rc, _, se = sm(capsys, "build", str(root), str(tmp_path / "a"), "--clips", "--workers", "1")
    assert rc == 2 and "gap: frame numbers jump from 00000002.png to 00000004.png" in se, se
    rc, so, se = sm(capsys, "build", str(root), str(tmp_path / "b"), "--clips", "--workers", "1", "--on-error", "skip")
    assert rc == 0, se
    assert "skipped 2 source file(s)" in so and "size: frame 00000002.png is 158x96, frame 00000000.png 160x96" in so, so
    assert [k for sh in fmt.load(str(tmp_path / "b")).shards for k in sh.keys] == ["good_f000000"]
    lr = tmp_path / "lr"
    for t in range(4):  # one LR frame short
        save(lr / "good" / f"{t:08d}.png", downscale(frame(scene, t), 4))
    rc, _, se = sm(capsys, "build", str(root / "good"), str(tmp_path / "c"), "--clips", "--lr", str(lr / "good"), "--workers", "1")
    assert rc == 2 and "LR frames differ from the HR clip's (4 vs 5" in se, se
    rc, _, se = sm(capsys, "build", str(root), str(tmp_path / "d"), "--clips", "--segment", "4", "--max-span", "9")
    assert rc == 2 and "clips need 1 <= max_span <= segment" in se, se


def test_verify_checks_clip_segments_frame_by_frame(capsys, tmp_path, scene):
    from shardmaker.verify import verify
    from tests.helpers import rewrite

    root = tmp_path / "clips"
    for t in range(1, 9):
        save(root / "case1" / f"frame{t}.png", frame(scene, t))
    whole = build_shards(root, tmp_path / "ds", "--clips", "--scale", "2,4", "--segment", "5", "--max-span", "3")
    tiled = build_shards(root, tmp_path / "dt", "--clips", "--scale", "4", "--codec", "qoi", "--tiles", "32")
    rc, so, _ = sm(capsys, "build", root, tmp_path / "dh", "--clips", "--hr-only", "--workers", "1")
    last = so.splitlines()[-1]  # a clip build counts clips, not images
    assert rc == 0 and "1 samples (1 clip(s)) in 1 shards" in last and last.endswith(" clips/s") and "images" not in so, so
    hr_only = tmp_path / "dh"
    for ds in (whole, tiled, hr_only):
        assert verify(str(ds), progress=False) == [] and verify(str(ds), deep=True, progress=False) == [], ds
    rc, so, _ = sm(capsys, "info", str(whole))
    assert rc == 0 and "clips      1 clip(s), 8 frames, in 2 segment sample(s) of at most 5 frames (windows of up to 3" in so, so
    rc, so, _ = sm(capsys, "info", str(hr_only))
    assert rc == 0 and "scales     none (HR-only)\n" in so and "LR         none (HR-only)" in so, so
    key = fmt.load(str(whole)).shards[0].keys[0]

    def flip(name: str, data: bytes) -> tuple[str, bytes]:  # one byte of frame 1's x2 LR
        if name == f"{key}.lr_x2_f0001.png":
            data = data[:-20] + bytes([data[-20] ^ 1]) + data[-19:]
        return name, data

    rewrite(whole, 0, flip)
    problems = verify(str(whole), deep=True, progress=False)
    assert problems and all(key in p for p in problems) and "lr_x2_f0001.png does not match its sha256" in problems[0], problems
