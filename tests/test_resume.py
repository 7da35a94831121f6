"""kill -9 in the middle of a build, rerun: finished shards kept, result identical to a clean build."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import photos, save
from tests.helpers import posix_semaphores, remove_orphan_semaphores, shard_hashes, sm

pytestmark = pytest.mark.slow


def big_tree(root: Path, n: int = 14) -> Path:
    pics = photos()
    for i in range(n):
        tile = np.tile(pics[i % 4], (3, 3, 1))[: 1000 + 8 * i, : 1100 + 4 * i]
        save(root / f"big{i:02d}.png", np.ascontiguousarray(np.roll(tile, 37 * i, axis=1)), compress_level=1)
    return root


def test_kill_minus_9_then_rerun_completes_without_redoing_shards(capsys, tmp_path):
    src = big_tree(tmp_path / "hr")
    flags = ["--scale", "2,3,4", "--max-samples", "1", "--png-level", "6"]
    out = tmp_path / "killed"
    semaphores = posix_semaphores()
    proc = subprocess.Popen([sys.executable, "-m", "shardmaker", "-q", "build", str(src), str(out), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list(out.glob("shard-*.tar"))) >= 3:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the build finished before it could be killed; make the workload larger"
    os.killpg(proc.pid, signal.SIGKILL)  # the build and its encoding processes die at once, as when a node dies
    proc.wait()
    time.sleep(0.2)  # the group's last processes gone from /proc
    remove_orphan_semaphores(semaphores)  # the killed pool's semaphores: its resource tracker died with it
    assert not (out / "manifest.json").exists()
    finished = len(list(out.glob("shard-*.tar")))
    assert finished >= 3

    rc, so, se = sm(capsys, "build", src, out, *flags)
    assert rc == 0, se
    kept = int(so.split("(")[1].split(" shards kept")[0])
    assert kept >= finished - 1 >= 2  # at most the shard being published at the kill is redone
    assert not list(out.rglob("*.partial")) and not (out / "_build").exists()

    clean = tmp_path / "clean"
    assert sm(capsys, "build", src, clean, *flags)[0] == 0
    assert shard_hashes(out) == shard_hashes(clean)
    assert (out / "manifest.json").read_bytes() == (clean / "manifest.json").read_bytes()
    assert sm(capsys, "verify", out)[0] == 0
