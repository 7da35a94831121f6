"""``python -m wdsr.integrations.basicsr``: BasicSR 1.4.2's own ``train_pipeline`` (SRModel, its EDSR,
L1Loss, PairedImageDataset validation, checkpoints) trained from wdsr shards on the CPU.

torchvision is a stub here: the registry's torchvision wheels need a CUDA torch, and this machine has
torch+cpu. basicsr imports torchvision at module level, but the SRModel/EDSR/L1/PairedImageDataset path
calls none of it; every stub function raises, so a call would fail the test rather than pass silently.
The stub has ``transforms._functional_tensor`` (torchvision >= 0.17), not ``functional_tensor``: the
integration's alias is what makes ``import basicsr`` work."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers import ROOT, photos, save, write_torchvision_stub
from tests.s3server import free_port

needs_basicsr = pytest.mark.skipif(
    importlib.util.find_spec("basicsr") is None, reason="basicsr: the Makefile installs it (--no-deps)"
)

def options(shards: Path, val: Path, total_iter: int) -> dict:
    """A tiny EDSR x4 run: 10 images x 4 patches / batch 5 = 8 iterations per epoch, so the checkpoint
    at iteration 10 is in the middle of the second epoch."""
    return {
        "name": "edsr_tiny",
        "model_type": "SRModel",
        "scale": 4,
        "num_gpu": 0,
        "manual_seed": 0,
        "datasets": {
            "train": {
                "name": "wdsr",
                "type": "WdsrDataset",
                "dataroot": str(shards),
                "gt_size": 32,
                "use_hflip": True,
                "use_rot": True,
                "batch_size_per_gpu": 5,
                "num_worker_per_gpu": 0,
                "patches_per_image": 4,
                "shuffle_buffer": 16,
            },
            "val": {
                "name": "tiny",
                "type": "PairedImageDataset",
                "dataroot_gt": str(val / "hr"),
                "dataroot_lq": str(val / "lr"),
                "io_backend": {"type": "disk"},
            },
        },
        "network_g": {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1, "upscale": 4},
        "path": {"pretrain_network_g": None, "strict_load_g": True, "resume_state": None},
        "train": {
            "optim_g": {"type": "Adam", "lr": 1e-3, "weight_decay": 0, "betas": [0.9, 0.99]},
            "scheduler": {"type": "MultiStepLR", "milestones": [15], "gamma": 0.5},
            "total_iter": total_iter,
            "warmup_iter": -1,
            "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0, "reduction": "mean"},
        },
        "val": {"val_freq": 20, "save_img": False, "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 4}}},
        "logger": {"print_freq": 5, "save_checkpoint_freq": 10, "use_tb_logger": False, "wandb": {"project": None}},
    }


def run(cwd: Path, opt: dict, *flags: str, nproc: int = 0) -> None:
    """``python -m wdsr.integrations.basicsr -opt train.yml FLAGS`` in ``cwd``; under torchrun with ``nproc``."""
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "train.yml").write_text(yaml.safe_dump(opt))
    env = {**os.environ, "PYTHONPATH": f"{cwd.parent / 'stub'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable]
    if nproc:
        port = free_port()
        launch += ["-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--master-addr=127.0.0.1", f"--master-port={port}"]
    cmd = [*launch, "-m", "wdsr.integrations.basicsr", "-opt", "train.yml", *flags]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)  # reaped: run() waits
    assert proc.returncode == 0, proc.stderr[-3000:]


def weights(cwd: Path, it: int) -> dict[str, torch.Tensor]:
    return torch.load(cwd / "experiments/edsr_tiny/models" / f"net_g_{it}.pth", weights_only=True)["params"]


@pytest.fixture()
def setup(tmp_path: Path) -> Path:
    write_torchvision_stub(tmp_path / "stub")  # torchvision, as far as `import basicsr` reaches
    for i, img in enumerate(photos()[:2]):  # BasicSR's validation: HR 64 px, LR 16 px, same names
        hr = img[100:164, 100:164].copy()
        save(tmp_path / "val/hr" / f"v{i}.png", hr)
        save(tmp_path / "val/lr" / f"v{i}.png", hr[::4, ::4].copy())
    return tmp_path


@pytest.mark.slow
@needs_basicsr
def test_basicsr_resume_continues_at_the_same_batch(setup: Path, photo_shards: Path) -> None:
    """20 iterations straight, and 10 + ``--auto_resume`` + 10, end with the same ``net_g`` weights;
    BasicSR's validation runs on the PairedImageDataset folder."""
    run(setup / "straight", options(photo_shards, setup / "val", 20))
    run(setup / "resumed", options(photo_shards, setup / "val", 10))
    states = setup / "resumed/experiments/edsr_tiny/training_states"
    assert sorted(p.name for p in states.iterdir()) == ["10.state", "10.wdsr.json"]
    saved = json.loads((states / "10.wdsr.json").read_text())
    assert (saved["epoch"], saved["batches"]) == (1, 2)  # 8 + 2: BasicSR's extra iter() calls started no pass
    run(setup / "resumed", options(photo_shards, setup / "val", 20), "--auto_resume")

    straight, resumed = weights(setup / "straight", 20), weights(setup / "resumed", 20)
    assert any(not torch.equal(straight[k], weights(setup / "straight", 10)[k]) for k in straight)  # it trained
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    logs = "".join(p.read_text() for p in (setup / "straight/experiments/edsr_tiny").glob("train_*.log"))
    assert "Validation tiny" in logs and "# psnr:" in logs
    losses = [float(v) for v in re.findall(r"l_pix: ([-+.e\d]+)", logs)]
    assert len(losses) == 4 and max(losses) < 1  # lq and gt reached the model in [0, 1], not 0..255


