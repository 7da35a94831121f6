"""Images in place (``shardmaker index DIR --lr DIR``) against PNG/QOI shards and LitData's raw path.

    .venv/bin/python -m bench.inplace [--frames 24] [--seconds 6] [--rounds 3] [--out bench/out] [--no-s3]
                                      [--first-byte-ms 30] [--quick]

The 4K frames of ``bench.stream_bench``: the HR and x4 LR members of its PNG shards written out as
plain files (``inplace-src/hr/f000.png``, ``inplace-src/lr/f000x4.png``: the very bytes the PNG shards
hold, so every arm decodes the same data), indexed with ``shardmaker index`` (timed). The arms (HR
patch 192, batch 16, 2 workers): in place, PNG shards and QOI shards at k=16 and k=64 patches per
decode, and LitData's ``StreamingRawDataset`` over the same files with a PairedImageDataset-style
transform (one patch per decode: ``bench.litdata_arm``; left out when litdata is not installed); then,
unless ``--no-s3``, the same from the SeaweedFS test server on 127.0.0.1 (files uploaded, an index of
the ``s3://`` prefix, PNG shards uploaded), and small files (48 pairs of 640x360, a few ms to decode)
in place and as PNG shards from that server through ``tests/faultproxy.py`` holding every GET's
first byte ``--first-byte-ms`` (a distant store's latency; 0: not run). Every round runs every arm
once, the order rotated each round (no arm always runs first or after the same neighbour); the table
gives the median and the range over the rounds. ``--quick``: 4 small frames, one short round, local
only (tests/test_bench_inplace.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from bench.common import machine_line, parser, report, seconds_of, shards, warm_page_cache
from bench.inplace_report import ratios, table
from shardmaker import format as fmt
from shardmaker import storage
from shardmaker.imaging import codecs
from shardmaker.indexfiles import FileIndexConfig, index_files
from tests.faultproxy import FaultProxy
from tests.s3server import S3Server
from wdsr.tools.bench import BenchResult, bench_stream

try:  # a bench extra: pip install 'wdsr[bench]' (litdata and the zstd its raw path needs)
    from bench import litdata_arm
except ImportError:
    litdata_arm = None  # type: ignore[assignment]

log = logging.getLogger("bench.inplace")
SMALL = (640, 360)


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str  # "in place (PNG files), k=16"
    where: str  # "local disk" | "S3"
    run: Callable[[float], BenchResult]  # seconds -> one measured run

    @property
    def key(self) -> str:
        return f"{self.where}: {self.name}"


def files_of(png_shards: str, out: Path) -> Path:
    """The PNG shards' HR and x4 LR members as files under ``out/hr`` and ``out/lr`` (made once)."""
    m = fmt.load(png_shards)
    if (out / "hr").is_dir() and len(list((out / "hr").glob("*.png"))) == m.samples:
        return out
    (out / "hr").mkdir(parents=True, exist_ok=True)
    (out / "lr").mkdir(parents=True, exist_ok=True)
    for info in m.shards:
        with storage.open_regular(str(Path(png_shards) / info.name)) as f:
            for key, _, members in fmt.iter_samples(f):
                (out / "hr" / f"{key}.png").write_bytes(members[fmt.hr_member("png")])
                (out / "lr" / f"{key}x4.png").write_bytes(members[fmt.lr_member(4, "png")])
    return out


def ours(name: str, where: str, url: str, k: int, storage_options: dict[str, Any] | None = None) -> Arm:
    kw = dict(workers=2, batch_size=16, patch_size=192, scale=4, patches_per_image=k, storage_options=storage_options)
    return Arm(f"{name}, k={k}", where, lambda s: bench_stream(url, name=f"{name}, k={k}", seconds=s, **kw))


def litdata(where: str, url: str, cache: Path) -> Arm:
    assert litdata_arm is not None
    name = "LitData StreamingRawDataset, 1 patch/decode"
    return Arm(name, where, lambda s: litdata_arm.bench_litdata(url, cache, name=name, seconds=s))


