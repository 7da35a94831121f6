"""Everything the test modules share that is not a fixture (fixtures live in conftest.py; test
modules never import each other, nor conftest). Plain functions and classes only: data makers,
process tools, and the clock and waiting helpers that keep tests independent of the machine's speed."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardmaker.cli import main as shardmaker_main
from shardmaker.format import tario
from shardmaker.format.manifest import Manifest, ShardInfo
from tests.s3server import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
S3_BUCKET = "wdsr-test"


# ---- test data ----------------------------------------------------------------------------------
def _refdata() -> Path | None:
    # WDSR_REFDATA first (a larger or another copy), then the files this repository ships (see
    # tests/data/refdata/SOURCES.md), then a checkout's ../shared/refdata.
    for cand in (os.environ.get("WDSR_REFDATA"), ROOT / "tests" / "data" / "refdata", ROOT.parent / "shared" / "refdata"):
        if cand and (Path(cand) / "set5" / "HR").is_dir():
            return Path(cand)
    return None


REFDATA = _refdata()
needs_refdata = pytest.mark.skipif(REFDATA is None, reason="tests/data/refdata (Set5, MATLAB references) not found")


@functools.lru_cache(maxsize=1)
def _photos() -> tuple[np.ndarray, ...]:
    from skimage import data

    return tuple(np.ascontiguousarray(p) for p in (data.astronaut(), data.chelsea(), data.coffee(), data.rocket()))


def photos() -> list[np.ndarray]:
    """Real RGB photos that ship inside scikit-image's wheel (no download); fresh copies."""
    return [p.copy() for p in _photos()]


def mosaic(h: int, w: int) -> np.ndarray:
    """An RGB image of real photos side by side, row after row (not noise: codecs and the resize
    behave as on real data), each repeat shifted so no two places are alike."""
    out = np.zeros((h, w, 3), np.uint8)
    ps = photos()
    i = 0
    for y in range(0, h, 512):
        x = 0
        while x < w:
            p = np.roll(ps[i % len(ps)], 37 * i, axis=1)[: min(512, h - y), : w - x]
            out[y : y + p.shape[0], x : x + p.shape[1]] = p
            x += p.shape[1]
            i += 1
    return out


def load_rgb(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def save(path: Path, arr: np.ndarray, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, **kw)
    return path


def build_shards(src: Path, out: Path | str, *flags: str) -> Path | str:
    """Build real shards with the shardmaker CLI (in-process)."""
    rc = shardmaker_main(["-q", "build", str(src), str(out), "--workers", "1", *flags])
    assert rc == 0, f"shardmaker build failed for {src}"
    return out


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
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(HERE / "dist_worker.py"),
        url,
        str(out),
        str(workers),
    ]
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


def semaphore_inodes(pids) -> set[int]:
    """Inodes of the POSIX semaphores that the processes ``pids`` map, whether by name or by the
    temporary name glibc creates one under (how its creator maps it)."""
    inodes: set[int] = set()
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/maps").read_text()
        except OSError:  # the process is gone, or not ours to read
            continue
        for line in text.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/sem."):
                inodes.add(int(fields[4]))
    return inodes


def remove_semaphores(inodes: set[int]) -> list[Path]:
    """Remove multiprocessing's named semaphores with these inodes: what a process group killed with
    SIGKILL (its resource tracker with it) leaves behind. Only those: a test running beside this one
    (``pytest -n 2``) may have just created its own, not yet mapped by the name. Returns what went."""
    gone = []
    for p in posix_semaphores():
        try:
            if p.stat().st_ino in inodes:
                p.unlink(missing_ok=True)
                gone.append(p)
        except OSError:
            continue
    return sorted(gone)


