"""Exit codes as a contract (shardmaker.exitcodes; docs/kubernetes.md, "Exit codes"): 2 bad input, 69
storage unavailable, in both CLIs; through torchrun (python -m wdsr.train.launch) the pod exits with the
failing rank's class. Real errors from real clients, a closed port and a throttling proxy on 127.0.0.1."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from shardmaker.errors import BuildError
from shardmaker.exitcodes import ExitCode, exit_code_of, unavailable
from tests.faultproxy import FaultProxy
from tests.helpers import ROOT, rewrite
from tests.s3server import free_port

UNAVAILABLE, BAD_INPUT = ExitCode.UNAVAILABLE, ExitCode.BAD_INPUT
SMALL = ["--model", "espcn", "--patch-size", "48", "-k", "4", "--batch-size", "4", "--shuffle-buffer", "16", "--workers", "1"]


def _raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    """``outer`` as code raises it while handling ``inner`` (``raise outer from None`` keeps the context)."""
    try:
        try:
            raise inner
        except BaseException:
            raise outer from None
    except BaseException as exc:
        return exc


def _client_errors() -> list[tuple[str, BaseException, ExitCode | None]]:
    import aiohttp
    import botocore.exceptions as be
    from s3fs.errors import translate_boto_error

    def client_error(code: str, status: int) -> be.ClientError:
        return be.ClientError(
            {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
        )

    url = "http://127.0.0.1:9/b/k"
    return [
        ("no endpoint", be.EndpointConnectionError(endpoint_url=url), UNAVAILABLE),
        ("connect timeout", be.ConnectTimeoutError(endpoint_url=url), UNAVAILABLE),
        ("read timeout", be.ReadTimeoutError(endpoint_url=url), UNAVAILABLE),
        ("connection closed", be.ConnectionClosedError(endpoint_url=url), UNAVAILABLE),
        ("SlowDown", client_error("SlowDown", 503), UNAVAILABLE),
        ("SlowDown via s3fs", translate_boto_error(client_error("SlowDown", 503)), UNAVAILABLE),
        ("InternalError via s3fs", translate_boto_error(client_error("InternalError", 500)), UNAVAILABLE),
        ("502 via s3fs", translate_boto_error(client_error("BadGateway", 502)), UNAVAILABLE),
        ("429", client_error("TooManyRequests", 429), UNAVAILABLE),
        ("aiohttp disconnect", aiohttp.ServerDisconnectedError(), UNAVAILABLE),
        ("aiohttp 503", aiohttp.ClientResponseError(None, (), status=503), UNAVAILABLE),  # type: ignore[arg-type]
        ("no credentials", be.NoCredentialsError(), BAD_INPUT),
        ("access denied", client_error("AccessDenied", 403), BAD_INPUT),
        ("access denied via s3fs", translate_boto_error(client_error("AccessDenied", 403)), BAD_INPUT),
        ("no such bucket via s3fs", translate_boto_error(client_error("NoSuchBucket", 404)), BAD_INPUT),
        ("aiohttp 403", aiohttp.ClientResponseError(None, (), status=403), BAD_INPUT),  # type: ignore[arg-type]
    ]


def _plain_errors() -> list[tuple[str, BaseException, ExitCode | None]]:
    return [
        ("refused", ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), UNAVAILABLE),
        ("reset", ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), UNAVAILABLE),
        ("timeout", TimeoutError("timed out"), UNAVAILABLE),
        ("DNS", socket.gaierror(socket.EAI_NONAME, "Name or service not known"), UNAVAILABLE),
        ("no route", OSError(errno.EHOSTUNREACH, "No route to host"), UNAVAILABLE),
        ("wrapped", _raised_from(BuildError("writing manifest.json failed"), ConnectionResetError("reset")), UNAVAILABLE),
        ("disk full", OSError(errno.ENOSPC, "No space left on device"), BAD_INPUT),
        ("permission", PermissionError(errno.EACCES, "Permission denied"), BAD_INPUT),
        ("missing file", FileNotFoundError(errno.ENOENT, "No such file"), BAD_INPUT),
        ("bad value", ValueError("patch size 50 is not a multiple of scale 4"), BAD_INPUT),
        ("a bug", RuntimeError("boom"), None),
        ("a bug raised during a retry", _raised_from(KeyError("x"), ValueError("bad")), None),
    ]


CASES = _client_errors() + _plain_errors()


@pytest.mark.parametrize("what,exc,code", CASES, ids=[c[0] for c in CASES])
def test_errors_sort_into_unavailable_bad_input_or_a_crash(what, exc, code):
    assert exit_code_of(exc) == code, (what, exc)
    assert unavailable(exc) == (code is UNAVAILABLE)


def test_a_storage_error_that_gave_up_reaches_the_trainer_from_a_worker_as_unavailable():
    """torch re-raises a DataLoader worker's error from its message: SampleUnavailable survives the trip."""
    from torch._utils import ExceptionWrapper

    from wdsr.errors import SampleError, SampleUnavailable

    for exc, code in [
        (SampleUnavailable("s3://b/ds/shard-000001.tar", None, "gave up reading bytes 0-99 after 2 tries"), UNAVAILABLE),
        (SampleError("shard-000001.tar", "k", "hr.png: sha256 mismatch"), BAD_INPUT),
    ]:
        try:
            raise exc
        except SampleError:
            wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
        with pytest.raises(SampleError) as got:
            wrapped.reraise()
        assert type(got.value) is type(exc) and exit_code_of(got.value) == code


