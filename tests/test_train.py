"""`wdsr train` on real photo shards: models learn from their bicubic start, DDP ranks agree, SIGTERM checkpoints, --resume
continues, bad input exits 2 before any worker starts."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from shardmaker.errors import OnError
from tests.helpers import ROOT, descendants, is_running, kill_tree, wait_until
from tests.s3server import free_port
from wdsr import SRDataset, make_loader, to_float
from wdsr.tools.cli import main
from wdsr.train.checkpoint import RunDir
from wdsr.train.config import make_config
from wdsr.train.loop import weights_digest
from wdsr.train.models import build_model

SMALL = ["--patch-size", "48", "-k", "4", "--batch-size", "4", "--workers", "1", "--shuffle-buffer", "16"]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("model", ["espcn", "edsr-baseline"])
def test_a_few_cpu_steps_train_every_layer_from_bicubic(photo_shards, tmp_path, model):
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            "--data",
            str(photo_shards),
            "--out",
            str(out),
            "--model",
            model,
            *SMALL,
            "--lr",
            "2e-4",
            "--steps",
            "40",
            "--log-every",
            "10",
            "--ckpt-every",
            "20",
            "--val-every",
            "0",
        ]
    )
    assert rc == 0
    losses = [r["loss"] for r in records(out) if "loss" in r]
    assert len(losses) == 4 and all(0 < loss < 1 for loss in losses), losses
    for r in records(out):
        if "loss" in r:
            assert 0 <= r["data_wait"] <= 1 and r["patches_per_s"] > 0 and r["lr"] > 0
    run = RunDir(str(out))
    assert run.latest()["step"] == 40 and run.checkpoints() == ["step-00000020.pt", "step-00000040.pt"]
    state = run.load_latest()  # weights_only load
    net = build_model(model, 4)
    net.load_state_dict(state["model"])
    assert weights_digest(net) == records(out)[-1]["weights_sha256"][0]
    # A fresh model is bicubic, so its loss is low from the first step (no yardstick for 40 tiny steps; the
    # quick start's test measures what training adds): every layer must have learnt (gradients reach the
    # zeroed last conv and, through it, all before it), and not away from bicubic's quality on held patches.
    torch.manual_seed(0)  # --seed 0: the run's initial weights
    fresh_net = build_model(model, 4)
    moved = {k: not torch.equal(v, state["model"][k]) for k, v in fresh_net.state_dict().items()}
    assert all(moved.values()), moved
    lr, hr = next(iter(make_loader(SRDataset(str(photo_shards), scale=4, patch_size=48, batch_size=32, seed=7), num_workers=0)))
    with torch.no_grad():
        trained, fresh = (float(nn.functional.l1_loss(m(to_float(lr)), to_float(hr))) for m in (net, fresh_net))
    assert trained < 1.02 * fresh, (trained, fresh)


def test_validation_and_tensorboard(photo_shards, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    rc = main(
        [
            "train",
            "--data",
            str(photo_shards),
            "--val-data",
            str(photo_shards),
            "--out",
            str(out),
            "--model",
            "espcn",
            *SMALL,
            "--steps",
            "4",
            "--log-every",
            "2",
            "--val-every",
            "4",
            "--val-tile",
            "24",
            "--tensorboard",
        ]
    )
    assert rc == 0
    val = [r for r in records(out) if "psnr_y" in r]
    assert len(val) == 1 and val[0]["val_images"] == 10 and 5 < val[0]["psnr_y"] < 40 and 0 < val[0]["ssim_y"] < 1
    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "data_wait", "patches_per_s", "psnr_y"} <= tags
    assert [e.step for e in acc.Scalars("loss")] == [2, 4]


def test_config_file_keys_are_flag_names_and_flags_win(tmp_path):
    (tmp_path / "c.yaml").write_text("data: /d\nout: /o\nmodel: espcn\npatch-size: 96\nk: 8\nsteps: 10\n")
    cfg = make_config({"config": str(tmp_path / "c.yaml"), "steps": 3})
    assert (cfg.model.value, cfg.dataset.patch_size, cfg.dataset.patches_per_image, cfg.steps) == ("espcn", 96, 8, 3)
    (tmp_path / "c.json").write_text(json.dumps({"data": "/d", "out": "/o", "batch_size": 4}))
    assert make_config({"config": str(tmp_path / "c.json")}).dataset.batch_size == 4


@pytest.mark.parametrize(
    "case, args, message",
    [
        ("no manifest", ["--data", "{tmp}/nothing"], "no manifest.json"),
        ("missing scale", ["--scale", "3"], "no x3 LR"),
        ("patch not a multiple", ["--patch-size", "50"], "--patch-size 50 must be a positive multiple of --scale 4"),
        ("unknown model", ["--model", "rcan"], "--model: 'rcan' is not one of edsr-baseline, espcn, tinyvsr, or spandrel:NAME"),
        ("unknown config key", ["--config", "{tmp}/bad.yaml"], "unknown setting 'learning_rate'"),
        ("steps and epochs", ["--steps", "3", "--epochs", "1"], "not both"),
        ("batch larger than a worker's patches", ["--batch-size", "64", "-k", "1", "--workers", "4"], "lower batch_size"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_work(photo_shards, tmp_path, capsys, case, args, message):
    (tmp_path / "bad.yaml").write_text("learning_rate: 0.1\n")
    argv = ["train", "--data", str(photo_shards), "--out", str(tmp_path / "run"), "--model", "espcn"]
    argv += [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()  # nothing written


def test_out_holding_another_run_is_refused_unless_resume(photo_shards, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["train", "--data", str(photo_shards), "--out", str(out), "--model", "espcn", *SMALL, "--val-every", "0"]
    assert main([*base, "--steps", "2"]) == 0
    before = (out / "latest.json").read_text()
    capsys.readouterr()
    assert main([*base, "--steps", "2"]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert (out / "latest.json").read_text() == before
    assert main([*base, "--steps", "2", "--resume", "--model", "edsr-baseline"]) == 2
    assert "trained with model='espcn'" in capsys.readouterr().err
    assert main([*base, "--steps", "2", "--check", "--resume"]) == 0
    assert "would resume at step 2" in capsys.readouterr().out


def test_resume_needs_only_out_and_logs_each_setting_given_again(photo_shards, tmp_path, capsys, caplog):
    """run.json holds the settings: `--out RUN --resume [--steps N]` is enough; a flag given again
    overrides its saved value with one line (name, saved, new), --steps with the schedule's re-stretch."""
    out = tmp_path / "run"
    first = ["--data", str(photo_shards), "--model", "espcn", *SMALL, "--workers", "0", "--lr", "1e-3", "--val-every", "0"]
    assert main(["train", "--out", str(out), *first, "--log-every", "1", "--steps", "2"]) == 0
    assert main(["train", "--out", str(out), "--resume", "--check"]) == 0
    assert "would resume at step 2" in capsys.readouterr().out
    caplog.set_level("WARNING", logger="wdsr")
    assert main(["train", "--out", str(out), "--resume", "--steps", "3"]) == 0
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("--resume:")]
    assert len(said) == 1 and said[0].startswith(f"--resume: --steps was 2 in {out}/run.json, now 3 (the cosine"), said
    saved = RunDir(str(out)).run_info()["config"]
    assert (saved["model"], saved["lr"], saved["patch_size"], saved["workers"], saved["steps"]) == ("espcn", 1e-3, 48, 0, 3)
    assert [r["step"] for r in records(out) if "loss" in r] == [1, 2, 3]
    caplog.clear()
    assert main(["train", "--out", str(out), "--resume", "--steps", "4", "--lr", "5e-4", "--log-every", "2"]) == 0
    said = sorted(r.getMessage().split(" in ")[0] for r in caplog.records if r.getMessage().startswith("--resume:"))
    assert said == ["--resume: --log-every was 1", "--resume: --lr was 0.001", "--resume: --steps was 3"], said
    assert [r["step"] for r in records(out) if "loss" in r] == [1, 2, 3, 4]
    capsys.readouterr()
    assert main(["train", "--out", str(tmp_path / "none"), "--resume"]) == 2  # no run.json: the flags are needed
    assert "--data is required" in capsys.readouterr().err