def index(hr: str, lr: str, out: Path) -> tuple[str, float, float]:
    """``shardmaker index HR --lr LR -o OUT``: (index path, seconds, GB indexed)."""
    t0 = time.perf_counter()
    res = index_files(hr, str(out), FileIndexConfig(lr=(lr,), overwrite=True, progress=False))
    return str(out), time.perf_counter() - t0, res.manifest.bytes / 1e9


def decoders(src: Path) -> str:
    """One HR + LR pair decoded in this process: OpenCV (BasicSR, the LitData arm) against wdsr's decoder."""
    data = [storage.read_local(str(p)) for p in (src / "hr" / "f000.png", src / "lr" / "f000x4.png")]

    def ms(fn: Callable[[bytes], object]) -> float:
        fn(data[0])
        return statistics.median(seconds_of(lambda: [fn(d) for d in data]) for _ in range(5)) * 1e3

    cv = ms(lambda b: cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR))
    ours_ms = ms(lambda b: codecs.decode(b, "png"))
    return f"one pair decoded in one process, median of 5: OpenCV {cv:.0f} ms, wdsr {ours_ms:.0f} ms ({cv / ours_ms:.2f}x)"


def run_rounds(arms: Sequence[Arm], rounds: int, seconds: float) -> dict[str, list[BenchResult]]:
    """Every arm once per round, the order rotated by one each round: {arm name: results}."""
    runs: dict[str, list[BenchResult]] = {a.key: [] for a in arms}
    for r in range(rounds):
        shift = r % len(arms)
        for arm in [*arms[shift:], *arms[:shift]]:
            res = arm.run(seconds)
            runs[arm.key].append(res)
            log.info("round %d, %s, %s: %.1f patches/s", r + 1, arm.where, arm.name, res.patches_per_s)
    return runs


def s3_arms(server: S3Server, work: Path, src: Path, png: str, ks: Sequence[int]) -> tuple[list[Arm], list[str]]:
    """Upload the files and the PNG shards, index the ``s3://`` prefix: the S3 arms and notes."""
    import s3fs

    server.make_bucket("bench")
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for sub in ("hr", "lr"):
        fs.put(f"{src / sub}/", f"bench/src/{sub}/", recursive=True)
    fs.put(f"{png}/", "bench/png/", recursive=True)
    idx, t, gb = index("s3://bench/src/hr", "s3://bench/src/lr", work / "inplace-idx-s3")
    notes = [f"`shardmaker index s3://bench/src/hr --lr s3://bench/src/lr` (xxh3_64 of every object): {gb:.2f} GB in {t:.1f} s."]
    arms = [a for k in ks for a in (ours("in place (PNG files)", "S3", idx, k), ours("PNG shards", "S3", "s3://bench/png", k))]
    if litdata_arm is not None:
        probe = litdata("S3", "s3://bench/src", work / "litdata-cache-s3")
        try:
            probe.run(1.0)
            arms.append(probe)
        except Exception as exc:  # noqa: BLE001 - said in the table's notes, the other arms still run
            why = next((ln.strip() for ln in str(exc).splitlines() if "rror:" in ln), str(exc).splitlines()[0])
            notes.append(f"LitData from `s3://` failed against this endpoint ({server.endpoint}): {why}")
    return arms, notes


