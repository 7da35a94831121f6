"""``wdsr train --degrade`` and ``wdsr preview --degrade`` (issue 28) on HR-only shards of real photos:
the LR is made on the device from each batch; a resumed run ends with the straight run's weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import wdsr
from tests.helpers import build_shards, photos, save
from wdsr.tools.cli import main
from wdsr.train.config import make_config

SMALL = ["--patch-size", "96", "-k", "4", "--batch-size", "4", "--workers", "1", "--shuffle-buffer", "8", "--schedule", "step"]


@pytest.fixture(scope="module")
def hr_only(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("degrade-train")
    src = root / "src"
    src.mkdir()
    for i, p in enumerate(photos()):
        save(src / f"p{i}.png", np.ascontiguousarray(p[:256, :320]))
    return build_shards(src, root / "hr", "--hr-only", "--max-samples", "2")


def _train(data: Path, out: Path, *extra: str) -> int:
    argv = ["train", "--data", str(data), "--out", str(out), "--model", "espcn", "--degrade", "realesrgan", *SMALL]
    return main([*argv, "--val-every", "0", "--log-every", "1", "--ckpt-every", "3", *extra])


def _last_weights(out: Path) -> str:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if "weights_sha256" in r][-1]["weights_sha256"][0]


def test_train_from_hr_alone_and_resume_to_the_same_weights(hr_only, tmp_path):
    assert _train(hr_only, tmp_path / "straight", "--steps", "6") == 0
    run = json.loads((tmp_path / "straight" / "run.json").read_text())
    assert run["config"]["degrade"] == "realesrgan"
    losses = [json.loads(x)["loss"] for x in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert _train(hr_only, tmp_path / "resumed", "--steps", "3") == 0
    assert _train(hr_only, tmp_path / "resumed", "--steps", "6", "--resume") == 0
    assert _last_weights(tmp_path / "resumed") == _last_weights(tmp_path / "straight")
    assert _train(hr_only, tmp_path / "other", "--steps", "6", "--seed", "1") == 0
    assert _last_weights(tmp_path / "other") != _last_weights(tmp_path / "straight")


def test_a_resume_keeps_the_runs_thread_count(hr_only, tmp_path):
    """Float sums split over another number of intra-op threads round differently (a resumed run's
    weights then differ from the straight run's, its losses equal to 7 digits): a run pins its thread
    count and a resume takes the checkpoint's, whatever this process's count became in between (a
    library or torchrun's OMP_NUM_THREADS=1, another node's cores; a busy machine's suite run saw it)."""
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the run's count (the suite's processes have one: OMP_NUM_THREADS=1)
        assert _train(hr_only, tmp_path / "straight", "--steps", "6") == 0
        assert _train(hr_only, tmp_path / "resumed", "--steps", "3") == 0
        torch.set_num_threads(1)  # the process the run resumes in has another count
        assert _train(hr_only, tmp_path / "resumed", "--steps", "6", "--resume") == 0
        assert torch.get_num_threads() == 1  # the run's count was the run's: the caller's is back
    finally:
        torch.set_num_threads(threads)
    assert _last_weights(tmp_path / "resumed") == _last_weights(tmp_path / "straight")


def test_degrade_settings(tmp_path):
    cfg = make_config({"data": "/d", "out": "/o", "degrade": "bsrgan", "scale": 2, "patch_size": 96})
    assert cfg.dataset.degrade == wdsr.BSRGANConfig(scale=2, gt_size=96) and cfg.dict["degrade"] == "bsrgan"
    assert make_config({"data": "/d", "out": "/o"}).dict["degrade"] is None
    # without --patch-size: the model's own patch (Real-ESRNet's yml: 256), a multiple of the scale; else the default
    assert make_config({"data": "/d", "out": "/o", "degrade": "realesrgan"}).dataset.patch_size == 256
    assert make_config({"data": "/d", "out": "/o", "degrade": "realesrgan", "scale": 3}).dataset.patch_size == 255
    assert make_config({"data": "/d", "out": "/o"}).dataset.patch_size == wdsr.DatasetConfig().patch_size
    with pytest.raises(ValueError, match="--degrade: 'realesrnet' is not one of realesrgan, bsrgan"):
        make_config({"data": "/d", "out": "/o", "degrade": "realesrnet"})
    with pytest.raises(ValueError, match="patch_size 48 is too small"):
        make_config({"data": "/d", "out": "/o", "degrade": "realesrgan", "patch_size": 48})


def test_preview_shows_degraded_pairs(hr_only, tmp_path, capsys):
    png = tmp_path / "p.png"
    assert main(["preview", str(hr_only), "-o", str(png), "--patch-size", "96", "-n", "3", "--degrade", "realesrgan"]) == 0
    assert "3 realesrgan-degraded LR|HR pairs" in capsys.readouterr().out
    sheet = np.asarray(Image.open(png))
    assert sheet.shape[1] == 96 + 4 + 96 and sheet.shape[0] > 3 * 96
    assert main(["preview", str(hr_only), "-o", str(png), "--patch-size", "96", "-n", "2", "--lr", "bicubic"]) == 0
    # without --patch-size: the patch training cuts with --degrade realesrgan (its yml's gt_size 256), not 128
    assert main(["preview", str(hr_only), "-o", str(png), "-n", "1", "--degrade", "realesrgan"]) == 0
    assert np.asarray(Image.open(png)).shape[1] == 256 + 4 + 256
    assert main(["preview", str(hr_only), "-o", str(png), "--patch-size", "48", "--degrade", "bsrgan"]) == 2
    assert "patch_size 48 is too small for 25-tap kernels at 1/8: at least 104" in capsys.readouterr().err


def test_preview_shows_arbitrary_scale_pairs_nearest_upscaled_to_their_hr(hr_only, tmp_path, capsys):
    png = tmp_path / "a.png"
    argv = ["preview", str(hr_only), "-o", str(png), "--patch-size", "96", "-n", "2", "--scale", "1", "--degrade", "arbitrary"]
    assert main(argv) == 0
    assert "2 arbitrary-degraded LR|HR pairs" in capsys.readouterr().out
    sheet = np.asarray(Image.open(png))
    assert sheet.shape[1] == 96 + 4 + 96 and sheet.shape[0] > 2 * 96