def test_the_pod_exit_is_the_first_root_cause_never_its_peers_exits():
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from wdsr.train.launch import pod_exit_code

    def failures(*codes: int, stamps: tuple[int, ...] = ()) -> dict:
        out = {}
        for rank, code in enumerate(codes):
            f = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="<none>")
            f.timestamp = stamps[rank] if stamps else 1
            out[rank] = f
        return out

    assert pod_exit_code(failures(1, 2)) == BAD_INPUT  # rank 0 lost its peer (1), rank 1 had bad data
    assert pod_exit_code(failures(-15, 69)) == UNAVAILABLE  # torchrun ended rank 0 after rank 1 gave up
    assert pod_exit_code(failures(1, 2, stamps=(1, 2))) == BAD_INPUT  # a peer's exit seen a second earlier
    assert pod_exit_code(failures(69, 2, stamps=(5, 4))) == BAD_INPUT  # two root causes: the first one's
    assert pod_exit_code(failures(2, 69)) == BAD_INPUT  # the same second: the lower rank's
    assert pod_exit_code(failures(1, 3)) == ExitCode.WORKER_DIED
    assert pod_exit_code(failures(75, 75)) == ExitCode.PEER_STOPPED
    assert pod_exit_code(failures(1, -15)) == ExitCode.FAILED
    assert pod_exit_code(failures(-9, 137)) == ExitCode.FAILED


# ---- the command lines ------------------------------------------------------------------------------
def cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    full = {**base, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "AWS_EC2_METADATA_DISABLED": "true", **env}
    return subprocess.run([sys.executable, "-m", *args], env=full, capture_output=True, text=True, timeout=timeout)


