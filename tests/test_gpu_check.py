"""``bench/gpu_check.py`` runs here as its CPU dry run (``--device cpu --quick``), so that it works the first
time a GPU is lent: every section of the report, printed and written, finite numbers, the Degrader's
equality check. SPAN runs through a torchvision stub: spandrel's import reaches torchvision (LaMa,
RestoreFormer), and the registry's torchvision wheels need a CUDA torch where this machine has torch+cpu
(as ``tests/test_integrations_basicsr.py``). The time guard and the target line are checked in-process,
the guard with a fake clock."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import gpu_report
from bench.gpu_check import TARGET, Budget, Kind, Task, main, plan, run_tasks, target

ROOT = Path(__file__).resolve().parents[1]
RAISE = "(*a, **k):\n    raise NotImplementedError('torchvision stub')\n"
STUB = {  # torchvision, as far as `import spandrel` reaches
    "torchvision/__init__.py": "__version__ = '0.0+stub'\n",
    "torchvision/transforms/__init__.py": "",
    "torchvision/transforms/functional.py": "class InterpolationMode:\n    BILINEAR = 'bilinear'\n\n\ndef rotate"
    + RAISE
    + "\n\ndef normalize"
    + RAISE,
}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any], str]:
    """One dry run: (the report file, its JSON, what it printed)."""
    tmp = tmp_path_factory.mktemp("gpu_check")
    for rel, text in STUB.items():
        (tmp / "stub" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "stub" / rel).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp / "stub")])}
    cmd = [sys.executable, "-m", "bench.gpu_check", "--device", "cpu", "--quick", "--out", str(tmp / "report.md")]
    proc = subprocess.run([*cmd, "--work", str(tmp / "work")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return (tmp / "report.md").read_text(), json.loads((tmp / "report.json").read_text()), proc.stdout


@pytest.mark.slow
def test_the_dry_run_reports_every_section_with_finite_numbers(dry_run: tuple[str, dict[str, Any], str]) -> None:
    text, raw, printed = dry_run
    assert printed.strip() == text.strip()
    assert raw["card"].startswith("CPU") and raw["date"][:2] == "20" and text.startswith(f"### {raw['card']}, ")
    runs = {(r["model"], r["workers"], r["cache"]) for r in raw["train"]}
    assert runs == {(m, 2, c) for m in ("edsr-baseline", "span") for c in (False, True)}
    assert [r["model"] for r in raw["alone"]] == ["edsr-baseline", "span"]
    assert {(r["workers"], r["cache"]) for r in raw["loader"]} == {(2, False), (2, True)}
    assert raw["skipped"] == [] and "Skipped: nothing." in text
    bad = [(path, v) for path, v in gpu_report.numbers(raw) if not math.isfinite(v)]
    assert not bad, bad
    for r in raw["train"]:
        assert 0 <= r["data_wait"] <= 1 and r["steps"] >= raw["settings"]["min_steps"] and r["patches_per_s"] > 0
    for head in (
        "| model | workers | decoded cache | ms/step |",
        "| of the model alone |",
        "| model | ms/step | patches/s |",
        "| workers | decoded cache | patches/s |",
    ):
        assert head in text
    assert "Target: data_wait < 5% of the step for EDSR-baseline with 8 workers: **not measured**" in text


@pytest.mark.slow
def test_the_dry_run_checks_the_degrader_against_its_documented_bound(dry_run: tuple[str, dict[str, Any], str]) -> None:
    text, raw, _ = dry_run
    deg = raw["degrader"]
    bounded = [op for op in deg["ops"] if op["bound"] is not None]
    assert deg["checked"] and deg["equal"] is True and len(deg["ops"]) == 8
    assert [op["name"][:26] for op in bounded] == ["Degrader arbitrary scale ("] and bounded[0]["max_abs_diff"] == 0
    assert all(op["cpu_ms"] > 0 and op["device_ms"] > 0 for op in deg["ops"])
    assert "Degrader cpu against cpu: equal within the documented bound." in text


def test_the_time_guard_shares_what_is_left_and_skips_the_runs_that_no_longer_fit() -> None:
    now = [0.0]
    budget = Budget(100.0, clock=lambda: now[0])
    tasks = plan((2, 8), ["edsr-baseline"])
    shares: list[float] = []

    def run(task: Task, seconds: float) -> dict[str, float]:
        shares.append(seconds)
        now[0] += 30.0  # every run takes longer than its share
        return {"data_wait": 0.0}

    done, skipped = run_tasks(tasks, budget, 4.0, run)
    assert [t.kind for t, _ in done] == [Kind.DEGRADER, Kind.ALONE, Kind.TRAIN, Kind.TRAIN] and done[2][0] == TARGET
    usable = [100 - Budget.RESERVE_S - 30 * i for i in range(4)]  # at 90 s, 5 s usable: one run of 4 s fits, not seven
    assert shares == pytest.approx([usable[0] / 10, usable[1] / 9, usable[2] / 8, usable[3] / 1])
    assert len(skipped) == len(tasks) - 4 and all("skipped by the time guard" in line for line in skipped)
    assert [t.name for t in tasks[4:]] == [line.split(":")[0] for line in skipped]


def test_the_target_line_says_met_not_met_or_not_measured() -> None:
    other = Task(Kind.TRAIN, "edsr-baseline", 8, cache=True)
    assert target([(TARGET, {"data_wait": 0.031})]) | {"text": ""} == {"text": "", "met": True, "data_wait": 0.031}
    assert target([(other, {"data_wait": 0.01}), (TARGET, {"data_wait": 0.05})])["met"] is False
    assert "**not met** (5.0%" in target([(TARGET, {"data_wait": 0.05})])["text"]
    assert target([(other, {"data_wait": 0.01})])["met"] is None


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--device", "tpu"], "--device must be cpu or cuda, got 'tpu'"),
        (["--device", "cpu", "--quick", "--workers", "2,x"], "--workers must be counts like 2,4,8,16, got '2,x'"),
        (["--device", "cpu", "--workers", "0,2"], "--workers must be counts >= 1, got (0, 2)"),
        (["--device", "cpu", "--budget", "-1"], "--budget and the run times must be positive"),
    ],
)
def test_bad_settings_exit_2_with_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu_check: {says}") and err.count("\n") == 1
