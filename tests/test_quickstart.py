"""The README's quick start, run as written (its ``wdsr`` lines parsed from README.md; ``make demo``'s
shards made by ``shardmaker.demo``, the half of it they need): the model it trains must beat MATLAB
bicubic on Set5 x4 (PSNR-Y, ``scale`` border pixels cropped) by at least 0.1 dB, and its output of the
photo must keep bicubic's mean colour within 3 levels. Also: a fresh built-in model is bicubic, its
sub-pixel convs start without checkerboard (ICNR), and checkpoints from before the variant field keep
their plain network in ``wdsr upscale`` and ``--resume``."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from shardmaker import demo
from shardmaker.imaging import ResizeMethod, upscale
from tests.helpers import REFDATA, ROOT, needs_refdata
from wdsr.metrics import psnr_y
from wdsr.tools.cli import main
from wdsr.tools.upscale import load_model, read_image, upscale_image
from wdsr.train.checkpoint import FORMAT, RunError
from wdsr.train.models import build_model


def quickstart_commands() -> list[list[str]]:
    """The ``wdsr`` commands of README.md's quick-start block, in order (``make demo`` left out)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quick start\n.*?```sh\n(.*?)```", text, re.S)
    assert block, "README.md has no ```sh block under '## Quick start'"
    commands = []
    for line in block.group(1).splitlines():
        for part in line.split("&&"):
            argv = shlex.split(part)
            if argv and Path(argv[0]).name == "wdsr":
                commands.append(argv[1:])
    assert [c[0] for c in commands] == ["train", "upscale", "plot"], commands
    return commands


def _set5_x4(model_path: Path) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Mean PSNR-Y of the model and of MATLAB bicubic over Set5 x4 (the LR shipped with Set5), and the
    mean colour of each one's outputs."""
    assert REFDATA is not None
    m = load_model(str(model_path))
    ours, bicubic, colours = [], [], []
    for hr_path in sorted((REFDATA / "set5" / "HR").glob("*.png")):
        lr = read_image(REFDATA / "set5" / "LR_bicubic" / "X4" / f"{hr_path.stem}x4.png")
        hr = read_image(hr_path)[: 4 * lr.shape[0], : 4 * lr.shape[1]]
        sr, bic = upscale_image(m, lr, tile=None), upscale(lr, 4, ResizeMethod.MATLAB)
        ours.append(psnr_y(sr, hr, crop_border=4))
        bicubic.append(psnr_y(bic, hr, crop_border=4))
        colours.append([sr.reshape(-1, 3).mean(0), bic.reshape(-1, 3).mean(0)])
    c = np.array(colours)
    return float(np.mean(ours)), float(np.mean(bicubic)), c[:, 0], c[:, 1]