def is_running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has stopped running: it maps nothing, holds no lock)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def group_members(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


# ---- waiting for what happened, not for a while ------------------------------------------------
def wait_until(pred: Callable[[], object], what: str, timeout: float = 120.0, alive: subprocess.Popen | None = None) -> None:
    """Poll ``pred`` until it holds. ``timeout`` only stops a test that would hang (it is no
    measure of speed: keep it far above what the slowest machine needs); with ``alive``, fail
    at once if that process ends first."""
    deadline = time.monotonic() + timeout
    while not pred():
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the process ended ({alive.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.02)


class FakeClock:
    """A clock that moves only when told: hand it to code in place of the ``time`` module (it has
    ``monotonic``, ``perf_counter`` and ``sleep``), so a test of timing logic asserts
    exact counts instead of counting what happened in a wall-clock window."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    perf_counter = monotonic

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


# ---- S3 ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def aws_env(server):
    """The standard AWS variables pointing at ``server``, for as long as the block runs."""
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- no process outlives the suite ---------------------------------------------------------------
# Every process the tests start inherits this variable (conftest sets it when pytest starts), so one
# that was orphaned (its parent killed) is found too, not only the suite's own children.
SESSION_VAR = "WDSR_TEST_SESSION"


def leftovers() -> list[tuple[int, str]]:
    """Live processes started (directly or not) by this test session, as (pid, command line)."""
    marker = f"{SESSION_VAR}={os.environ.get(SESSION_VAR, os.getpid())}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = next(line.split()[1] for line in (entry / "status").read_text().splitlines() if line.startswith("State:"))
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, StopIteration):
            continue
        if state != "Z" and "resource_tracker" not in cmd:  # multiprocessing's own helper lives until we exit
            found.append((int(entry.name), cmd))
    return found


# ---- streams compared batch by batch (the decoded-cache tests) ----------------------------------
def run_epochs(url: str, epochs: int = 2, workers: int = 2, **kw) -> tuple[list[tuple], dict]:
    """Every batch of ``epochs`` epochs (lr, hr, keys; copies), and the dataset's counters after."""
    import wdsr

    ds = wdsr.SRDataset(
        url, scale=4, patch_size=48, patches_per_image=3, batch_size=4, shuffle_buffer=8, seed=2, return_keys=True, **kw
    )
    loader = wdsr.make_loader(ds, num_workers=workers)
    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        out += [(lr.clone(), hr.clone(), keys) for lr, hr, keys in loader]
    return out, ds.stats.totals()


def same_batches(a: list, b: list) -> bool:
    import torch

    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2] == y[2] for x, y in zip(a, b, strict=True)
    )


# ---- torchvision stub ---------------------------------------------------------------------------
# The registry's torchvision wheels need a CUDA torch and this machine has torch+cpu. basicsr and spandrel
# import torchvision at module level (spandrel: LaMa's rotate/InterpolationMode, RestoreFormer's normalize)
# and the paths tested call none of it: every stub function raises, so a call fails the test loudly.
_STUB_RAISE = "(*a, **k):\n    raise NotImplementedError('torchvision stub')\n"
TORCHVISION_STUB = {
    "torchvision/__init__.py": "__version__ = '0.0+stub'\n",
    "torchvision/transforms/__init__.py": "",
    "torchvision/transforms/functional.py": "import enum\n\n\nclass InterpolationMode(enum.Enum):\n    NEAREST = 'nearest'\n"
    "    BILINEAR = 'bilinear'\n\n\ndef rotate" + _STUB_RAISE + "\n\ndef normalize" + _STUB_RAISE,
    "torchvision/transforms/_functional_tensor.py": "def rgb_to_grayscale" + _STUB_RAISE,
    "torchvision/models/__init__.py": "from . import vgg\n",
    "torchvision/models/vgg.py": "",
    "torchvision/utils.py": "def make_grid" + _STUB_RAISE,
}


def write_torchvision_stub(root: Path) -> Path:
    """The stub package under ``root`` (put ``root`` first on PYTHONPATH / sys.path); returns ``root``."""
    for name, text in TORCHVISION_STUB.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def import_with_torchvision_stub(module: str, root: Path) -> None:
    """``import module`` (spandrel) with the stub standing in for a missing torchvision, which lives in
    ``sys.modules`` only during the import: other tests still see no torchvision. A no-op where the real
    torchvision is installed."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        importlib.import_module(module)
        return
    sys.path.insert(0, str(write_torchvision_stub(root)))
    try:
        importlib.import_module(module)
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