@pytest.mark.slow
@needs_basicsr
def test_basicsr_ddp_on_cpu(setup: Path, photo_shards: Path) -> None:
    """``--launcher pytorch`` on 2 CPU processes (gloo, where BasicSR hard-codes nccl); rank 0 saves
    the loader state, whose world is 2 ranks of 5 images x 4 patches, 4 batches each."""
    opt = options(photo_shards, setup / "val", 4)
    del opt["val"], opt["datasets"]["val"]
    opt["logger"]["save_checkpoint_freq"] = 2
    run(setup / "ddp", opt, "--launcher", "pytorch", nproc=2)
    saved = json.loads((setup / "ddp/experiments/edsr_tiny/training_states/2.wdsr.json").read_text())
    assert (saved["world_size"], saved["epoch"], saved["batches"]) == (2, 0, 2)
    assert (setup / "ddp/experiments/edsr_tiny/models/net_g_4.pth").is_file()


def test_basicsr_option_names() -> None:
    """BasicSR's names map to wdsr's; our own options pass through by name; what would change
    BasicSR's meaning is refused."""
    from wdsr.integrations.basicsr import dataset_options

    opt = {"name": "t", "type": "WdsrDataset", "phase": "train", "scale": 4, "dataroot": "s3://b/ds", "gt_size": 192}
    opt |= {
        "use_hflip": False,
        "use_rot": False,
        "batch_size_per_gpu": 16,
        "num_worker_per_gpu": 6,
        "decoded_cache": "/dev/shm/w",
    }
    url, ds, loader = dataset_options(opt)
    assert url == "s3://b/ds" and loader == {"num_workers": 6}
    assert ds == {"scale": 4, "patch_size": 192, "batch_size": 16, "augment": False, "decoded_cache": "/dev/shm/w"}
    for bad in ({"use_rot": True}, {"prefetch_mode": "cuda"}, {"dataset_enlarge_ratio": 10}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            dataset_options(opt | bad)


def test_basicsr_degrade_option() -> None:
    """``degrade: realesrgan`` or a mapping of the config's fields (Real-ESRGAN's YAML names, lists as
    YAML gives them) at the run's scale and gt_size; unknown types and fields are one clear error."""
    import wdsr
    from wdsr.integrations.basicsr import dataset_options

    opt = {"type": "WdsrDataset", "scale": 4, "dataroot": "/d", "gt_size": 256}
    assert dataset_options(opt | {"degrade": "realesrgan"})[1]["degrade"] == wdsr.RealESRGANConfig()
    mapped = {
        "type": "realesrgan",
        "kernel_list": ["iso", "aniso"],
        "kernel_prob": [0.5, 0.5],
        "kernel_list2": ["iso"],
        "kernel_prob2": [1.0],
        "noise_range": [1, 20],
        "gt_usm": False,
    }
    got = dataset_options(opt | {"degrade": mapped})[1]["degrade"]
    assert got.kernel_list == ("iso", "aniso") and got.noise_range == (1, 20) and not got.gt_usm and got.gt_size == 256
    arb = dataset_options(opt | {"scale": 1, "degrade": {"type": "arbitrary", "scale_range": [1, 4]}})[1]["degrade"]
    assert arb == wdsr.ArbitraryScaleConfig(scale_range=(1, 4), gt_size=256)
    batch = dataset_options(opt | {"degrade": {"type": "realesrgan", "granularity": "batch"}})[1]["degrade"]
    assert wdsr.Degrader(batch).granularity == "batch"  # Real-ESRGAN's per-batch draws
    yml = {"type": "realesrgan", "blur_kernel_size": 21, "blur_kernel_size2": 21, "final_sinc_prob": 0.8}  # the yml's names
    assert dataset_options(opt | {"degrade": yml})[1]["degrade"] == wdsr.RealESRGANConfig(gt_size=256)
    with pytest.raises(ValueError, match="give the top-level `scale: 1` \\(got 4\\)"):
        dataset_options(opt | {"degrade": "arbitrary"})
    for bad, message in (
        ("realesrnet", "degrade: 'realesrnet' is not one of realesrgan, bsrgan, arbitrary"),
        ({"type": "realesrgan", "blur_kernel_size2": 15}, "blur_kernel_size2 15 differs"),
        ({"type": "realesrgan", "queue_size": 180}, "queue_size: wdsr keeps no training-pair pool"),
        ({"type": "bsrgan", "noise": 3}, "unknown field 'noise'"),
        ({"type": "realesrgan", "jpeg_range": [95, 30]}, "jpeg_range must be"),
    ):
        with pytest.raises(ValueError, match=message):
            dataset_options(opt | {"degrade": bad})


@pytest.mark.slow
@needs_basicsr
def test_basicsr_real_esrnet_style_run_from_hr_only_shards(setup: Path, tmp_path: Path) -> None:
    """A Real-ESRNet-style run (``degrade: realesrgan``) on HR-only shards: BasicSR's SRModel gets float
    ``lq``/``gt`` made on its device; 3 + ``--auto_resume`` + 3 iterations end with the straight 6's weights."""
    from tests.helpers import build_shards

    src = tmp_path / "hr-src"
    for i, img in enumerate(photos()):
        save(src / f"p{i}.png", img[:256, :320].copy())
    shards = build_shards(src, tmp_path / "hr", "--hr-only")

    def opt(total: int) -> dict:
        o = options(shards, setup / "val", total)
        del o["val"], o["datasets"]["val"]
        o["datasets"]["train"] |= {"gt_size": 96, "degrade": {"type": "realesrgan", "gt_usm": True}}
        o["logger"]["save_checkpoint_freq"] = 3
        return o

    run(setup / "straight", opt(6))
    run(setup / "resumed", opt(3))
    run(setup / "resumed", opt(6), "--auto_resume")
    straight, resumed = weights(setup / "straight", 6), weights(setup / "resumed", 6)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    logs = "".join(p.read_text() for p in (setup / "straight/experiments/edsr_tiny").glob("train_*.log"))
    losses = [float(v) for v in re.findall(r"l_pix: ([-+.e\d]+)", logs)]
    assert losses and max(losses) < 1


@pytest.mark.parametrize("seed", [".inf", "[1, 2]", "abc", "true", "4.0", "-1", "1" + "0" * 400, "{a: 1}"])
def test_a_bad_manual_seed_is_one_line_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: str) -> None:
    from wdsr.integrations.basicsr import main

    (tmp_path / "train.yml").write_text(f"name: t\nmanual_seed: {seed}\n")
    assert main(["-opt", str(tmp_path / "train.yml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manual_seed must be an integer in [0, 2147483647]" in err and "train.yml" in err, err


def test_a_python_tag_in_the_yaml_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """BasicSR loads ``-opt`` with ``yaml.Loader``, which runs ``!!python/object/apply``; our ``safe_load`` of
    the same file comes first and refuses the tag: exit 2 before anything in the file runs."""
    from wdsr.integrations.basicsr import main

    mark = tmp_path / "ran"
    tag = f"!!python/object/apply:os.mkdir [{str(mark)!r}]"
    for key in ("manual_seed", "name"):
        (tmp_path / "train.yml").write_text(f"{key}: {tag}\n")
        assert main(["-opt", str(tmp_path / "train.yml")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "python/object/apply:os.mkdir" in err and "line 1" in err, err
        assert not mark.exists()
    (tmp_path / "bad.yml").write_bytes(b"name: [\n")
    assert main(["-opt", str(tmp_path / "bad.yml")]) == 2 and "not a BasicSR YAML" in capsys.readouterr().err
    assert main(["-opt", str(tmp_path / "missing.yml")]) == 2 and "No such file" in capsys.readouterr().err