@pytest.mark.slow
def test_sigterm_checkpoints_and_resume_continues_from_its_step(photo_shards, tmp_path):
    out = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "wdsr",
        "train",
        "--data",
        str(photo_shards),
        "--out",
        str(out),
        "--model",
        "espcn",
        *SMALL,
        "--steps",
        "100000",
        "--log-every",
        "1",
        "--ckpt-every",
        "100000",
        "--val-every",
        "0",
    ]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    try:
        metrics = out / "metrics.jsonl"
        try:
            wait_until(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, "3 logged steps", alive=proc)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {proc.stdout.read()[-3000:] if proc.poll() is not None else ''}") from None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    logs = proc.stdout.read()
    proc.stdout.close()
    assert "SIGTERM" in logs
    run = RunDir(str(out))
    step = run.latest()["step"]
    assert step >= 3 and records(out)[-1]["event"] == "stopped" and records(out)[-1]["step"] == step
    state = run.load_latest()
    assert state["step"] == step
    adam_steps = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    assert adam_steps == {step}

    rc = main(
        [
            "train",
            "--data",
            str(photo_shards),
            "--out",
            str(out),
            "--model",
            "espcn",
            *SMALL,
            "--steps",
            str(step + 3),
            "--log-every",
            "1",
            "--val-every",
            "0",
            "--resume",
        ]
    )
    assert rc == 0
    after = [r["step"] for r in records(out) if "loss" in r and r["step"] > step]
    assert after == [step + 1, step + 2, step + 3]
    state = run.load_latest()
    assert state["step"] == step + 3
    assert {int(s["step"]) for s in state["optimizer"]["state"].values()} == {step + 3}


