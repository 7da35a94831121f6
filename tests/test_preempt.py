"""Preemption that fits the real grace period: the overlapped per-step vote, time-based checkpoints
(--ckpt-minutes, rank 0's clock), and the preemption checkpoint written by a rank that was not told to
stop (rank 0's node going away), with the run's history carried by that rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import HERE, ROOT, descendants, wait_until
from tests.s3server import free_port
from wdsr.tools.cli import main
from wdsr.train import vote as vote_module
from wdsr.train.checkpoint import RunDir
from wdsr.train.config import make_config
from wdsr.train.context import Ctx
from wdsr.train.logbook import MetricsLog, Standby
from wdsr.train.vote import Verdict, Vote

SMALL = ["--model", "espcn", "--patch-size", "48", "-k", "4", "--batch-size", "4", "--workers", "1", "--shuffle-buffer", "16"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_writer_is_the_lowest_rank_not_told_to_stop():
    assert Verdict((0,), world=4).writer == 1
    assert Verdict((0, 1, 2), world=4).writer == 3
    assert Verdict((1,), world=4).writer == 0
    assert Verdict((0, 1), world=2).writer == 0  # every rank told: rank 0 writes, as without a vote
    assert Verdict(world=3).writer == 0 and not Verdict(world=3).stop
    with pytest.raises(ValueError, match="told must be distinct ranks"):
        Verdict((3,), world=2)


def test_one_rank_reads_each_vote_after_the_next_step():
    """A stop asked at the cast after step i is read after step i+1; rank 0's clock is read once per vote."""
    now = [0.0]
    reads: list[float] = []

    def clock() -> float:
        reads.append(now[0])
        return now[0]

    v = Vote(Ctx(0, 1, __import__("torch").device("cpu"), None), 2, clock)  # 2 minutes
    assert v.read() == Verdict(world=1)  # nothing cast yet
    v.cast(False)  # the interval starts at the first vote
    now[0] = 119.0
    assert not v.read().checkpoint_due
    v.cast(False)
    now[0] = 120.0
    assert not v.read().checkpoint_due
    v.cast(False)
    got = v.read()
    assert got.checkpoint_due and not got.stop
    v.checkpointed()
    v.cast(True)  # the interval starts again here
    got = v.read()
    assert got.stop and got.told == (0,) and not got.checkpoint_due
    assert reads == [0.0, 119.0, 120.0, 120.0]
    v.cast(False)
    v.drain()
    assert v.read() == Verdict(world=1)  # drained: nothing left in flight
    assert Vote(Ctx(0, 1, __import__("torch").device("cpu"), None), 0, clock).every_s is None  # 0 = off


def test_ckpt_minutes_checkpoints_on_rank_0s_clock(photo_shards, tmp_path, monkeypatch):
    """A clock on which each step lasts 20 s and --ckpt-minutes 1: the vote after a step sees the minute
    passed (3 votes after the interval started), the checkpoint follows one step later."""
    steps = [0]
    monkeypatch.setattr(vote_module, "CLOCK", lambda: 20.0 * steps[0])
    from wdsr.train import loop

    real_step = loop._Model.step

    def counted(self, *a, **kw):
        steps[0] += 1
        return real_step(self, *a, **kw)

    monkeypatch.setattr(loop._Model, "step", counted)
    out = tmp_path / "run"
    argv = ["train", "--data", str(photo_shards), "--out", str(out), *SMALL, "--steps", "12", "--val-every", "0"]
    assert main([*argv, "--ckpt-every", "0", "--ckpt-minutes", "1", "--keep-ckpts", "0", "--log-every", "4"]) == 0
    # votes after steps 1 (the interval starts: 20 s), 4 (80 s: due) -> checkpoint at 5; 5 .. 8 -> 9; the end: 12
    assert [int(n[5:13]) for n in RunDir(str(out)).checkpoints()] == [5, 9, 12]
    off = tmp_path / "off"
    argv[4] = str(off)
    assert main([*argv, "--ckpt-every", "0", "--ckpt-minutes", "0", "--keep-ckpts", "0", "--log-every", "4"]) == 0
    assert [int(n[5:13]) for n in RunDir(str(off)).checkpoints()] == [12]
    assert make_config({"data": "/d", "out": "/o", "ckpt_minutes": "2.5"}).ckpt_minutes == 2.5
    with pytest.raises(ValueError, match="ckpt-minutes"):
        make_config({"data": "/d", "out": "/o", "ckpt_minutes": -1})


