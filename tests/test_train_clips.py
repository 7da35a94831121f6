"""`wdsr train` on clip datasets (issue 27): TinyVSR propagates both ways through a window, clips reach a
checkpoint with data_wait logged, --resume continues at the exact batch, SIGTERM checkpoints, and a
model of the other kind than the data is one line, exit 2; --val-data scores whole clips REDS4-style."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import wdsr
from shardmaker.imaging.resize import downscale
from tests.helpers import ROOT, build_shards, descendants, free_port, is_running, mosaic, save, wait_until
from wdsr.metrics import psnr_y, ssim_y
from wdsr.tools.cli import main
from wdsr.train.checkpoint import RunDir
from wdsr.train.clipvalidate import bicubic_clips, val_clip_config, validate_clips
from wdsr.train.config import make_config
from wdsr.train.loop import weights_digest
from wdsr.train.models import TinyVSR, build_model
from wdsr.train.upsample import MatlabBicubic
from wdsr.train.validate import quantise

SHIFT = 2  # HR pixels the scene moves per frame
# 4 segments x k=4 windows / batch 2 = 8 batches per epoch
SMALL = ["--model", "tinyvsr", "--scale", "2", "--patch-size", "32", "-k", "4", "--batch-size", "2", "--workers", "1"]
SMALL += ["--shuffle-buffer", "4", "--val-every", "0"]


@pytest.fixture(scope="module")
def clip_src(tmp_path_factory) -> Path:
    """Two REDS-style clips (12 and 10 frames) of a pan across real photos."""
    scene = mosaic(300, 800)
    root = tmp_path_factory.mktemp("train-clips-src")
    for c, n in enumerate((12, 10)):
        for t in range(n):
            x0 = 400 - SHIFT * t - 37 * c
            save(root / f"{c:03d}" / f"{t:08d}.png", np.ascontiguousarray(scene[20 + 30 * c : 84 + 30 * c, x0 : x0 + 96]))
    return root


@pytest.fixture(scope="module")
def clips(tmp_path_factory, clip_src) -> Path:
    """The clips at x2 in segments of 8 frames spanning up to 5: 4 samples."""
    out = tmp_path_factory.mktemp("train-clips") / "ds"
    return build_shards(clip_src, out, "--clips", "--scale", "2", "--segment", "8", "--max-span", "5")


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train(data: Path, out: Path, *extra: str) -> int:
    return main(["train", "--data", str(data), "--out", str(out), *SMALL, *extra])


def test_tinyvsr_propagates_each_frame_both_ways_and_its_centre_mode_is_the_same_weights():
    torch.manual_seed(0)
    net = build_model("tinyvsr", 2)
    assert isinstance(net, TinyVSR) and sum(p.numel() for p in net.parameters()) < 10_000  # fast on a CPU
    x = torch.rand(2, 5, 3, 8, 8)
    out = net(x)
    assert out.shape == (2, 5, 3, 16, 16)
    later, earlier = x.clone(), x.clone()
    later[:, 4] = torch.rand(2, 3, 8, 8)
    earlier[:, 0] = torch.rand(2, 3, 8, 8)
    with torch.no_grad():
        assert not torch.allclose(net(later)[:, 0], out[:, 0])  # backward propagation: frame 0 sees frame 4
        assert not torch.allclose(net(earlier)[:, 4], out[:, 4])  # forward propagation: frame 4 sees frame 0
        centre = build_model("tinyvsr", 2, center=True)
        centre.load_state_dict(net.state_dict())
        assert torch.allclose(centre(x), out[:, 2], atol=1e-6) and centre(x).shape == (2, 3, 16, 16)
        assert net(x[:, 0]).shape == (2, 3, 16, 16)  # one frame: a clip of one (what wdsr upscale hands it)


def test_clips_train_to_a_checkpoint_with_data_wait_logged(clips, tmp_path):
    out = tmp_path / "run"
    rc = train(clips, out, "--clip-frames", "3", "--clip-interval", "1,2", "--clip-reverse", "0.5", "--steps", "4")
    assert rc == 0
    logged = [r for r in records(out) if "loss" in r]
    assert [r["step"] for r in logged] == [4]  # --log-every 50: the last step is logged
    assert all(0 < r["data_wait"] <= 1 and r["patches_per_s"] > 0 and r["loss"] > 0 for r in logged)  # next() takes time
    run = RunDir(str(out))
    state = run.load_latest()
    assert state["step"] == 4 and state["loader"]["batches"] == 4 and state["loader"]["epoch"] == 0
    config = state["config"]
    assert (config["clip_frames"], config["clip_interval"], config["clip_window"], config["clip_reverse"]) == (
        3,
        [1, 2],
        "recurrent",
        0.5,
    )
    net = build_model("tinyvsr", 2)
    net.load_state_dict(state["model"])
    assert weights_digest(net) == records(out)[-1]["weights_sha256"][0]


def test_center_windows_from_a_config_file(clips, tmp_path):
    """The clip keys in a config file (flag names, either spelling, or under dataset:); center windows train
    the centre frame's HR."""
    (tmp_path / "c.yaml").write_text("clip-frames: 3\nclip_window: center\ndataset:\n  clip-interval: [1, 2]\n")
    out = tmp_path / "run"
    assert train(clips, out, "--config", str(tmp_path / "c.yaml"), "--steps", "2") == 0
    state = RunDir(str(out)).load_latest()
    assert (state["config"]["clip_window"], state["config"]["clip_interval"], state["step"]) == ("center", [1, 2], 2)