@pytest.mark.slow
@needs_refdata
def test_the_readme_quick_start_beats_bicubic_on_set5(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert demo.main(["--out", "demo-out"]) == 0  # make demo's shards (demo-out/shards, demo-out/val)
    for argv in quickstart_commands():
        assert main(argv) == 0, argv
    run = tmp_path / "demo-out" / "run"
    ours, bicubic, colour, bicubic_colour = _set5_x4(run)
    assert ours >= bicubic + 0.1, (ours, bicubic)
    assert np.abs(colour - bicubic_colour).max() <= 3, (colour, bicubic_colour)
    photo = read_image(tmp_path / "demo-out" / "photos" / "val" / "chelsea.png")
    sr = read_image(tmp_path / "demo-out" / "sr" / "chelsea.png")  # what `wdsr upscale` wrote
    bic = upscale(photo, 4, ResizeMethod.MATLAB)
    assert sr.shape == bic.shape
    diff = np.abs(sr.reshape(-1, 3).mean(0) - bic.reshape(-1, 3).mean(0))
    assert diff.max() <= 3, diff
    assert (tmp_path / "demo-out" / "curves.png").is_file()
    # it validates on the held-out photos: bicubic's line at step 0, then the model's, which ends above it
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (bicubic_line,) = [r for r in lines if "bicubic_psnr_y" in r]
    val = [r for r in lines if "psnr_y" in r]
    assert bicubic_line["step"] == 0 and bicubic_line["val_images"] == len(demo.VAL)
    assert [v["step"] for v in val] == [50, 100, 150, 200], val
    assert val[-1]["psnr_y"] > bicubic_line["bicubic_psnr_y"], (val, bicubic_line)


@needs_refdata
@pytest.mark.parametrize(("name", "scale"), [("espcn", 4), ("edsr-baseline", 3), ("espcn", 2)])
def test_a_fresh_built_in_model_is_matlab_bicubic(name, scale):
    """Before any training step the output is MATLAB's bicubic (at most one level of rounding off), borders
    included: no checkerboard, no dark frame."""
    assert REFDATA is not None
    lr = read_image(REFDATA / "set5" / "LR_bicubic" / f"X{scale}" / f"birdx{scale}.png")[:40, :44]
    with torch.no_grad():
        x = torch.from_numpy(np.ascontiguousarray(lr)).permute(2, 0, 1)[None].float() / 255
        y = build_model(name, scale)(x)[0].clamp(0, 1).mul(255).round().byte().permute(1, 2, 0).numpy()
    ref = upscale(lr, scale, ResizeMethod.MATLAB)
    assert y.shape == ref.shape
    assert np.abs(y.astype(int) - ref).max() <= 1


def _checkpoint_file(path: Path, model: torch.nn.Module, config: dict) -> Path:
    torch.save({"format": FORMAT, "step": 0, "model": model.state_dict(), "config": config}, path)
    return path


def test_a_checkpoint_without_the_variant_is_the_plain_model_in_wdsr_upscale(tmp_path):
    """Checkpoints written before the bicubic skip (no ``residual`` in their config) keep giving what they gave."""
    torch.manual_seed(0)
    old = build_model("espcn", 4, residual="none").eval()
    x = torch.rand(1, 3, 12, 10)
    loaded = load_model(str(_checkpoint_file(tmp_path / "old.pt", old, {"model": "espcn", "scale": 4})))
    with torch.no_grad():
        assert torch.equal(loaded.model(x), old(x))
        new = _checkpoint_file(tmp_path / "new.pt", old, {"model": "espcn", "scale": 4, "residual": "bicubic"})
        assert load_model(str(new)).model.skip is not None and loaded.model.skip is None
    bad = _checkpoint_file(tmp_path / "bad.pt", old, {"model": "espcn", "scale": 4, "residual": "nearest"})
    with pytest.raises(RunError, match=r"bad.pt: unknown model variant residual='nearest' \(known: none, bicubic\)"):
        load_model(str(bad))


def test_resuming_a_run_from_before_the_variant_keeps_its_plain_model(photo_shards, tmp_path):
    base = ["train", "--data", str(photo_shards), "--out", str(tmp_path / "run"), "--model", "espcn", "--patch-size", "48"]
    base += ["-k", "4", "--batch-size", "4", "--workers", "0", "--shuffle-buffer", "16", "--val-every", "0"]
    assert main([*base, "--steps", "1"]) == 0
    ckpt = tmp_path / "run" / "checkpoints" / "step-00000001.pt"
    state = torch.load(ckpt, weights_only=True)
    assert state["config"]["residual"] == "bicubic"  # what a new run records
    del state["config"]["residual"]  # as runs before the field wrote them
    torch.save(state, ckpt)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    del info["config"]["residual"]
    (tmp_path / "run" / "run.json").write_text(json.dumps(info))
    assert main([*base, "--steps", "2", "--resume"]) == 0
    assert torch.load(tmp_path / "run" / "checkpoints" / "step-00000002.pt", weights_only=True)["config"]["residual"] == "none"
    assert load_model(str(tmp_path / "run")).model.skip is None


def test_icnr_sub_pixel_convs_start_without_checkerboard():
    """Each stage of EDSR's upsampler (two x2 stages for x4, one x3) starts as a conv followed by nearest
    upsampling: its output is constant over the r x r block of one input pixel, whatever the features."""
    torch.manual_seed(0)
    for scale in (4, 3):
        up = build_model("edsr-baseline", scale).tail[0]
        x = torch.randn(2, 64, 6, 5)
        with torch.no_grad():
            for conv, shuffle in zip(up[::2], up[1::2], strict=True):
                r = shuffle.upscale_factor
                x = shuffle(conv(x))
                assert x.abs().max() > 0
                assert torch.equal(x, x[..., ::r, ::r].repeat_interleave(r, -2).repeat_interleave(r, -1)), (scale, r)
