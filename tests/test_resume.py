"""kill -9 in the middle of a build, rerun: finished shards kept, result identical to a clean build."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import (
    ROOT,
    group_members,
    is_running,
    photos,
    remove_semaphores,
    save,
    semaphore_inodes,
    shard_hashes,
    sm,
    wait_until,
)

pytestmark = pytest.mark.slow


def big_tree(root: Path, n: int = 14) -> Path:
    pics = photos()
    for i in range(n):
        tile = np.tile(pics[i % 4], (3, 3, 1))[: 1000 + 8 * i, : 1100 + 4 * i]
        save(root / f"big{i:02d}.png", np.ascontiguousarray(np.roll(tile, 37 * i, axis=1)), compress_level=1)
    return root


# The build, but one that cannot finish on its own: after recording its 4th shard (and before
# publishing it) it waits for ever, so the kill always lands mid-build, wherever the build has got
# to by then (writing the 4th shard, encoding ahead, or between recording and publishing it),
# however fast or slow the machine is.
_BUILD_UNTIL_KILLED = """
import sys, threading
from shardmaker.builder import output
from shardmaker.cli import main

record, recorded = output.Output.record, []

def record_then_wait(self, *args, **kw):
    record(self, *args, **kw)
    recorded.append(1)
    if len(recorded) == 4:
        threading.Event().wait()

output.Output.record = record_then_wait
sys.exit(main(sys.argv[1:]))
"""


def test_kill_minus_9_then_rerun_completes_without_redoing_shards(capsys, tmp_path):
    src = big_tree(tmp_path / "hr")
    flags = ["--scale", "2,3,4", "--max-samples", "1", "--png-level", "6"]
    out = tmp_path / "killed"
    log = tmp_path / "build.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _BUILD_UNTIL_KILLED, "-q", "build", str(src), str(out), *flags],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    try:
        wait_until(lambda: len(list(out.glob("shard-*.tar"))) >= 3, "3 finished shards", alive=proc)
    finally:
        group = set(group_members(proc.pid))  # the build and its encoding processes ...
        semaphores = semaphore_inodes(group)
        os.killpg(proc.pid, signal.SIGKILL)  # ... die at once, as when a node dies
        group |= set(group_members(proc.pid))
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, log.read_text()[-3000:]  # killed, not ended on its own
    wait_until(lambda: not any(is_running(p) for p in group), "the end of the killed build's processes")
    remove_semaphores(semaphores)  # the killed pool's semaphores: its resource tracker died with it
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
