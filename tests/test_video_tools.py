"""Video beyond training (issue 39): ``wdsr preview`` draws windows of a clip dataset (frames in order,
LR|HR per frame), and ``wdsr upscale`` upscales a video file or a folder of frames, an image model frame
by frame, a video model over sliding windows."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import wdsr
from tests.helpers import ROOT, build_shards, mosaic, save
from wdsr.config import DatasetConfig
from wdsr.pipeline import clipval
from wdsr.pipeline.clips import ClipConfig
from wdsr.tools import upscale_video
from wdsr.tools.cli import main
from wdsr.tools.frames import open_clip
from wdsr.tools.preview import LABEL_H, label_strip, labelled_windows
from wdsr.tools.upscale import load_model, upscale_image
from wdsr.tools.upscale_video import VideoWindow, video_sr

SHIFT = 2  # HR pixels the scene moves per frame


def pan(n: int, h: int = 48, w: int = 64, c: int = 0) -> list[np.ndarray]:
    """``n`` frames of a pan across real photos."""
    scene = mosaic(200, 400)
    return [
        np.ascontiguousarray(scene[20 + 30 * c : 20 + 30 * c + h, 300 - SHIFT * t - 37 * c : 300 - SHIFT * t - 37 * c + w])
        for t in range(n)
    ]


@pytest.fixture(scope="module")
def clip_ds(tmp_path_factory) -> Path:
    """Two clips (9 and 7 frames of 48x64) at x2, segments of 8 frames spanning up to 5."""
    root = tmp_path_factory.mktemp("video-tools-src")
    for c, n in enumerate((9, 7)):
        for t, f in enumerate(pan(n, c=c)):
            save(root / f"{c:03d}" / f"{t:08d}.png", f)
    out = tmp_path_factory.mktemp("video-tools") / "ds"
    return Path(build_shards(root, out, "--clips", "--scale", "2", "--segment", "8", "--max-span", "5"))


def test_preview_of_clips_draws_windows_of_frames_in_order(clip_ds, tmp_path, capsys):
    """Rows are windows (the ones epoch 0 cuts, the stream's own cut_windows), columns their frames in
    order, each cell the frame's LR nearest-upscaled left of its HR."""
    png = tmp_path / "p.png"
    argv = ["preview", str(clip_ds), "-o", str(png), "--scale", "2", "--patch-size", "16", "-n", "3", "--clip-frames", "3"]
    assert main(argv) == 0
    assert "3 windows of 3 LR|HR frames" in capsys.readouterr().out
    img = np.asarray(Image.open(png))
    cell, row = 2 * 16 + 4, LABEL_H + 16 + 4
    width = 3 * cell + 2 * 8
    assert img.shape == (3 * row - 4, width, 3)
    cfg = DatasetConfig(scale=2, patch_size=16, seed=0, clip=ClipConfig(frames=3))
    got = labelled_windows(str(clip_ds), cfg, 3)
    assert len(got) == 3 and all(label.startswith(w.key) for w, label in got)
    assert all(w.frames == sorted(w.frames) or w.frames == sorted(w.frames, reverse=True) for w, _ in got)
    # the pixels are the stream's: epoch 0 of the train stream (k=2) yields each of these windows
    train = wdsr.SRDataset(str(clip_ds), config=dataclasses.replace(cfg, patches_per_image=2, batch_size=1))
    streamed = {hr.numpy().tobytes() for _, hrs in train for hr in hrs}
    for i, (w, label) in enumerate(got):
        assert w.hr.tobytes() in streamed
        top = i * row
        np.testing.assert_array_equal(img[top : top + LABEL_H], label_strip(label, width))
        for f in range(3):
            left = f * (cell + 8)
            lr = img[top + LABEL_H : top + LABEL_H + 16, left : left + 16]
            hr = img[top + LABEL_H : top + LABEL_H + 16, left + 20 : left + 36]
            np.testing.assert_array_equal(lr, w.lr[f].transpose(1, 2, 0).repeat(2, axis=0).repeat(2, axis=1))
            np.testing.assert_array_equal(hr, w.hr[f].transpose(1, 2, 0))


# --- wdsr upscale of clips ---------------------------------------------------------------------------

av = pytest.importorskip("av")
TRAIN = ["--scale", "2", "--patch-size", "16", "-k", "2", "--batch-size", "2", "--workers", "0", "--shuffle-buffer", "4"]
TRAIN += ["--steps", "1", "--val-every", "0", "--lr", "1e-2"]


@pytest.fixture(scope="module")
def runs(clip_ds, photo_shards, tmp_path_factory) -> dict[str, Path]:
    """One-step runs of wdsr train: an image model (ESPCN x2) and a video model (TinyVSR x2, windows of 3)."""
    root = tmp_path_factory.mktemp("video-tools-runs")
    image, video = root / "espcn", root / "tinyvsr"
    assert main(["train", "--data", str(photo_shards), "--out", str(image), "--model", "espcn", *TRAIN]) == 0
    assert main(["train", "--data", str(clip_ds), "--out", str(video), "--model", "tinyvsr", "--clip-frames", "3", *TRAIN]) == 0
    return {"image": image, "video": video}


def write_ffv1(path: Path, frames: list[np.ndarray]) -> Path:
    with av.open(str(path), "w") as c:
        st = c.add_stream("ffv1", rate=10)
        st.width, st.height, st.pix_fmt = frames[0].shape[1], frames[0].shape[0], "bgr0"
        for f in frames:
            for p in st.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                c.mux(p)
        for p in st.encode():
            c.mux(p)
    return path


def read_video(path: Path) -> list[np.ndarray]:
    with av.open(str(path)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]


def png_frames(out: Path) -> list[np.ndarray]:
    return [np.asarray(Image.open(p)) for p in sorted(out.glob("frame_*.png"))]


def test_an_image_model_upscales_a_video_frame_by_frame(runs, tmp_path, capsys):
    """Each PNG frame is the frame upscaled as an image; --video writes the same frames losslessly; outputs
    are never replaced."""
    frames = pan(5)
    video = write_ffv1(tmp_path / "in.mkv", frames)
    out = tmp_path / "out"
    assert main(["upscale", str(runs["image"]), str(video), "-o", str(out), "--device", "cpu"]) == 0
    assert "5 frames" in capsys.readouterr().out
    got = png_frames(out)
    m = load_model(str(runs["image"]))
    assert [p.name for p in sorted(out.iterdir())] == [f"frame_{i:06d}.png" for i in range(5)]
    for f, sr in zip(frames, got, strict=True):
        np.testing.assert_array_equal(sr, upscale_image(m, f))
    assert not np.array_equal(got[0], got[1])  # the frames differ (the pan): each one is its own
    mkv = tmp_path / "sr.mkv"
    assert main(["upscale", str(runs["image"]), str(video), "-o", str(mkv), "--video", "--device", "cpu"]) == 0
    back = read_video(mkv)
    assert len(back) == 5 and all(np.array_equal(a, b) for a, b in zip(back, got, strict=True))
    capsys.readouterr()
    for target, extra in ((out, []), (mkv, ["--video"])):
        assert main(["upscale", str(runs["image"]), str(video), "-o", str(target), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert "exists; give --overwrite" in err and len(err.splitlines()) == 1, err


def test_a_folder_of_frames_with_a_video_model_runs_in_sliding_chunks(runs, tmp_path):
    """20 frames: two chunks of 16 (T=3: one context frame each side); frame f's output is the model's over
    the chunk that owns it (clipval's layout), the frame count the input's."""
    frames = pan(20, 24, 32)
    for t, f in enumerate(frames):
        save(tmp_path / "clip" / f"f{t}.png", f)  # natural order: f2 before f10
    out = tmp_path / "out"
    assert main(["upscale", str(runs["video"]), str(tmp_path / "clip"), "-o", str(out), "--device", "cpu"]) == 0
    got = png_frames(out)
    assert len(got) == 20
    m = load_model(str(runs["video"]))
    x = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2)[None].float() / 255
    layout = clipval.chunks(20, ClipConfig(frames=3, val_frames=16))
    assert len(layout) == 2
    with torch.no_grad():
        for lo, hi, a, b in layout:
            sr = m.model(x[:, lo:hi])[0, a - lo : b - lo]
            want = (sr.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
            for f in range(a, b):
                np.testing.assert_array_equal(got[f], want[f - a])
        whole = (m.model(x)[0].clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    assert not all(np.array_equal(g, w) for g, w in zip(got, whole, strict=True))  # not the whole clip at once


def test_centre_windows_are_padded_at_the_clip_ends(runs, tmp_path):
    """A centre-window model: frame f is the centre output of BasicSR's padded window around f."""
    frames = pan(7, 24, 32)
    for t, f in enumerate(frames):
        save(tmp_path / "clip" / f"{t:03d}.png", f)
    m = load_model(str(runs["video"]))
    got = list(video_sr(m, open_clip(tmp_path / "clip"), VideoWindow(3, center=True), torch.device("cpu")))
    x = torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).float() / 255
    with torch.no_grad():
        for f in range(7):
            sr = m.model(x[clipval.center_window(f, 7, 3)][None])[0, 1]
            np.testing.assert_array_equal(got[f], (sr.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy())
    assert clipval.center_window(0, 7, 3) == [2, 0, 1]  # reflection_circle at the start


@pytest.mark.parametrize("length", [1, 5, 16, 17, 29, 30, 31, 45])
def test_streamed_chunks_are_clipvals_layout_holding_a_chunk_at_most(length):
    read = []

    def frames():
        for i in range(length):
            read.append(i)
            yield i

    got = []
    for held, lo, a, b in upscale_video.chunks(frames(), length, 16, 3):
        assert held == list(range(lo, lo + len(held))) and len(read) <= lo + 16 + 1
        got.append((lo, lo + len(held), a, b))
    assert got == clipval.chunks(length, ClipConfig(frames=7, val_frames=16))


def test_without_pyav_a_video_is_one_line_and_exit_2(tmp_path):
    video = tmp_path / "in.mkv"
    video.write_bytes(b"\x1a\x45\xdf\xa3")
    block = tmp_path / "without-av" / "av"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text("raise ImportError('av is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(block.parent), str(ROOT)])}
    cmd = [sys.executable, "-m", "wdsr", "upscale", str(tmp_path / "run"), str(video), "-o", str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100, cwd=tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "pip install 'wdsr[video]'" in err, err
    assert not (tmp_path / "out").exists()


def test_a_video_over_max_pixels_is_refused_before_a_frame_is_decoded(tmp_path):
    video = write_ffv1(tmp_path / "in.mkv", pan(2))
    assert open_clip(video).count == 2
    with pytest.raises(ValueError, match=r"in.mkv.*64x48 = 3072 pixels is over the limit of 3071"):
        open_clip(video, max_pixels=64 * 48 - 1)
