"""Tiled 8192 x 8192 samples streamed from S3: by the tiles the patches touch against the whole
member, side by side in one run.

    .venv/bin/python -m bench.tiles_s3_bench [--seconds 20] [--out bench/out]

Six 8192 x 8192 images of real-photo mosaics (``bench.tiles_bench``'s sources) built as QOI with
``--tiles 256`` (~160 MB a sample), uploaded to SeaweedFS (`weed mini`) on 127.0.0.1, streamed
with 1 worker (the server gets the other core), k = 16, HR patch 192, x4, batch 16:

* **tiles by range** (the default for a remote tiled sample over 4 MiB): tar headers, json and
  tile indexes read ahead; the tiles of the sample's 16 patches fetched at once, merged, 4 at a time;
* **whole member** (``ReadConfig.ranged_tiles_over=None``): one range GET per sample, as before;
* **local disk**, for reference (tiled members read by ``pread``).

"S3 bytes/patch" is ``bytes_read`` (the bytes that came from the server; tested equal to what
the server sent) over the patches cut; patches/s are the batches' after a warm-up.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine_line, md_table, parser, report
from bench.tiles_bench import _build, _sources
from shardmaker import format as fmt
from tests.s3server import S3Server
from wdsr import SRDataset, make_loader

K, BATCH, PATCH, SCALE = 16, 16, 192, 4


def _stream(url: str, seconds: float, ranged: bool) -> dict[str, float]:
    """patches/s (1 worker) and what was read per patch, over ``seconds`` after a warm-up."""
    ds = SRDataset(url, scale=SCALE, patch_size=PATCH, patches_per_image=K, batch_size=BATCH, shuffle_buffer=64)
    if not ranged:
        ds.reader.options = dataclasses.replace(ds.reader.options, ranged_tiles_over=None)
    loader = make_loader(ds, num_workers=1, persistent_workers=True)
    warm, n, t0, before = 8, 0, 0.0, ds.stats.totals()
    while True:
        for _ in loader:
            n += 1
            if n == warm:
                t0, before = time.perf_counter(), ds.stats.totals()
            elif n > warm and time.perf_counter() - t0 >= seconds:
                break
        else:
            continue
        break
    dt, after = time.perf_counter() - t0, ds.stats.totals()
    patches = after["patches"] - before["patches"]
    read = after["bytes_read"] - before["bytes_read"]
    return {
        "patches_per_s": (n - warm) * BATCH / dt,
        "bytes_per_patch": read / max(1, patches),
        "mb_per_s": read / 1e6 / dt,
        "retries": after["retries"] - before["retries"],
    }


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=Path("bench/out"))
    args = ap.parse_args()
    local = args.out / "tiles-s3-8k"
    if not (local / "manifest.json").exists() or fmt.load(str(local)).shards[0].tiles is None:
        build_s, _ = _build(_sources(args.out, "tiles-src-8k", 6, (8192, 8192), 6), local, "256")
        print(f"built {local} in {build_s:.0f} s", flush=True)
    m = fmt.load(str(local))
    head = machine_line()
    work = Path(tempfile.mkdtemp(prefix="wdsr-tiles-s3-"))
    server = S3Server(work / "s3").start()
    os.environ.update(server.env())
    try:
        import s3fs

        server.make_bucket("bench")
        t0 = time.perf_counter()
        s3fs.S3FileSystem(skip_instance_cache=True).put(str(local) + "/", "bench/tiles8k/", recursive=True)
        up = time.perf_counter() - t0
        url = "s3://bench/tiles8k"
        runs = [("S3, tiles by range (default)", url, True), ("S3, whole member", url, False), ("local disk", str(local), True)]
        res = {}
        for name, u, ranged in runs:
            res[name] = _stream(u, args.seconds, ranged)
            print(name, res[name], flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    base = res["S3, whole member"]
    rows = [
        (
            name,
            f"{r['patches_per_s']:.0f}",
            f"{r['bytes_per_patch'] / 1e3:,.0f}",
            f"{r['mb_per_s']:.0f}",
            f"**{r['patches_per_s'] / base['patches_per_s']:.1f}x**",
            f"{base['bytes_per_patch'] / max(1.0, r['bytes_per_patch']):.0f}x",
        )
        for name, r in res.items()
    ]
    cols = ["loader", "patches/s", "kB read / patch", "MB/s read", "patches/s vs whole", "fewer bytes than whole"]
    text = (
        f"`.venv/bin/python -m bench.tiles_s3_bench --seconds {args.seconds:.0f}`: {head}; S3 server: {server.kind} on "
        f"127.0.0.1 (same machine); {m.samples} samples of 8192 x 8192, QOI, --tiles 256, {m.bytes / m.samples / 1e6:.0f} MB "
        f"each (uploaded in {up:.0f} s); 1 worker, k={K}, HR patch {PATCH}, x{SCALE}, batch {BATCH}; {args.seconds:.0f} s "
        "per loader after warm-up\n\n" + md_table(cols, rows)
    )
    report(args.out, "tiles_s3_bench", text, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