def test_a_standby_rank_brings_a_remote_history_to_its_checkpoint(tmp_path):
    """Rank 0 synced OUT at step 2 and logged steps 3-4 in its own log dir; its node goes away: rank 1's
    Standby (the same records) takes over and OUT's history is rank 0's, then rank 1's last line."""
    out = f"memory://preempt-{os.getpid()}/run"
    cfg = make_config({"data": "/d", "out": out, "log_dir": str(tmp_path / "logs")})
    run = RunDir(out)
    rank0, rank1 = MetricsLog(run, cfg, 0), Standby(run, cfg, 0)
    lines = [{"step": s, "loss": 1.0 / s} for s in range(1, 5)]
    for r in lines[:2]:
        rank0.write(r)
        rank1.write(r)
    rank0.sync()  # the checkpoint at step 2
    rank1.synced(2)
    for r in lines[2:]:
        rank0.write(r)
        rank1.write(r)
    assert [json.loads(x)["step"] for x in run.fs.cat(run.path("metrics.jsonl")).splitlines()] == [1, 2]
    rank1.take_over(4)
    rank1.sync()
    rank1.write({"step": 4, "event": "stopped"})
    rank1.sync()
    rank1.close()
    got = [json.loads(x) for x in run.fs.cat(run.path("metrics.jsonl")).splitlines()]
    assert got == [*lines, {"step": 4, "event": "stopped"}]
    assert not (tmp_path / "logs" / "metrics.jsonl").read_text().count("stopped")  # rank 0's file untouched


@pytest.mark.slow
def test_every_rank_reads_the_same_vote_at_the_same_step(tmp_path):
    """2 gloo ranks under torchrun: rank 0's clock alone decides the time-based checkpoint (rank 1's
    would fail if read); a stop asked after step i is read by both after step i+1, with who was told."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1"]
    cmd += [f"--master-port={free_port()}", str(HERE / "vote_worker.py"), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [json.loads((tmp_path / f"vote-{r}.json").read_text()) for r in (0, 1)]
    assert seen[0] == seen[1]
    first = seen[0]["first"]
    assert [s["step"] for s in first if s["due"]] == [5]  # cast after step 4 (3 minutes after step 1)
    assert first[-1] == {"step": 7, "told": [1], "due": False, "writer": 0}  # told at the cast after step 6
    assert seen[0]["second"][-1] == {"step": 2, "told": [0], "due": False, "writer": 1}


def _train_cmd(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        *(sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1"),
        *(f"--master-port={free_port()}", "-m", "wdsr", "train", "--data", str(data), "--out", str(out), *SMALL),
        *("-k", "64", "--steps", "300", "--log-every", "1", "--val-every", "0", "--ckpt-every", "0", *extra),
    ]


def _rank_process(torchrun: int, rank: int) -> int:
    """The process of ``rank`` (a child of torchrun; its DataLoader workers carry its RANK too)."""
    for pid in descendants(torchrun):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if ppid == torchrun and f"RANK={rank}".encode() in env:
            return pid
    raise AssertionError(f"no rank {rank} under torchrun {torchrun}")


@pytest.mark.slow
def test_sigterm_to_rank_0_only_rank_1_writes_the_checkpoint_and_the_resume_is_exact(photo_shards, tmp_path):
    """Rank 0's node is going away (SIGTERM to its process alone): rank 1, not told, writes the checkpoint
    and the history's last line while rank 0 waits; --resume ends with the uninterrupted run's weights."""
    ref = subprocess.run(_train_cmd(photo_shards, tmp_path / "ref"), capture_output=True, text=True, timeout=600, env=ENV)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = records(tmp_path / "ref")[-1]
    assert want["event"] == "finished" and want["weights_in_sync"]

    out = tmp_path / "run"
    proc = subprocess.Popen(_train_cmd(photo_shards, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        metrics = out / "metrics.jsonl"
        wait_until(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, "3 logged steps", alive=proc)
        os.kill(_rank_process(proc.pid, 0), signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0  # rank 1 stopped for a peer: 75, so torchrun fails (the Job restarts the pod)
    assert "(written by rank 1: rank 0 was told to stop)" in err, err[-3000:]
    step = RunDir(str(out)).latest()["step"]
    last = records(out)[-1]
    assert 3 < step < 300 and last["event"] == "stopped" and last["step"] == step and last["weights_in_sync"]
    assert [r["step"] for r in records(out) if "loss" in r] == list(range(1, step + 1))  # rank 0 logged them all

    again = subprocess.run(_train_cmd(photo_shards, out, "--resume"), capture_output=True, text=True, timeout=600, env=ENV)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming at step {step}" in again.stderr
    got = records(out)[-1]
    assert got["event"] == "finished" and got["step"] == 300
    assert got["weights_sha256"] == want["weights_sha256"]
