"""Real multi-process runs: torchrun on 127.0.0.1 with gloo, DataLoader workers in every rank."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shardmaker.format.manifest import load

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, url: str, out: Path, workers: int = 2, env: dict | None = None) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(HERE / "dist_worker.py"),
           url, str(out), str(workers)]
    full_env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_get_equal_batches_and_every_sample(photo_shards, tmp_path, nproc):
    reports = torchrun(nproc, str(photo_shards), tmp_path / f"w{nproc}")
    m = load(str(photo_shards))
    all_keys = {k for s in m.shards for k in s.keys}
    lens = {r["len"] for r in reports}
    assert len(lens) == 1
    for epoch in range(2):
        steps = [r["epochs"][epoch]["steps"] for r in reports]
        assert steps == [reports[0]["len"]] * nproc  # yielded == promised, on every rank
        seen = {k for r in reports for k in r["epochs"][epoch]["keys"]}
        assert seen == all_keys  # no sample lost
    orders = [[k for r in reports for k in r["epochs"][e]["keys"]] for e in range(2)]
    assert orders[0] != orders[1]


def test_skipped_samples_keep_ranks_in_step(photo_shards, tmp_path):
    import shutil

    ds = Path(shutil.copytree(photo_shards, tmp_path / "ds"))
    m = load(str(ds))
    victim = ds / m.shards[0].name
    victim.write_bytes(victim.read_bytes()[:-5000])  # truncated shard: its samples are skipped
    reports = torchrun(2, str(ds), tmp_path / "out", env={"WDSR_ON_ERROR": "skip"})
    for epoch in range(2):
        assert [r["epochs"][epoch]["steps"] for r in reports] == [reports[0]["len"]] * 2
    assert sum(r["stats"]["skipped"] for r in reports) >= m.shards[0].samples
