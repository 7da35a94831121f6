"""Hostile model files against ``wdsr upscale FILE``, ``wdsr train --init FILE``, ``wdsr export`` and ``--resume``.

A model file is untrusted bytes: a pickle that would run code, a safetensors header that lies, a tensor claiming
terabytes, a truncated file, a FIFO or a device named ``model.pth``, weights whose shapes ask spandrel to build a
154 GB RRDBNet, a checkpoint record edited to do the same. Each is one line naming the file and what is wrong,
exit 2, nothing executed, nothing huge allocated. Every file here is a few KB."""

from __future__ import annotations

import collections
import importlib.util
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.helpers import ROOT, import_with_torchvision_stub, write_torchvision_stub
from wdsr.tools.cli import main
from wdsr.tools.export import state_bytes
from wdsr.train import untrusted
from wdsr.train.checkpoint import RunDir
from wdsr.train.zooload import MAX_FILE_BYTES

pytestmark = pytest.mark.skipif(importlib.util.find_spec("spandrel") is None, reason="spandrel (the Makefile installs it)")


@pytest.fixture(scope="module", autouse=True)
def _spandrel(tmp_path_factory) -> None:
    import_with_torchvision_stub("spandrel", tmp_path_factory.mktemp("torchvision_stub"))


class Payload:
    """Unpickled, it would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Storage:
    pass


def _claimed(numel: int, legacy: bool = False) -> tuple[type, type]:
    store = _Storage()

    class Tensor:
        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2, (store, 0, (numel,), (1,), False, collections.OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            saved = ("storage", torch.FloatStorage, "0", "cpu", numel) + (None,) * legacy  # legacy: view metadata
            return saved if obj is store else None

    return Tensor, Pickler


def claiming_pth(numel: int, record: bytes = bytes(64)) -> bytes:
    """A zip .pth whose pickle claims a float tensor of ``numel`` elements over ``record`` (deflated: torch
    inflates it whole)."""
    tensor, pickler = _claimed(numel)
    buf = io.BytesIO()
    pickler(buf, protocol=2).dump({"w": tensor()})
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in {"data.pkl": buf.getvalue(), "byteorder": b"little", "data/0": record, "version": b"3\n"}.items():
            z.writestr(f"archive/{name}", data)
    return out.getvalue()


def claiming_legacy_pth(numel: int) -> bytes:
    """The same claim in torch's pre-1.6 format (old ESRGAN files are this format)."""
    from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION

    tensor, pickler = _claimed(numel, legacy=True)
    buf = io.BytesIO()
    sys_info = {"protocol_version": PROTOCOL_VERSION, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    for item in (MAGIC_NUMBER, PROTOCOL_VERSION, sys_info):
        pickle.dump(item, buf, protocol=2)
    pickler(buf, protocol=2).dump({"w": tensor()})
    pickle.dump(["0"], buf, protocol=2)
    buf.write((16).to_bytes(8, "little") + bytes(64))
    return buf.getvalue()


def safetensors_bytes(header: dict, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def tiny_esrgan() -> dict[str, torch.Tensor]:
    from spandrel.architectures.ESRGAN import ESRGAN

    torch.manual_seed(0)
    return ESRGAN(in_nc=3, out_nc=3, num_filters=8, num_blocks=1, scale=4).state_dict()


def giant_esrgan() -> dict[str, torch.Tensor]:
    """A tiny RRDBNet whose first convolution claims 65536 features with no elements: spandrel reads num_filters
    from that shape, and every trunk convolution would be 65536 x 65536 x 3 x 3 (154 GB)."""
    state = tiny_esrgan()
    state["model.0.weight"] = torch.zeros(65536, 3, 0, 3)
    return state


def hostile_files(root: Path, marker: Path) -> dict[str, str]:
    """name -> what the one line must say, each file written under ``root``."""
    files = {
        "evil.pth": (state_bytes({"w": Payload(marker)}, ".pth"), "evil.pth: not a readable model file (UnpicklingError"),  # type: ignore[dict-item]
        "huge-len.safetensors": (struct.pack("<Q", 2**60) + b"{}", "a safetensors header of 1152921504606846976 bytes"),
        "long-header.safetensors": (struct.pack("<Q", 17 << 20) + bytes(64), "header of 17825792 bytes in a 72-byte file"),
        "bad-json.safetensors": (struct.pack("<Q", 5) + b"{abc}", "invalid JSON in header"),
        "claims.safetensors": (
            safetensors_bytes({"w": {"dtype": "F32", "shape": [100000, 100000, 100000], "data_offsets": [0, 16]}}, bytes(16)),
            "invalid shape, data type, or offset",
        ),
        "claims.pth": (claiming_pth(10**12), "record size (64 bytes) does not match expected size"),
        "claims-legacy.pth": (claiming_legacy_pth(10**9), "storage has wrong byte size"),
        "bomb.pth": (claiming_pth(2**20, bytes(2**22)), "its zip entries unpack to 4194"),  # 4 KB: a 4 MB tensor
        "truncated.safetensors": (state_bytes(tiny_esrgan(), ".safetensors")[:-9], "incomplete metadata"),
        "truncated.pth": (state_bytes(tiny_esrgan(), ".pth")[:-300], "not a readable model file"),
        "giant.safetensors": (state_bytes(giant_esrgan(), ".safetensors"), "building this model would allocate over"),
    }
    for name, (data, _) in files.items():
        (root / name).write_bytes(data)
    with open(root / "sparse.pth", "wb") as f:  # 4 GiB of nothing on disk: refused by its size, never read
        f.truncate(MAX_FILE_BYTES + 1)
    os.mkfifo(root / "fifo.pth")
    (root / "zero.pth").symlink_to("/dev/zero")
    others = {"sparse.pth": "more than a model file holds", "fifo.pth": "is a FIFO, not a regular file"}
    return {**{n: m for n, (_, m) in files.items()}, **others, "zero.pth": "character device"}


def deeply_nested(state: dict, depth: int) -> bytes:
    """``torch.save(state)`` with its string ``"@@DEEP@@"`` replaced by a list ``depth`` deep, written as pickle
    opcodes (Python's pickler cannot write one; the weights_only unpickler reads it without recursing)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    src, out = zipfile.ZipFile(io.BytesIO(buf.getvalue())), io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("data.pkl"):
                data = data.replace(b"X\x08\x00\x00\x00@@DEEP@@", b"]" * depth + b"a" * (depth - 1))  # EMPTY_LIST, APPEND
            z.writestr(info, data)
    return out.getvalue()


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def test_each_hostile_file_is_one_line_exit_2_and_runs_nothing(photo_shards, tmp_path, capsys):
    marker = tmp_path / "pwned"
    (tmp_path / "in").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "in" / "a.png")
    cases = hostile_files(tmp_path, marker)
    for name, message in cases.items():
        path = str(tmp_path / name)
        assert main(["upscale", path, str(tmp_path / "in"), "-o", str(tmp_path / "out")]) == 2, name
        err = one_line(capsys)
        assert name in err and message in err, err
        assert main(["train", "--data", str(photo_shards), "--out", str(tmp_path / "r"), "--init", path, "--steps", "1"]) == 2
        err = one_line(capsys)
        assert name in err and message in err, err
    for name, message in {"evil": "(UnpicklingError", "bomb": "(ValueError: its zip entries unpack to"}.items():
        pt = tmp_path / f"{name}.pt"  # a checkpoint's name: wdsr export (and upscale) read it as one
        pt.write_bytes((tmp_path / f"{name}.pth").read_bytes())
        assert main(["export", str(pt), "-o", str(tmp_path / "x.safetensors")]) == 2
        assert f"{name}.pt: not a readable checkpoint {message}" in one_line(capsys)
    assert not marker.exists()  # the payload never ran
    assert not (tmp_path / "r").exists() and not (tmp_path / "out").exists() and not (tmp_path / "x.safetensors").exists()


def test_the_attacks_allocate_nothing_huge(tmp_path):
    """Peak RSS in a fresh child while the giant RRDBNet and a 4 GB legacy claim are refused: under 300 MB above
    its start (built, the RRDBNet would not fit in memory; its 154 GB convolutions are refused before allocation)."""
    (tmp_path / "giant.safetensors").write_bytes(state_bytes(giant_esrgan(), ".safetensors"))
    (tmp_path / "legacy.pth").write_bytes(claiming_legacy_pth(10**9))
    code = f"""
import resource, sys
from tests.helpers import import_with_torchvision_stub
import_with_torchvision_stub("spandrel", __import__("pathlib").Path({str(tmp_path / "stub")!r}))
from wdsr.tools.upscale import load_model
start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for name in ("giant.safetensors", "legacy.pth"):
    try:
        load_model({str(tmp_path)!r} + "/" + name)
    except ValueError as exc:
        print(exc)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) // 1024)
"""
    stub = [str(write_torchvision_stub(tmp_path / "stub"))] * (importlib.util.find_spec("torchvision") is None)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([*stub, str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "building this model would allocate over" in lines[0] and "wrong byte size" in lines[1], lines
    assert int(lines[-1]) < 300, lines


def test_a_layer_count_of_ten_million_is_refused_by_its_operations(tmp_path, capsys, monkeypatch):
    """Compact's layer count is read from its highest key: 10^7 one-feature layers fit the allocation budget (a few
    bytes each) but would build for hours; the construction's tensor operations are counted and capped."""
    monkeypatch.setattr(untrusted, "MAX_OPS", 3000)  # 50,000 in use: the same refusal, 15x the CPU
    top = 2 * 10**7 + 2
    state = {"body.0.weight": torch.zeros(1, 3, 3, 3), "body.0.bias": torch.zeros(1), "body.1.weight": torch.zeros(1)}
    state |= {f"body.{top}.weight": torch.zeros(48, 1, 3, 3), f"body.{top}.bias": torch.zeros(48)}
    (tmp_path / "deep.safetensors").write_bytes(state_bytes(state, ".safetensors"))
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    assert main(["upscale", str(tmp_path / "deep.safetensors"), str(tmp_path / "a.png"), "-o", str(tmp_path / "o")]) == 2
    assert "deep.safetensors: building this model takes over 3000 tensor operations" in one_line(capsys)


