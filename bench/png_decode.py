"""PNG decode: libspng alone (as before) against libdeflate's inflate + libspng's unfilter (what wdsr does).

    .venv/bin/python -m bench.png_decode [--frames 16] [--out bench/out]

The HR and LR PNG members of the first frames of ``bench.stream_bench``'s shards (3840 x 2160 RGB
photos, x4; our writer: filter Average, deflate level 1), one process, one thread, with glibc's
malloc tuned as in every wdsr worker (``wdsr.loader.tune_malloc``), each member decoded by both
paths in turn (interleaved, so both see the same machine):

* **libspng** (``pyspng.load`` on the member): zlib inflates, libspng unfilters;
* **wdsr** (``shardmaker.imaging.codecs.decode``): libdeflate inflates the image data, which goes back to
  libspng in stored (uncompressed) deflate blocks, so libspng only unfilters it.

Also the inflate alone, zlib against libdeflate, which is where the difference comes from. Both
paths give the same pixels (checked on every member here, and in ``tests/test_codecs.py``).
"""

from __future__ import annotations

import statistics
import struct
import sys
import tarfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import deflate
import numpy as np
import pyspng

from bench.common import machine_line, md_table, parser, report, shards
from shardmaker.imaging import codecs
from wdsr.loader import tune_malloc


def members(url: str, frames: int) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {"hr.png": [], "lr_x4.png": []}
    for shard in sorted(Path(url).glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar:
                for name, got in out.items():
                    if m.name.endswith("." + name) and len(got) < frames:
                        got.append(tar.extractfile(m).read())
        if all(len(got) == frames for got in out.values()):
            break
    return out


def idat(png: bytes) -> tuple[bytes, int]:
    """The zlib stream of our writer's PNG (one IDAT) and its inflated size."""
    w, h, depth, ctype = struct.unpack(">IIBB", png[16:26])
    (n,) = struct.unpack(">I", png[33:37])
    assert png[37:41] == b"IDAT"
    return png[41 : 41 + n], h * (1 + w * (1 if ctype == 0 else 3) * depth // 8)


def ms(f: Callable[..., object], *args: object) -> float:
    t0 = time.perf_counter()
    f(*args)
    return (time.perf_counter() - t0) * 1e3


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    line = machine_line()
    tune_malloc()  # as in every wdsr worker: freed decode buffers are reused, not faulted in again
    url = shards(Path(args.out), 128)["png"]
    rows = []
    for name, datas in members(url, args.frames).items():
        spng, ours, zin, din = [], [], [], []
        for rep in range(3):
            for data in datas:
                stream, n = idat(data)
                if rep == 0:
                    assert np.array_equal(codecs.decode(data, name), pyspng.load(data))
                spng.append(ms(pyspng.load, data))
                ours.append(ms(codecs.decode, data, name))
                zin.append(ms(zlib.decompress, stream, zlib.MAX_WBITS, n))
                din.append(ms(deflate.zlib_decompress, stream, n))
        a, b, c, d = (statistics.median(x) for x in (spng, ours, zin, din))
        rows.append((name, f"{a:.1f}", f"{b:.1f}", f"**{a / b:.2f}x**", f"{c:.1f}", f"{d:.1f}", f"{c / d:.2f}x"))
    head = ["member", "libspng", "wdsr: libdeflate + libspng", "speed-up", "inflate: zlib", "inflate: libdeflate", "speed-up"]
    report(
        Path(args.out),
        "png_decode",
        f"{line}; {args.frames} frames of {url}, 3840 x 2160 RGB, x4; "
        f"ms per member (median), one process:\n\n" + md_table(head, rows),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