def closed_port_env(tmp_path: Path) -> dict[str, str]:
    """An S3 endpoint nobody listens on: a closed port on 127.0.0.1 (never any other address)."""
    return {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_ACCESS_KEY_ID": "k",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }


def test_unreachable_storage_exits_69_in_both_clis_bad_input_stays_2(tmp_path, photo_src):
    dead = closed_port_env(tmp_path)
    run = str(tmp_path / "run")
    cases = [
        (["wdsr", "train", "--data", "s3://bucket/ds", "--out", run, "--check"], dead, UNAVAILABLE),
        (["wdsr", "train", "--data", str(tmp_path / "nope"), "--out", "s3://bucket/run", "--check"], dead, BAD_INPUT),
        (["shardmaker", "build", str(photo_src), "s3://bucket/ds", "--scale", "2", "--part", "1/2"], dead, UNAVAILABLE),
        (["shardmaker", "merge", "s3://bucket/ds"], dead, UNAVAILABLE),
        (["shardmaker", "info", "s3://bucket/ds"], dead, UNAVAILABLE),
    ]
    for args, env, code in cases:
        r = cli(args, env)
        assert r.returncode == code and len(r.stderr.strip().splitlines()) == 1, (args, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr


def test_a_throttling_endpoint_exits_69_refused_credentials_exit_2(s3, s3_photo_shards, tmp_path):
    """The test S3 server behind a proxy that answers every GET 503 SlowDown; then with a wrong secret."""
    proxy = FaultProxy(s3.port)
    try:
        proxy.fail_503(times=1000)
        args = ["wdsr", "train", "--data", s3_photo_shards, "--out", str(tmp_path / "run"), "--check"]
        r = cli(args, s3.env(endpoint=proxy.endpoint) | {"AWS_MAX_ATTEMPTS": "1"})
        assert r.returncode == UNAVAILABLE and proxy.faults >= 1, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
    finally:
        proxy.close()
    r = cli(args, s3.env(secret="not-the-secret") | {"AWS_MAX_ATTEMPTS": "1"})
    assert r.returncode == BAD_INPUT and "Traceback" not in r.stderr, r.stderr[-2000:]


# ---- through torchrun: 2 gloo ranks on 127.0.0.1 ------------------------------------------------------
def launch(train_args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The training container's command: the launcher, torchrun's flags, then `wdsr train`."""
    cmd = [
        sys.executable,
        "-m",
        "wdsr.train.launch",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "--max-restarts=0",
        "-m",
        "wdsr",
        "train",
        *train_args,
    ]
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full)


def bad_sample_copy(photo_shards: Path, dest: Path) -> str:
    """``photo_shards`` with one HR image truncated (its digest and decode fail): a data error mid-run."""
    from shardmaker import format as fmt

    shutil.copytree(photo_shards, dest)
    victim = fmt.load(str(dest)).shards[1].keys[0]
    rewrite(dest, 1, lambda name, data: (name, data[:200]) if name == f"{victim}.hr.png" else (name, data))
    return victim


@pytest.mark.slow
def test_a_rank_with_bad_data_makes_the_pod_exit_2_through_torchrun(photo_shards, tmp_path):
    victim = bad_sample_copy(photo_shards, tmp_path / "bad")
    r = launch(["--data", str(tmp_path / "bad"), "--out", str(tmp_path / "run"), *SMALL, "--steps", "40"])
    assert r.returncode == BAD_INPUT, r.stderr[-4000:]
    assert victim in r.stderr and "this pod exits 2 (bad_input)" in r.stderr.strip().splitlines()[-1], r.stderr[-3000:]


@pytest.mark.slow
def test_storage_that_stays_unavailable_mid_run_makes_the_pod_exit_69_through_torchrun(s3, s3_photo_shards, tmp_path):
    """The manifest reads fine (the pre-flight passes); every GET of one shard is answered 503 SlowDown."""
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({"retry": {"attempts": 2, "backoff_s": 0.01, "max_backoff_s": 0.01}}))
    proxy = FaultProxy(s3.port)
    try:
        proxy.fail_503(times=10**6, match=b"shard-000001.tar")
        args = ["--config", str(config), "--data", s3_photo_shards, "--out", str(tmp_path / "run"), *SMALL, "--steps", "40"]
        r = launch(args, s3.env(endpoint=proxy.endpoint))
    finally:
        proxy.close()
    assert r.returncode == UNAVAILABLE and proxy.faults >= 2, r.stderr[-4000:]
    assert "shard-000001.tar: gave up reading" in r.stderr and "this pod exits 69 (unavailable)" in r.stderr, r.stderr[-3000:]
