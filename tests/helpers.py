"""Helpers shared by several test modules (test modules never import each other)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from shardmaker.cli import main as shardmaker_main
from shardmaker.format import tario
from shardmaker.format.manifest import Manifest, ShardInfo
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


def rewrite(ds: Path, shard_index: int, edit) -> None:
    """Rewrite one shard's members through ``edit(name, data) -> (name, data) | None`` and fix the manifest."""
    doc = json.loads((ds / "manifest.json").read_text())
    m = Manifest.from_json(doc)
    info = m.shards[shard_index]
    path = ds / info.name
    members = list(tario.iter_members(open(path, "rb")))
    out, offsets, keys = b"", [], []
    for name, _, data in members:
        got = edit(name, data)
        if got is None:
            continue
        key = tario.split_name(got[0])[0]
        if not keys or keys[-1] != key:
            keys.append(key)
            offsets.append(len(out))
        out += tario.member_bytes(*got)
    out += tario.END_OF_ARCHIVE
    path.write_bytes(out)
    new = ShardInfo(info.name, info.samples, len(out), hashlib.sha256(out).hexdigest(), keys, offsets, info.hr_sizes)
    doc["shards"][shard_index] = new.to_json()
    doc["bytes"] = sum(s["bytes"] for s in doc["shards"])
    (ds / "manifest.json").write_text(json.dumps(doc))


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, grandchildren, ...), from /proc; whatever session they started."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants at once, as a node that dies would (torchrun starts
    each rank in a session of its own, so killing its process group misses them): stop them all
    first, so none reacts to the others dying, then kill them."""
    import signal

    procs = [pid, *descendants(pid)]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in procs:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass


def posix_semaphores() -> set[Path]:
    """multiprocessing's named semaphores in /dev/shm (spawn/forkserver pools create them)."""
    return set(Path("/dev/shm").glob("sem.mp-*"))


def remove_orphan_semaphores(before: set[Path]) -> list[Path]:
    """Semaphores that appeared since ``before`` and that no live process maps: what a process
    group killed with SIGKILL (its resource tracker with it) leaves behind. Removed; returned."""
    new = posix_semaphores() - before
    if not new:
        return []
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(line.split(maxsplit=5)[-1].strip() for line in maps.read_text().splitlines() if "/dev/shm/sem.mp-" in line)
        except OSError:  # the process is gone, or not ours to read
            continue
    orphans = sorted(p for p in new if str(p) not in mapped)
    for p in orphans:
        p.unlink(missing_ok=True)
    return orphans
