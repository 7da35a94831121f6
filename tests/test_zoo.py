"""spandrel models in wdsr (``wdsr.train.zoo``): ``--model spandrel:NAME`` trained from scratch with exact resume,
``--init FILE`` fine-tuning at the file's scale, ``wdsr export`` read back by spandrel, ``wdsr upscale FILE``.

No weights are downloaded: random-initialised models of four architectures (SPAN, Compact, RRDBNet, a small
SwinIR), tiny so every run costs a fraction of a second, saved as .pth and .safetensors. torchvision is a stub
here (``tests.helpers.import_with_torchvision_stub``): spandrel imports it at module level (LaMa, RestoreFormer)
and the registry's torchvision wheels need a CUDA torch; the stub lives only during spandrel's import."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers import ROOT, import_with_torchvision_stub, photos, write_torchvision_stub
from tests.s3server import free_port
from wdsr.tools.cli import main
from wdsr.tools.export import state_bytes
from wdsr.tools.upscale import load_model, upscale_image
from wdsr.train.checkpoint import RunDir
from wdsr.train.config import make_config
from wdsr.train.padding import bare
from wdsr.train.zoo import ZooModel, parse_args
from wdsr.train.zooload import build, for_run
from wdsr.train.zooload import load_file as load_model_file

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("spandrel") is None, reason="spandrel: the Makefile installs it (--no-deps)"),
    pytest.mark.filterwarnings("ignore:torch.meshgrid:UserWarning"),  # SwinIR's own call
    pytest.mark.filterwarnings("ignore:Initializing zero-element tensors:UserWarning"),  # a tiny CRAFT's empty layer
]

# each architecture as small as it builds: (name, --model-args)
ARCHS = {
    "SPAN": "feature_channels=8",
    "Compact": "num_feat=8,num_conv=2",
    "ESRGAN": "num_blocks=1,num_filters=8",
    "SwinIR": "img_size=16,window_size=8,embed_dim=12,depths=[1],num_heads=[2],mlp_ratio=1,upsampler=pixelshuffledirect",
}
TINY = ["--scale", "4", "--patch-size", "32", "-k", "2", "--batch-size", "2", "--workers", "0", "--shuffle-buffer", "4"]
QUIET = ["--val-every", "0", "--log-every", "1", "--lr", "1e-3"]


@pytest.fixture(scope="module", autouse=True)
def _spandrel(tmp_path_factory) -> None:
    import_with_torchvision_stub("spandrel", tmp_path_factory.mktemp("torchvision_stub"))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Each architecture x4, random-initialised (seed 0), as NAME.pth and NAME.safetensors."""
    root = tmp_path_factory.mktemp("zoo_files")
    out = {}
    for name, args in ARCHS.items():
        torch.manual_seed(0)
        net, _, _ = for_run(ZooModel(name), parse_args(args), None, 4, 3, None, "test")
        state = {k: v.contiguous().clone() for k, v in net.state_dict().items()}
        for suffix in (".pth", ".safetensors"):
            (root / f"{name}{suffix}").write_bytes(state_bytes(state, suffix))
        out[name] = root / f"{name}.pth"
    return out


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return RunDir(str(out)).load_latest()["model"]


@pytest.mark.parametrize("name", list(ARCHS))
def test_each_architecture_trains_from_scratch_and_resume_equals_straight(photo_shards, tmp_path, name):
    """4 steps straight, checkpointed at 2 and 4; then the run as a crash after step 2 leaves it (latest.json
    names step 2) resumed to 4: the same weights."""
    out = tmp_path / "run"
    argv = ["train", "--data", str(photo_shards), "--out", str(out), "--model", f"spandrel:{name}", "--model-args", ARCHS[name]]
    assert main([*argv, *TINY, *QUIET, "--steps", "4", "--ckpt-every", "2", "--keep-ckpts", "0"]) == 0
    straight = final_weights(out)
    (out / "latest.json").write_text(json.dumps({"step": 2, "path": "checkpoints/step-00000002.pt"}))
    (out / "checkpoints/step-00000004.pt").unlink()
    assert main(["train", "--out", str(out), "--resume"]) == 0
    resumed = final_weights(out)
    torch.manual_seed(0)
    fresh = for_run(ZooModel(name), parse_args(ARCHS[name]), None, 4, 3, None, "test")[0]  # --seed 0's initial weights
    assert straight.keys() == resumed.keys() == fresh.state_dict().keys()  # spandrel's own names, nothing added
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert any(not torch.equal(straight[k], v) for k, v in fresh.state_dict().items())  # it trained
    state = RunDir(str(out)).load_latest()
    assert state["config"]["model"] == f"spandrel:{name}" and state["config"]["spandrel"]["arch"] == name