def test_resume_continues_at_the_exact_batch(clips, tmp_path):
    """Stopped mid-epoch at step 3, resumed to step 11 (across the epoch boundary at 8): the weights of a
    straight 11-step run. A constant lr (step schedule) so that --steps may differ between the parts."""
    flags = ["--clip-frames", "3", "--clip-interval", "1,2", "--schedule", "step", "--lr-step", "1000000", "--lr", "1e-3"]
    assert train(clips, tmp_path / "straight", *flags, "--steps", "11") == 0
    want = records(tmp_path / "straight")[-1]["weights_sha256"]
    out = tmp_path / "run"
    assert train(clips, out, *flags, "--steps", "3") == 0
    state = RunDir(str(out)).load_latest()
    assert (state["loader"]["epoch"], state["loader"]["batches"]) == (0, 3)  # mid-epoch: the exact position
    assert train(clips, out, *flags, "--steps", "11", "--resume") == 0
    done = records(out)[-1]
    assert done["event"] == "finished" and done["step"] == 11 and done["epoch"] == 1
    assert done["weights_sha256"] == want


def test_sigterm_checkpoints_clips_and_resume_continues(clips, tmp_path, caplog):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "wdsr", "train", "--data", str(clips), "--out", str(out), *SMALL, "--clip-frames", "3"]
    argv += ["--steps", "100000", "--log-every", "1", "--ckpt-every", "100000"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    try:
        seen = []
        for line in proc.stdout:  # blocks until the run logs: no clock involved
            seen.append(line)
            if " step 2 epoch " in line:
                break
        assert seen and " step 2 epoch " in seen[-1], "".join(seen)[-3000:]
        workers = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        logs = "".join(seen) + proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, logs[-3000:]
    assert "SIGTERM" in logs and workers
    wait_until(lambda: not any(is_running(p) for p in workers), "end of the DataLoader workers")
    run = RunDir(str(out))
    state = run.load_latest()
    step = state["step"]
    assert step >= 2 and records(out)[-1]["event"] == "stopped" and records(out)[-1]["step"] == step
    assert (state["loader"]["epoch"], state["loader"]["batches"]) == (step // 8, step % 8)
    caplog.set_level("INFO", logger="wdsr")
    assert train(clips, out, "--clip-frames", "3", "--steps", str(step + 2), "--log-every", "1", "--resume") == 0
    assert f"resuming at step {step}: epoch {step // 8}, batch {step % 8} of 8 (exact data position)" in caplog.text
    assert [r["step"] for r in records(out) if "loss" in r and r["step"] > step] == [step + 1, step + 2]


@pytest.mark.parametrize(
    "case, data, args, message",
    [
        ("clips for an image model", "clips", ["--model", "espcn"], "a clip dataset (shardmaker build --clips): train a video"),
        ("images for a video model", "images", ["--clip-frames", "3"], "an image dataset; --model tinyvsr"),
        ("video model without frames", "clips", [], "give --clip-frames T"),
        ("image model with frames", "clips", ["--model", "espcn", "--clip-frames", "3"], "is an image model"),
        ("clip setting without frames", "clips", ["--clip-window", "center"], "--clip-window without --clip-frames"),
        (
            "clip validation in tiles",
            "clips",
            ["--clip-frames", "3", "--val-data", "{data}", "--val-every", "2", "--val-tile", "16"],
            "clips are validated whole frames",
        ),
        ("windows past max-span", "clips", ["--clip-frames", "5", "--clip-interval", "2"], "built with --max-span 5"),
        ("even centre window", "clips", ["--clip-frames", "4", "--clip-window", "center"], "odd number of frames"),
        (
            "interval out of range",
            "clips",
            ["--clip-frames", "3", "--clip-interval", "1,0"],
            "--clip-interval must be an integer in [1, 1000]",
        ),
        (
            "reverse not a probability",
            "clips",
            ["--clip-frames", "3", "--clip-reverse", "1.5"],
            "--clip-reverse must be a finite",
        ),
    ],
)
def test_a_mismatch_is_one_line_and_exit_2_before_any_work(clips, photo_shards, tmp_path, capsys, case, data, args, message):
    url = str(clips if data == "clips" else photo_shards)
    argv = [a.replace("{data}", url) for a in args]
    assert main(["train", "--data", url, "--out", str(tmp_path / "run"), *SMALL, *argv, "--steps", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_clip_keys_given_twice_in_a_file_are_refused(tmp_path):
    base = "data: /d\nout: /o\nmodel: tinyvsr\n"
    for text, both in [
        ("clip-frames: 3\nclip_frames: 3\n", "'clip-frames' and 'clip_frames'"),
        ("clip_frames: 3\ndataset:\n  clip-frames: 5\n", "'clip_frames' and 'dataset.clip-frames'"),
    ]:
        (tmp_path / "c.yaml").write_text(base + text)
        with pytest.raises(ValueError, match="both set clip_frames") as got:
            make_config({"config": str(tmp_path / "c.yaml")})
        assert both in str(got.value)
    (tmp_path / "c.json").write_text(
        json.dumps({"data": "/d", "out": "/o", "model": "tinyvsr", "clip_frames": 3, "clip_interval": 2})
    )
    cfg = make_config({"config": str(tmp_path / "c.json"), "clip_reverse": "0.25"})
    assert (cfg.dataset.clip.frames, cfg.dataset.clip.interval, cfg.dataset.clip.reverse) == (3, (2,), 0.25)
    for bad, message in [(1001, r"--clip-frames must be an integer in \[1, 1000\]"), (True, "--clip-frames must be an integer")]:
        with pytest.raises(ValueError, match=message):
            make_config({"data": "/d", "out": "/o", "model": "tinyvsr", "clip_frames": bad})
    with pytest.raises(ValueError, match="1 to 64 integers"):
        make_config({"data": "/d", "out": "/o", "model": "tinyvsr", "clip_frames": 3, "clip_interval": [1] * 65})


def test_clips_of_one_segment_each_take_windows_past_max_span(clip_src, tmp_path):
    """--max-span only bounds the windows of clips cut into segments; a clip kept whole holds any window."""
    whole = build_shards(clip_src, tmp_path / "ds", "--clips", "--scale", "2", "--segment", "16", "--max-span", "3")
    assert train(whole, tmp_path / "run", "--clip-frames", "5", "-k", "8", "--steps", "2") == 0


def test_val_data_on_clips_logs_per_clip_psnr_and_the_bicubic_line(clips, tmp_path):
    """--val-data with clips: the step-0 bicubic line and a val line per --val-every, means over the 2 clips."""
    out = tmp_path / "run"
    assert train(clips, out, "--clip-frames", "3", "--val-data", str(clips), "--val-every", "2", "--steps", "4") == 0
    lines = records(out)
    base = [r for r in lines if "bicubic_psnr_y" in r]
    val = [r for r in lines if "psnr_y" in r]
    assert len(base) == 1 and base[0]["step"] == 0 and base[0]["val_clips"] == 2 and 20 < base[0]["bicubic_psnr_y"] < 60
    assert [r["step"] for r in val] == [2, 4] and all(r["val_clips"] == 2 for r in val)
    assert all(math.isfinite(r["psnr_y"]) and 0 < r["ssim_y"] <= 1 for r in val)


class _BicubicClips(nn.Module):
    """A video model that is MATLAB bicubic per frame: ``[B, T, C, h, w]`` -> every frame's, or the centre's."""

    def __init__(self, center: bool) -> None:
        super().__init__()
        self.up, self.center = MatlabBicubic(2, 3), center

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.up(x.flatten(0, 1)).unflatten(0, x.shape[:2])
        return out[:, x.shape[1] // 2] if self.center else out


@pytest.mark.parametrize("window", ["recurrent", "center"])
def test_clip_validation_of_a_bicubic_video_model_is_the_bicubic_psnr_of_the_frames(clip_src, clips, window):
    """Scored from the source frames directly (per frame, per clip, then over clips): a window off by a
    frame (the scene pans 2 px a frame), a frame scored twice or a mean over frames would differ."""
    per_clip = []
    for clip in sorted(clip_src.iterdir()):
        scores = []
        for path in sorted(clip.iterdir()):
            hr = np.asarray(Image.open(path))
            lr = torch.from_numpy(np.ascontiguousarray(downscale(hr, 2).transpose(2, 0, 1)))[None]
            sr = quantise(MatlabBicubic(2, 3)(lr.float() / 255), torch.zeros((), dtype=torch.uint8))[0]
            chw = torch.from_numpy(np.ascontiguousarray(hr.transpose(2, 0, 1)))
            scores.append((psnr_y(sr, chw, 2), ssim_y(sr, chw, 2)))
        per_clip.append(np.mean(scores, axis=0))
    want = np.mean(per_clip, axis=0)
    cc = wdsr.ClipConfig(frames=3, window=window, val_frames=5)  # chunks of 5 frames, 3 their own at most
    assert val_clip_config(cc).val_frames == 32
    val = wdsr.SRDataset(str(clips), scale=2, split="val", clip=cc)
    cfg, ctx = SimpleNamespace(workers=0), SimpleNamespace(device=torch.device("cpu"))
    model = _BicubicClips(center=window == "center")
    for psnr, ssim, n in (validate_clips(model, val, cfg, ctx), bicubic_clips(val, cfg, ctx, 3)):
        assert n == 2 and abs(psnr / n - want[0]) < 1e-9 and abs(ssim / n - want[1]) < 1e-9


@pytest.mark.slow
def test_clip_validation_under_torchrun_scores_each_clip_once(clips, tmp_path):
    """2 ranks (gloo): each validates its own clip, the sums are gathered: the same bicubic line and clip
    count as one process (a clip scored on both ranks, or on none, would change them)."""
    flags = ["--clip-frames", "3", "--val-data", str(clips), "--val-every", "2", "--steps", "2"]
    assert train(clips, tmp_path / "one", *flags) == 0
    out = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1"]
    cmd += [f"--master-port={free_port()}", "-m", "wdsr", "train", "--data", str(clips), "--out", str(out), *SMALL, *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = ([r for r in records(d) if "bicubic_psnr_y" in r or "psnr_y" in r] for d in (tmp_path / "one", out))
    assert [r["val_clips"] for r in two] == [2, 2] and records(out)[-1]["weights_in_sync"]
    assert abs(one[0]["bicubic_psnr_y"] - two[0]["bicubic_psnr_y"]) < 1e-9
    assert abs(one[0]["bicubic_ssim_y"] - two[0]["bicubic_ssim_y"]) < 1e-9
