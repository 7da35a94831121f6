"""PNG decode: libspng alone (as before) against libdeflate's inflate + libspng's unfilter (what wdsr does).

    .venv/bin/python bench/png_decode.py [--frames 16] [--out bench/out]

The HR and LR PNG members of the first frames of ``stream_bench.py``'s shards (3840 x 2160 RGB
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

import argparse
import statistics
import struct
import sys
import tarfile
import time
import zlib
from pathlib import Path

import deflate
import numpy as np
import pyspng

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream_bench import shards  # noqa: E402

from shardmaker.imaging import codecs  # noqa: E402
from wdsr.loader import tune_malloc  # noqa: E402


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


def ms(f, *args) -> float:
    t0 = time.perf_counter()
    f(*args)
    return (time.perf_counter() - t0) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=16)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    tune_malloc()  # as in every wdsr worker: freed decode buffers are reused, not faulted in again
    url = shards(Path(args.out), 128)["png"]
    print(f"{args.frames} frames of {url}, 3840 x 2160 RGB, x4; ms per member (median), one process\n")
    print("| member | libspng | wdsr: libdeflate + libspng | speed-up | inflate: zlib | inflate: libdeflate | speed-up |")
    print("|---|---|---|---|---|---|---|")
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
        print(f"| {name} | {a:.1f} | {b:.1f} | **{a / b:.2f}x** | {c:.1f} | {d:.1f} | {c / d:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