def small_arms(server: S3Server, work: Path, first_byte_ms: float) -> tuple[list[Arm], list[str], FaultProxy]:
    """Small files (48 PNG pairs of 640x360, a few ms to decode) from S3 through a proxy that holds every
    GET's first byte ``first_byte_ms``: one GET per file against range reads of shards."""
    import s3fs

    built = shards(work, 48, SMALL)
    src = files_of(built["png"], work / "inplace-src-small")
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for sub in ("hr", "lr"):
        fs.put(f"{src / sub}/", f"bench/small/{sub}/", recursive=True)
    fs.put(f"{built['png']}/", "bench/small-png/", recursive=True)
    idx, _, _ = index("s3://bench/small/hr", "s3://bench/small/lr", work / "inplace-idx-small")
    proxy = FaultProxy(server.port)
    proxy.first_byte_s = first_byte_ms / 1e3
    where, opts = f"S3 + {first_byte_ms:g} ms first byte, 640x360", {"endpoint_url": proxy.endpoint}
    arms = [ours("in place (PNG files)", where, idx, 16, opts), ours("PNG shards", where, "s3://bench/small-png", 16, opts)]
    return arms, [f"{where}: 48 pairs, every GET's response held {first_byte_ms:g} ms by tests/faultproxy.py."], proxy


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--frames", type=int, default=24)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument(
        "--s3", action=argparse.BooleanOptionalAction, default=None, help="the S3 arms (default: on; off with --quick)"
    )
    ap.add_argument("--first-byte-ms", type=float, default=30.0, help="latency of the small-file S3 arms (0: none)")
    ap.add_argument("--quick", action="store_true", help="4 small frames, one short round, local only: that it runs")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    size = (768, 512) if args.quick else (3840, 2160)
    frames, seconds, rounds = (4, 0.2, 1) if args.quick else (args.frames, args.seconds, args.rounds)
    ks = (16,) if args.quick else (16, 64)
    head = machine_line()
    work = Path(args.out)
    built = shards(work, frames, size)
    src = files_of(built["png"], work / f"inplace-src{'-quick' if args.quick else ''}")
    idx, t_index, gb = index(str(src / "hr"), str(src / "lr"), work / "inplace-idx")
    warm_page_cache([p for d in (src / "hr", src / "lr", Path(built["png"]), Path(built["qoi"])) for p in d.iterdir()])
    arms = [
        a
        for k in ks
        for a in (
            ours("in place (PNG files)", "local disk", idx, k),
            ours("PNG shards", "local disk", built["png"], k),
            ours("QOI shards", "local disk", built["qoi"], k),
        )
    ]
    notes = [f"`shardmaker index` (HR + x4 LR files, xxh3_64 of every file): {frames} pairs, {gb:.2f} GB in {t_index:.1f} s."]
    if litdata_arm is not None:
        arms.append(litdata("local disk", str(src), work / "litdata-cache"))
    else:
        notes.append("LitData left out: `litdata` (and `zstd`) not importable (pip install 'wdsr[bench]').")
    server, proxy = None, None
    try:
        if args.s3 if args.s3 is not None else not args.quick:
            server = S3Server(Path(tempfile.mkdtemp(prefix="wdsr-inplace-s3-"))).start()
            os.environ.update(server.env())
            more, s3_notes = s3_arms(server, work, src, built["png"], ks)
            arms += more
            notes += s3_notes
            if args.first_byte_ms > 0:
                more, s3_notes, proxy = small_arms(server, work, args.first_byte_ms)
                arms += more
                notes += s3_notes
        for a in arms:  # warm-up: imports, page cache, LitData's listing cache
            a.run(min(seconds, 1.0))
        runs = run_rounds(arms, rounds, seconds)
    finally:
        if proxy is not None:
            notes.append(f"The proxy forwarded {proxy.gets} GETs (so those arms went through it).")
            proxy.close()
        if server is not None:
            server.stop()
    one, five, _ = os.getloadavg()
    lines = [
        f"{head}; {frames} frames of {size[0]}x{size[1]}, HR patch 192, x4, batch 16, 2 workers; "
        f"{seconds:g} s per run after warm-up, {rounds} round(s), every arm once per round in rotated order; "
        f"load {one:.2f} / {five:.2f} at the end",
        "",
        *notes,
        "",
        decoders(src),
        "",
        table(runs),
        "",
        *ratios(runs, ks),
    ]
    report(work, "inplace", "\n".join(lines), runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
