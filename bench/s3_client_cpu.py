"""CPU per MB of S3 range reads, client and server, on 30 reads of one 20 MB object.

    .venv/bin/python -m bench.s3_client_cpu [--out bench/out]

Starts SeaweedFS on 127.0.0.1 and compares wdsr's range reader (presigned GETs over http.client)
with streaming the same range through s3fs/aiohttp. Client CPU is this process's; server CPU is
the `weed` process's, from /proc.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import fsspec
import s3fs

import wdsr
from bench.common import machine_line, md_table, parser, report
from tests.s3server import S3Server
from wdsr.store import remote

SIZE = 20 << 20


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    head = machine_line()
    rows = []
    work = Path(tempfile.mkdtemp(prefix="wdsr-cpu-"))
    server = S3Server(work / "s3").start()
    try:
        os.environ.update(server.env())
        server.make_bucket("cpu")
        s3fs.S3FileSystem(skip_instance_cache=True).pipe("cpu/x.bin", os.urandom(SIZE))
        retry = wdsr.Retry()
        fs = s3fs.S3FileSystem(**remote.s3_defaults({}, retry), skip_instance_cache=True)
        remote.one_try(fs, {})
        rf = remote.RemoteFile(fs, "cpu/x.bin", "s3://cpu/x.bin", retry)

        def aiohttp_stream() -> None:
            buf, got = bytearray(SIZE), [0]
            fsspec.asyn.sync(fs.loop, rf._s3_stream, buf, 0, got)

        for name, fn in (
            ("wdsr RemoteFile.read (presigned GET, http.client)", lambda: rf.read(0, SIZE)),
            ("s3fs/aiohttp streamed body", aiohttp_stream),
        ):
            fn()
            w0, c0, t0 = server.cpu_seconds(), time.process_time(), time.perf_counter()
            for _ in range(30):
                fn()
            mb = 30 * SIZE / 1e6
            dt, c, w = time.perf_counter() - t0, time.process_time() - c0, server.cpu_seconds() - w0
            rows.append((name, f"{mb / dt:.0f}", f"**{c / mb * 1000:.2f}**", f"{w / mb * 1000:.2f}"))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(
        Path(args.out),
        "s3_client_cpu",
        f"{head}; 30 reads of one 20 MB object from SeaweedFS on 127.0.0.1:\n\n"
        + md_table(["client", "MB/s", "client CPU, ms/MB", "server CPU, ms/MB"], rows),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
