"""Helpers shared by several test modules (test modules never import each other)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from shardmaker.cli import main as shardmaker_main
from tests.s3server import free_port

HERE = Path(__file__).resolve().parent


def sm(capsys, *args: str) -> tuple[int, str, str]:
    """``shardmaker -q ARGS`` in-process: (exit status, stdout, stderr)."""
    rc = shardmaker_main(["-q", *map(str, args)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def shard_hashes(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("shard-*.tar"))}


def torchrun(nproc: int, url: str, out: Path, workers: int = 2, env: dict | None = None) -> list[dict]:
    """Run tests/dist_worker.py under torchrun (gloo, 127.0.0.1); each rank's report."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", str(HERE / "dist_worker.py"),
           url, str(out), str(workers)]
    full_env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
