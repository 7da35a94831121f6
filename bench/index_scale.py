"""Index scale: ``shardmaker index DIR --hr-only`` over a scale model of a big listing (one tiny PNG's
bytes under N names, 1,000 a folder), on local disk and on the test S3 server; peak RSS above the
process's start (``/proc/self/status``: VmHWM - VmRSS) and files/s, each N in a fresh process. The per-file slope between two
sizes extrapolates the peak to 1M files.

    python -m bench.index_scale --local 5000,20000,100000 --s3 5000,20000 --out /tmp/index_scale
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from tests.s3server import S3Server

BUCKET = "scale"


def tiny_png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def local_model(root: Path, n: int) -> str:
    src = root / f"local-{n}"
    if not src.exists():
        data = tiny_png()
        for i in range(n):
            d, name = src / f"{i // 1000:04d}", f"{i:07d}.png"
            if i % 1000 == 0:
                d.mkdir(parents=True)
                (d / name).write_bytes(data)
                first = d / name
            else:
                os.link(first, d / name)  # one file's bytes under 1,000 names a folder (links per inode are bounded)
    return str(src)


def s3_model(fs, n: int) -> str:
    data, prefix = tiny_png(), f"{BUCKET}/s3-{n}"
    fs.pipe({f"{prefix}/{i // 1000:04d}/{i:07d}.png": data for i in range(n)})
    return f"s3://{prefix}"


def child(src: str, out: str) -> None:
    """One index, in this process: the peak above what the imports took."""
    from shardmaker.indexfiles import FileIndexConfig, index_files

    base = _status_kb("VmRSS")
    t0 = time.perf_counter()
    res = index_files(src, out, FileIndexConfig(hr_only=True, progress=False, overwrite=True))
    secs = time.perf_counter() - t0
    peak = _status_kb("VmHWM")  # this process's own peak (ru_maxrss would carry the forking parent's)
    print(json.dumps({"files": res.manifest.samples, "s": secs, "peak_mb": (peak - base) / 1024}))


def _status_kb(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def run(src: str, out: str, env: dict[str, str]) -> dict:
    code = "import sys; from bench.index_scale import child; child(sys.argv[1], sys.argv[2])"
    got = subprocess.run([sys.executable, "-c", code, src, out], env=env, capture_output=True, text=True, check=True)
    return json.loads(got.stdout.strip().splitlines()[-1])


def table(rows: list[tuple[str, dict]]) -> None:
    print("| where | files | s | files/s | peak RSS MB | KB a file |")
    print("|---|---:|---:|---:|---:|---:|")
    for where, r in rows:
        per = r["peak_mb"] * 1024 / r["files"]
        print(f"| {where} | {r['files']} | {r['s']:.1f} | {r['files'] / r['s']:,.0f} | {r['peak_mb']:.0f} | {per:.2f} |")
    for where in dict(rows):
        got = [r for w, r in rows if w == where]
        if len(got) >= 2:
            a, b = got[0], got[-1]
            slope = (b["peak_mb"] - a["peak_mb"]) * 1024 / (b["files"] - a["files"])
            print(
                f"{where}: {slope:.2f} KB a file between {a['files']} and {b['files']} files -> 1M files: "
                f"~{a['peak_mb'] + slope * (1e6 - a['files']) / 1024:,.0f} MB"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--local", default="5000,20000")
    ap.add_argument("--s3", default="")
    ap.add_argument("--out", default="/tmp/index_scale")
    a = ap.parse_args(argv)
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    rows = []
    for n in [int(x) for x in a.local.split(",") if x]:
        rows.append(("local", run(local_model(root, n), str(root / f"idx-local-{n}"), env)))
    if a.s3:
        server = S3Server(root / "s3").start()
        try:
            import fsspec

            env |= server.env()
            os.environ.update(server.env())
            server.make_bucket(BUCKET)
            fs = fsspec.filesystem("s3", endpoint_url=server.endpoint)
            for n in [int(x) for x in a.s3.split(",") if x]:
                rows.append(("s3", run(s3_model(fs, n), str(root / f"idx-s3-{n}"), env)))
        finally:
            server.stop()
    table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
