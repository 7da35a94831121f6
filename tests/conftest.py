"""Shared fixtures: real photos (scikit-image's bundled set, tests/data/refdata), tiny trees."""
from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def _refdata() -> Path | None:
    # WDSR_REFDATA first (a larger or another copy), then the files this repository ships (see
    # tests/data/refdata/SOURCES.md), then a checkout's ../shared/refdata.
    for cand in (os.environ.get("WDSR_REFDATA"), ROOT / "tests" / "data" / "refdata", ROOT.parent / "shared" / "refdata"):
        if cand and (Path(cand) / "set5" / "HR").is_dir():
            return Path(cand)
    return None


REFDATA = _refdata()
needs_refdata = pytest.mark.skipif(REFDATA is None, reason="tests/data/refdata (Set5, MATLAB references) not found")


@pytest.fixture(scope="session")
def refdata() -> Path:
    if REFDATA is None:
        pytest.skip("tests/data/refdata not found")
    return REFDATA


@functools.lru_cache(maxsize=1)
def _photos() -> tuple[np.ndarray, ...]:
    from skimage import data

    return tuple(np.ascontiguousarray(p) for p in (data.astronaut(), data.chelsea(), data.coffee(), data.rocket()))


def photos() -> list[np.ndarray]:
    """Real RGB photos that ship inside scikit-image's wheel (no download); fresh copies."""
    return [p.copy() for p in _photos()]


def load_rgb(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def save(path: Path, arr: np.ndarray, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, **kw)
    return path


@pytest.fixture()
def hr_tree(tmp_path: Path) -> Path:
    """Six real-photo HR crops of varied sizes (some not multiples of 3 or 4) in two folders."""
    root = tmp_path / "hr"
    sizes = [(96, 128), (101, 130), (120, 90), (64, 64), (130, 97), (77, 88)]
    for i, (h, w) in enumerate(sizes):
        img = photos()[i % 4]
        y, x = 7 * i, 11 * i
        sub = "a" if i < 3 else "b/c"
        save(root / sub / f"img{i}.png", np.ascontiguousarray(img[y : y + h, x : x + w]))
    return root


def build_shards(src: Path, out: Path, *flags: str) -> Path:
    """Build real shards with the shardmaker CLI (in-process)."""
    from shardmaker.cli import main

    rc = main(["-q", "build", str(src), str(out), "--workers", "1", *flags])
    assert rc == 0, f"shardmaker build failed for {src}"
    return out


@pytest.fixture(scope="session")
def photo_src(tmp_path_factory) -> Path:
    """Ten real-photo HR images of varied sizes (crops and flips of scikit-image's photos)."""
    root = tmp_path_factory.mktemp("photo_src")
    pics = photos()
    for i in range(10):
        img = pics[i % 4]
        h, w = 200 + 13 * i, 240 + 7 * i
        crop = img[(5 * i) % 40 :][:h, (3 * i) % 50 :][:, :w]
        if i >= 4:
            crop = crop[::-1]
        save(root / f"p{i:02d}.png", np.ascontiguousarray(crop))
    return root


@pytest.fixture(scope="session")
def photo_shards(tmp_path_factory, photo_src) -> Path:
    """10 samples in 4 shards (3+3+3+1), scales 2 and 4, PNG, generated with matlab bicubic."""
    return build_shards(photo_src, tmp_path_factory.mktemp("photo_shards") / "ds", "--scale", "2,4", "--max-samples", "3")


# ---- a real S3 server on 127.0.0.1 (SeaweedFS; moto only where weed cannot run) ----------------
S3_BUCKET = "wdsr-test"


def pytest_collection_modifyitems(config, items) -> None:
    """Tests that need the S3 server get the ``s3`` marker (``make test-fast`` leaves them out)."""
    for item in items:
        if "s3" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)


def pytest_report_header(config) -> str:
    from tests.s3server import weed_binary

    binary = weed_binary()
    if binary and os.environ.get("WDSR_TEST_S3") != "moto":
        return f"s3 tests: SeaweedFS `weed mini` ({binary}) on 127.0.0.1, SigV4 credentials enforced"
    return "s3 tests: moto server mode on 127.0.0.1 (fallback: no `weed` binary)"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One S3 server for the session (started on first use, stopped and reaped at the end)."""
    from tests.s3server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3server")).start()
    try:
        with aws_env(server):
            server.make_bucket(S3_BUCKET)
        yield server
    finally:
        server.stop()


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


@pytest.fixture()
def s3(s3_server):
    """The S3 server, with the AWS variables set for this test only (later tests do not see them)."""
    with aws_env(s3_server):
        yield s3_server


@pytest.fixture(scope="session")
def _s3_photo_shards_built(s3_server, photo_src) -> str:
    url = f"s3://{S3_BUCKET}/photos"
    with aws_env(s3_server):
        build_shards(photo_src, url, "--scale", "2,4", "--max-samples", "3")
    return url


@pytest.fixture()
def s3_photo_shards(s3, _s3_photo_shards_built) -> str:
    """``photo_shards`` built straight to S3 (same flags, so the same bytes); the AWS variables are set."""
    return _s3_photo_shards_built


# ---- no process outlives the suite ------------------------------------------------------------------
# Every process the tests start inherits this variable, so one that was orphaned (its parent killed)
# is found too, not only the suite's own children.
_SESSION = f"WDSR_TEST_SESSION={os.getpid()}"
os.environ["WDSR_TEST_SESSION"] = str(os.getpid())


def leftovers() -> list[tuple[int, str]]:
    """Live processes started (directly or not) by this test session, as (pid, command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if _SESSION.encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = next(line.split()[1] for line in (entry / "status").read_text().splitlines() if line.startswith("State:"))
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, StopIteration):
            continue
        if state != "Z" and "resource_tracker" not in cmd:  # multiprocessing's own helper lives until we exit
            found.append((int(entry.name), cmd))
    return found


def pytest_sessionfinish(session, exitstatus):
    import time

    deadline = time.monotonic() + 10  # give exiting processes a moment
    left = leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftovers()
    if left:
        lines = "\n".join(f"  pid {pid}: {cmd[:200]}" for pid, cmd in left)
        print(f"\nERROR: {len(left)} process(es) started by the tests outlived them (a test did not reap "
              f"what it started):\n{lines}")
        for pid, _ in left:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        session.exitstatus = 1