def test_an_edited_checkpoint_record_is_held_to_the_weights_before_it_is_built(photo_shards, tmp_path, capsys, monkeypatch):
    """--resume and wdsr upscale RUN rebuild a spandrel run's model from its checkpoint's record: a record edited
    to 65536 features is laid out on the meta device and refused against the weights, nothing allocated; one an
    architecture that cannot be laid out (SwinIR) asks for is built under the allocation budget; a layout of 10^7
    layers is stopped by its operation count."""
    out = tmp_path / "run"
    argv = ["train", "--data", str(photo_shards), "--out", str(out), "--model", "spandrel:ESRGAN"]
    tiny = ["--scale", "4", "--patch-size", "32", "-k", "1", "--batch-size", "1", "--workers", "0", "--val-every", "0"]
    assert main([*argv, "--model-args", "num_blocks=1,num_filters=8", *tiny, "--steps", "1"]) == 0
    latest = RunDir(str(out)).latest()["path"]
    ckpt = out / latest
    state = torch.load(ckpt, weights_only=True)
    state["config"]["spandrel"]["hyperparameters"]["num_filters"] = 65536
    torch.save(state, ckpt)
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--steps", "2"]) == 2
    err = one_line(capsys)
    assert "weights do not fit spandrel ESRGAN (model.0.weight: (8, 3, 3, 3) in the file, (65536, 3, 3, 3)" in err, err
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    assert main(["upscale", str(out), str(tmp_path), "-o", str(tmp_path / "o")]) == 2
    assert "weights do not fit spandrel ESRGAN" in one_line(capsys)
    swin = {"img_size": 2**20, "window_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2], "upscale": 4}
    state["config"]["spandrel"] = {"arch": "SwinIR", "class": "SwinIR", "hyperparameters": swin}  # masks of 2^40 px
    torch.save(state, ckpt)
    assert main(["upscale", str(ckpt), str(tmp_path), "-o", str(tmp_path / "o")]) == 2
    err = one_line(capsys)
    assert "step-00000001.pt: building this model would allocate over" in err, err
    monkeypatch.setattr(untrusted, "MAX_OPS", 3000)
    state["config"]["spandrel"] = {"arch": "Compact", "hyperparameters": {"num_conv": 10**7, "num_feat": 8, "upscale": 4}}
    torch.save(state, ckpt)
    assert main(["train", "--out", str(out), "--resume", "--steps", "2"]) == 2
    assert "step-00000001.pt: building this model takes over 3000 tensor operations" in one_line(capsys)
    state["config"]["spandrel"] = {"arch": "Compact", "hyperparameters": {"num_conv": "@@DEEP@@"}}
    ckpt.write_bytes(deeply_nested(state, 100_000))  # [[[... 10^5 deep: no repr of it can be printed
    assert main(["upscale", str(ckpt), str(tmp_path), "-o", str(tmp_path / "o")]) == 2
    assert "step-00000001.pt: the checkpoint's 'spandrel' option 'num_conv' is not a number, string or short" in one_line(capsys)
