"""Fixtures and pytest hooks only: real photos (scikit-image's bundled set, tests/data/refdata), tiny
trees, shards, the S3 server. Plain helpers live in tests/helpers.py (test modules import those)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# One intra-op thread for torch in the test process and in every process it starts (torchrun does the
# same for its ranks): the tests' tensors are tiny, and a second OpenMP thread spinning at each barrier
# on a busy 2-core machine costs the suite minutes (test_degrade_*.py: 29 CPU-s with two, 8 with one).
# Set before torch is imported; OMP_NUM_THREADS=N in the environment still wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
from hypothesis import settings

from tests.helpers import REFDATA, S3_BUCKET, SESSION_VAR, aws_env, build_shards, leftovers, photos, save

# No hypothesis deadline anywhere (its per-example deadline is a wall-clock limit a busy machine trips);
# `--hypothesis-profile` still picks another profile.
settings.register_profile("wdsr", deadline=None)
settings.load_profile("wdsr")


def pytest_configure(config) -> None:
    # Every process the tests start inherits this variable, so the check at the end finds orphans too.
    os.environ[SESSION_VAR] = str(os.getpid())
    if "torch" in sys.modules:  # imported by a plugin before this file set the variable
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def refdata() -> Path:
    if REFDATA is None:
        pytest.skip("tests/data/refdata not found")
    return REFDATA


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
def pytest_collection_modifyitems(config, items) -> None:
    """Tests that need the S3 server get the ``s3`` marker (``make test-fast`` leaves them out); slow tests run first."""
    for item in items:
        if "s3" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)
    # The long multi-process tests first (a stable sort keeps each group's order): `pytest -n 2` hands
    # out tests as workers free up, and a 45 s test drawn last would leave one core idle meanwhile.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
# Under `pytest -n 2` (make test) each xdist worker sets the variable to its own pid in pytest_configure,
# so each worker checks what its own tests started, and hands what it found to the controller, whose
# exit status is the one that counts. The controller's own mark is on the workers alone.
_LEFT_BY_WORKERS: list[str] = []


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    _LEFT_BY_WORKERS.extend(getattr(node, "workeroutput", {}).get("leftovers", []))


def pytest_sessionfinish(session, exitstatus):
    if session.config.pluginmanager.hasplugin("dsession"):  # the xdist controller: its workers checked
        lines = list(_LEFT_BY_WORKERS)
    else:
        lines = _reap_leftovers()
        if _is_xdist_worker(session.config):
            session.config.workeroutput["leftovers"] = lines
    if lines:
        print(
            f"\nERROR: {len(lines)} process(es) started by the tests outlived them (a test did not reap what it started):\n"
            + "\n".join(lines)
        )
        session.exitstatus = 1


def _reap_leftovers() -> list[str]:
    """What this process's tests started and left running, as lines; killed."""
    deadline = time.monotonic() + 30  # give exiting processes a moment (a busy machine is slow to reap)
    left = leftovers()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftovers()
    for pid, _ in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    return [f"  pid {pid}: {cmd[:200]}" for pid, cmd in left]