def test_fine_tune_a_file_at_its_scale_and_resume_without_it(photo_shards, tmp_path, files, capsys):
    """--init takes architecture and scale from the file and starts from its weights; validation runs the
    windowed SwinIR padded on whole images; a resume rebuilds from the checkpoint (the file is gone)."""
    init = tmp_path / "4x-shared.safetensors"
    init.write_bytes(files["SwinIR"].with_suffix(".safetensors").read_bytes())
    out = tmp_path / "ft"
    tiny = TINY[2:]  # no --scale: the file says x4
    argv = ["train", "--data", str(photo_shards), "--out", str(out), "--init", str(init), *tiny, "--log-every", "1"]
    assert main([*argv, "--steps", "1", "--lr", "1e-9", "--val-data", str(photo_shards), "--val-every", "1"]) == 0
    saved = RunDir(str(out)).run_info()["config"]
    assert (saved["model"], saved["scale"], saved["init"]) == ("spandrel:SwinIR", 4, str(init))
    start = torch.load(io.BytesIO(files["SwinIR"].read_bytes()), weights_only=True)
    after = final_weights(out)
    assert all(torch.allclose(start[k], after[k], atol=1e-6) for k in start)  # lr 1e-9: still the file's weights
    assert any("psnr_y" in line for line in (out / "metrics.jsonl").read_text().splitlines())
    init.unlink()
    assert main(["train", "--out", str(out), "--resume", "--steps", "2"]) == 0
    assert RunDir(str(out)).latest()["step"] == 2
    capsys.readouterr()
    other = files["SPAN"].with_suffix(".safetensors")
    assert main(["train", "--data", str(photo_shards), "--out", str(tmp_path / "x"), "--init", str(other), "--scale", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "a x4 model; --scale 2 disagrees" in err, err


@pytest.mark.slow
def test_two_ranks_under_torchrun_train_span_in_step(photo_shards, tmp_path):
    """DDP: SPAN's eval_conv weights get no gradient in training (find_unused_parameters), each rank validates
    its part; the ranks end with identical weights."""
    out = tmp_path / "run"
    stub = write_torchvision_stub(tmp_path / "stub") if importlib.util.find_spec("torchvision") is None else None
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1"]
    cmd += [f"--master-port={free_port()}", "-m", "wdsr", "train", "--data", str(photo_shards), "--out", str(out)]
    cmd += ["--model", "spandrel:SPAN", "--model-args", ARCHS["SPAN"], *TINY, "--steps", "4", "--val-data", str(photo_shards)]
    cmd += ["--val-every", "4", "--log-every", "2"]
    path = os.pathsep.join([str(stub)] * (stub is not None) + [str(ROOT)])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    assert final["event"] == "finished" and len(final["weights_sha256"]) == 2 and final["weights_in_sync"]


def test_export_is_what_spandrel_loads_back_with_identical_outputs(photo_shards, tmp_path, capsys):
    import spandrel

    out = tmp_path / "run"
    argv = ["train", "--data", str(photo_shards), "--out", str(out), "--model", "spandrel:SPAN", "--model-args", ARCHS["SPAN"]]
    degrade = ["--degrade", "realesrgan", "--patch-size", "96"]  # Real-ESRGAN-style LR, made from HR on the device
    assert main([*argv, *TINY, *QUIET, "--steps", "2", *degrade]) == 0
    ours = load_model(str(out))
    assert (load_model(str(out / "checkpoints/step-00000002.pt")).name, ours.step) == ("spandrel:SPAN", 2)  # a wdsr .pt
    x = torch.rand(1, 3, 20, 23)
    with torch.no_grad():
        want = ours.model(x)
    for suffix in (".safetensors", ".pth"):
        target = tmp_path / f"4x-span{suffix}"
        assert main(["export", str(out), "-o", str(target)]) == 0
        desc = spandrel.ModelLoader().load_from_file(target)
        assert (desc.architecture.id, desc.scale) == ("SPAN", 4)
        assert torch.equal(desc.model.eval()(x), want)
    capsys.readouterr()
    assert main(["export", str(out), "-o", str(target)]) == 2  # exists: never replaced without --overwrite
    assert "exists; give --overwrite" in capsys.readouterr().err
    assert main(["export", str(out), "-o", str(target), "--overwrite"]) == 0
    assert main(["train", "--out", str(out), "--resume", "--steps", "3", "--model-args", "feature_channels=16"]) == 2
    assert "was trained with model_args={'feature_channels': 8}" in capsys.readouterr().err  # the weights would not fit
    espcn = ["train", "--data", str(photo_shards), "--out", str(tmp_path / "espcn"), "--model", "espcn", *TINY, *QUIET]
    assert main([*espcn, "--steps", "1"]) == 0
    capsys.readouterr()
    assert main(["export", str(tmp_path / "espcn"), "-o", str(tmp_path / "espcn.pth")]) == 2  # wdsr's own model
    assert (
        "espcn is wdsr's own model, used from its checkpoints (wdsr upscale RUN); wdsr export writes spandrel"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "espcn.pth").exists()


def test_upscale_of_a_file_model_equals_the_model_on_the_whole_image(files, tmp_path, capsys):
    import spandrel

    lr = np.ascontiguousarray(photos()[1][40:130, 60:191])  # 90 x 131, a real photo
    m = load_model(str(files["Compact"]))  # 4 convs: 4 px of context (overlap 8) covers it
    with torch.no_grad():
        x = torch.from_numpy(lr).permute(2, 0, 1)[None].float() / 255
        whole = (m.model(x)[0].clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    tiled = upscale_image(m, lr, tile=40, overlap=8)
    diff = np.abs(tiled.astype(int) - whole.astype(int))
    assert tiled.shape == whole.shape == (360, 524, 3) and diff.max() <= 1
    # CRAFT needs sides of a multiple of 16: padded as spandrel's own inference pads, the same pixels
    torch.manual_seed(0)
    craft = for_run(ZooModel("CRAFT"), {"embed_dim": 12, "depths": [1], "num_heads": [2]}, None, 4, 3, None, "test")[0]
    (tmp_path / "craft.pth").write_bytes(state_bytes(craft.state_dict(), ".pth"))
    small = np.ascontiguousarray(lr[:13, :11])
    with torch.no_grad():
        theirs = spandrel.ModelLoader().load_from_file(tmp_path / "craft.pth")(
            torch.from_numpy(small).permute(2, 0, 1)[None] / 255
        )
    want = (theirs[0] * 255).round().byte().permute(1, 2, 0).numpy()
    assert np.array_equal(upscale_image(load_model(str(tmp_path / "craft.pth")), small, tile=None), want)
    (tmp_path / "in").mkdir()
    Image.fromarray(lr).save(tmp_path / "in" / "cat.png")
    assert main(["upscale", str(files["ESRGAN"]), str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--tile", "0"]) == 0
    assert "spandrel:ESRGAN x4" in capsys.readouterr().out


def test_a_community_pt_file_is_a_model_file_and_a_wdsr_pt_a_checkpoint(files, tmp_path, capsys):
    """A .pt without wdsr's format key goes to spandrel (upscale as its .pth); anything else in a .pt that is not
    a model either says both."""
    community = tmp_path / "4x-Compact.pt"
    community.write_bytes(files["Compact"].read_bytes())
    m, want = load_model(str(community)), load_model(str(files["Compact"]))
    x = torch.rand(1, 3, 9, 11)
    with torch.no_grad():
        assert (m.name, m.scale, m.step) == ("spandrel:Compact", 4, 0) and torch.equal(m.model(x), want.model(x))
    torch.save({"model": {}, "epoch": 3}, tmp_path / "other.pt")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    for name in ("4x-Compact.pt", "other.pt"):
        rc = main(["upscale", str(tmp_path / name), str(tmp_path / "a.png"), "-o", str(tmp_path / "out"), "--overwrite"])
        err = capsys.readouterr().err.strip()
        assert rc == (0 if name == "4x-Compact.pt" else 2), err
    assert err.count("\n") == 0 and "other.pt: not a wdsr-train/1 checkpoint (written by wdsr train), nor a model" in err, err
    assert (tmp_path / "out" / "a.png").is_file()
    found = load_model_file(str(community))  # what --init reads: a community .pt is a model file there too
    assert (found.architecture.id, found.scale) == ("Compact", 4)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "spandrel:Nope"], "not a spandrel architecture (SR ones: ATD, "),
        (["--model", "spandrel:SPAN", "--model-args", "bogus=1"], "SPAN has no option 'bogus' (its options: num_in_ch"),
        (["--model", "spandrel:DnCNN"], "DnCNN takes no scale"),
        (["--model", "espcn", "--model-args", "a=1"], "--model-args is for spandrel models"),
        (["--model", "spandrel:SwinIR", "--model-args", "window_size=7"], "SwinIR(upscale=4"),
        (["--model", "spandrel:SPAN", "--model-args", "a=" + "[" * 600 + "]" * 600], "not a value"),  # PyYAML recurses
        (["--model", "spandrel:SPAN", "--model-args", "a=[[[[[1]]]]]"], "values numbers, strings or short lists"),
    ],
)
def test_bad_model_settings_are_one_line_exit_2(photo_shards, tmp_path, capsys, args, message):
    assert main(["train", "--data", str(photo_shards), "--out", str(tmp_path / "r"), "--scale", "4", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err


def test_a_model_mapping_in_the_config_file(tmp_path):
    (tmp_path / "c.yaml").write_text("model:\n  name: spandrel:SPAN\n  feature_channels: 8\n")
    cfg = make_config({"config": str(tmp_path / "c.yaml"), "data": "d", "out": "o", "scale": 4})
    assert cfg.model == ZooModel("SPAN") and cfg.model_args == {"feature_channels": 8}
    assert cfg.dict["model"] == "spandrel:SPAN"


def test_build_by_name_is_what_train_builds():
    torch.manual_seed(0)
    net = build("spandrel:SPAN", 2, args={"feature_channels": 8})
    assert type(net).__name__ == "SPAN" and net(torch.rand(1, 3, 8, 9)).shape == (1, 3, 16, 18)
    rrdb = build("spandrel:RRDBNet", 2, args={"num_blocks": 1, "num_filters": 8})  # a class name: ESRGAN's
    assert type(bare(rrdb)).__name__ == "RRDBNet" and rrdb(torch.rand(1, 3, 8, 9)).shape == (1, 3, 16, 18)


def test_train_help_says_how_to_name_spandrel_models(capsys):
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "spandrel:ARCH" in text and "spandrel:SPAN" in text and "--model-args" in text and "--init FILE" in text


def test_a_file_that_is_not_an_sr_model_is_refused_with_the_reason(photo_shards, tmp_path, capsys):
    from spandrel.architectures.Compact import Compact

    (tmp_path / "garbage.pth").write_bytes(b"not a model")
    (tmp_path / "denoise.safetensors").write_bytes(
        state_bytes(Compact(num_feat=8, num_conv=2, upscale=1).state_dict(), ".safetensors")
    )
    (tmp_path / "other.pth").write_bytes(state_bytes({"conv.weight": torch.zeros(8, 3, 3, 3)}, ".pth"))
    (tmp_path / "model.onnx").write_bytes(b"x")
    torch.save({"format": "wdsr-train/1", "step": 1, "model": {}, "config": {}}, tmp_path / "ours.pt")
    cases = {
        "garbage.pth": "garbage.pth: not a readable model file (UnpicklingError",
        "denoise.safetensors": "denoise.safetensors: a Restoration model x1 (Compact); wdsr trains and runs SR models",
        "other.pth": "other.pth: spandrel does not recognise this model (no architecture it knows has these weights' names)",
        "model.onnx": "model.onnx: a model file is .safetensors, .pth, .ckpt, .pt",
        "ours.pt": "ours.pt: a wdsr train checkpoint, not a model file: --resume its run, or `wdsr export` it first",
        "missing.pth": "missing.pth: cannot read (No such file or directory)",
    }
    for name, message in cases.items():
        assert main(["train", "--data", str(photo_shards), "--out", str(tmp_path / "r"), "--init", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, err