@pytest.mark.slow
def test_two_ranks_under_torchrun_end_with_identical_weights(photo_shards, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "wdsr",
        "train",
        "--data",
        str(photo_shards),
        "--val-data",
        str(photo_shards),
        "--out",
        str(out),
        "--model",
        "espcn",
        *SMALL,
        "--steps",
        "4",
        "--log-every",
        "2",
        "--val-every",
        "4",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = records(out)
    final = recs[-1]
    assert final["event"] == "finished" and len(final["weights_sha256"]) == 2 and final["weights_in_sync"]
    val = [r for r in recs if "psnr_y" in r]
    assert val[0]["val_images"] == 10  # each rank its part, gathered: every image once
    state = torch.load(io.BytesIO((out / json.loads((out / "latest.json").read_text())["path"]).read_bytes()), weights_only=True)
    assert state["world_size"] == 2
    net = build_model("espcn", 4)
    net.load_state_dict(state["model"])
    assert weights_digest(net) == final["weights_sha256"][0]


def test_a_second_sigterm_exits_at_once():
    """The first SIGTERM only asks for a stop after the step; a second one ends the process (143).

    ``signal.raise_signal`` delivers to this very thread and runs the Python handler before it
    returns, so "at once" means: not one more statement runs, whatever the machine's speed."""
    code = (
        "import signal\nfrom wdsr.train.loop import StopFlag\nf = StopFlag(); f.install()\n"
        "signal.raise_signal(signal.SIGTERM)\nassert f.requested\nprint('asked to stop', flush=True)\n"
        "signal.raise_signal(signal.SIGTERM)\nprint('ran on after the second SIGTERM', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["asked to stop", ""], proc.stdout  # ended inside the second handler


@pytest.mark.slow
def test_kill_9_mid_epoch_then_resume_ends_with_the_uninterrupted_weights(photo_shards, tmp_path):
    """2 ranks under torchrun, killed with SIGKILL (torchrun, ranks and workers) after a mid-epoch
    checkpoint; --resume continues at the exact batch, so the weights end as if nothing happened."""

    def cmd(out: Path, *extra: str, ranks: int = 2) -> list[str]:
        return [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            f"--nproc-per-node={ranks}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            "-m",
            "wdsr",
            "train",
            "--data",
            str(photo_shards),
            "--out",
            str(out),
            "--model",
            "espcn",
            "--patch-size",
            "48",
            "-k",
            "64",
            "--batch-size",
            "4",
            "--workers",
            "1",
            "--shuffle-buffer",
            "16",
            "--steps",
            "300",
            "--log-every",
            "50",
            "--val-every",
            "0",
            "--ckpt-every",
            "7",
            "--keep-ckpts",
            "200",
            *extra,
        ]

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    ref = subprocess.run(cmd(tmp_path / "ref"), capture_output=True, text=True, timeout=300, env=env)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = records(tmp_path / "ref")[-1]
    assert want["event"] == "finished" and want["weights_in_sync"]

    out = tmp_path / "run"
    proc = subprocess.Popen(cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        latest = out / "latest.json"
        wait_until(lambda: latest.exists() and json.loads(latest.read_text())["step"] >= 14, "checkpoint at step 14", alive=proc)
    finally:
        ranks = descendants(proc.pid)
        kill_tree(proc.pid)  # torchrun, both ranks and their DataLoader workers, at once
        proc.wait(timeout=60)
    assert len(ranks) >= 4  # 2 ranks + 2 workers, all gone
    wait_until(lambda: not any(is_running(p) for p in ranks), "end of the killed ranks")
    state = RunDir(str(out)).load_latest()
    assert state is not None and 14 <= state["step"] < 300
    # 80 batches per rank per epoch: a checkpoint every 7 steps is never at an epoch boundary here
    assert state["loader"]["batches"] == state["step"] % 80 > 0 and state["loader"]["epoch"] == state["step"] // 80

    elastic = tmp_path / "elastic"
    shutil.copytree(out, elastic)
    again = subprocess.run(cmd(out, "--resume"), capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "exact data position" in again.stderr
    got = records(out)[-1]
    assert got["event"] == "finished" and got["step"] == 300
    assert got["weights_sha256"] == want["weights_sha256"]

    # the same checkpoint resumed by 3 ranks: the rest of the epoch is re-planned over them (elastic)
    three = subprocess.run(cmd(elastic, "--resume", ranks=3), capture_output=True, text=True, timeout=300, env=env)
    assert three.returncode == 0, three.stderr[-3000:]
    assert "re-planned over it (elastic)" in three.stderr and "'dropped'" in three.stderr
    done = records(elastic)[-1]
    assert done["event"] == "finished" and done["step"] == 300 and done["weights_in_sync"] and len(done["weights_sha256"]) == 3


def test_every_dataset_option_is_a_train_setting_with_sizes_in_units(tmp_path):
    """TrainConfig nests the train set's DatasetConfig: flat keys or a ``dataset:`` mapping, sizes with units."""
    (tmp_path / "c.yaml").write_text(
        "data: /d\nout: /o\ndecoded_cache_limit: 2GB\ndataset:\n  shuffle_buffer: 8\n  on_error: skip\n"
    )
    cfg = make_config({"config": str(tmp_path / "c.yaml"), "cache_limit": 0.5})
    d = cfg.dataset
    assert (d.shuffle_buffer, d.on_error, d.decoded_cache_limit, d.cache_limit) == (8, OnError.SKIP, 2 * 10**9, 5 * 10**8)
    assert (
        cfg.dict["decoded_cache_limit"] == 2 * 10**9 and cfg.dict["on_error"] == "skip" and cfg.dict["model"] == "edsr-baseline"
    )
    with pytest.raises(ValueError, match="decoded.cache.limit: not a size"):
        make_config({"data": "/d", "out": "/o", "decoded_cache_limit": "lots"})
    with pytest.raises(ValueError, match="unknown setting 'shufle_buffer'"):
        make_config({"data": "/d", "out": "/o", "shufle_buffer": 8})


def test_workers_default_to_the_cores_this_process_has_at_most_8():
    assert make_config({"data": "/d", "out": "/o"}).workers == max(1, min(8, len(os.sched_getaffinity(0))))
