"""Video beyond training (issue 39): ``wdsr preview`` draws windows of a clip dataset (frames in order,
LR|HR per frame), and ``wdsr upscale`` upscales a video file or a folder of frames, an image model frame
by frame, a video model over sliding windows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import wdsr
from tests.helpers import build_shards, mosaic, save
from wdsr.config import DatasetConfig
from wdsr.pipeline.clips import ClipConfig
from wdsr.tools.cli import main
from wdsr.tools.preview import LABEL_H, label_strip, labelled_windows

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
