"""``python -m wdsr.integrations.basicsr`` where ``import basicsr`` cannot work (issue 39): one line that
says what to install (torchvision matched to this torch and the CPU-only index; a missing basicsr
dependency by its pip name; basicsr itself), exit 2, no traceback. Each case runs the real entry point
in a child process with one package made unimportable by a folder first on PYTHONPATH."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT
from tests.helpers import TORCHVISION_STUB as STUB
from wdsr.integrations.basicsr import torchvision_pin

BLOCK = "raise ModuleNotFoundError(\"No module named '{0}'\", name='{0}')\n"


def _entry(tmp_path: Path, files: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for name, text in files.items():
        (tmp_path / "first" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "first" / name).write_text(text)
    (tmp_path / "train.yml").write_text("name: t\nmanual_seed: 1\n")  # a good file: checked before the imports
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'first'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "wdsr.integrations.basicsr", "-opt", "train.yml"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # reaped: run() waits


def test_torchvision_pin_follows_torch() -> None:
    assert torchvision_pin("2.13.0+cpu") == "torchvision==0.28.0"
    assert torchvision_pin("2.5.1") == "torchvision==0.20.1" and torchvision_pin("3.0.0") == "torchvision"


@pytest.mark.parametrize(
    "blocked, says",
    [
        ("torchvision", "BasicSR needs torchvision, which cannot be imported (torchvision is blocked): pip install {pin}"),
        ("scipy", "basicsr needs scipy, which is not installed: pip install scipy; see docs/integrations.md"),
        ("basicsr", "this integration needs basicsr, which is not installed: pip install --no-deps --no-build-isolation"),
    ],
)
def test_a_missing_import_is_one_line_naming_what_to_install(tmp_path: Path, blocked: str, says: str) -> None:
    if blocked == "scipy" and importlib.util.find_spec("basicsr") is None:
        pytest.skip("basicsr: the Makefile installs it (--no-deps)")
    # torchvision as far as `import basicsr` reaches (tests/test_integrations_basicsr.py), then the one blocked package
    files = {k: v for k, v in STUB.items() if not k.startswith(f"{blocked}/")}
    text = "raise ImportError('torchvision is blocked')\n" if blocked == "torchvision" else BLOCK.format(blocked)
    files[f"{blocked}/__init__.py"] = text
    proc = _entry(tmp_path, files)
    line = says.format(pin=torchvision_pin(torch.__version__))
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1 and line in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    if blocked == "torchvision":  # torch 2.13 -> torchvision 0.28, and the CPU-only route
        assert "--index-url https://download.pytorch.org/whl/cpu" in proc.stderr, proc.stderr
