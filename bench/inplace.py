"""Images in place (``shardmaker index DIR --lr DIR``) against the same images as PNG and QOI shards.

    .venv/bin/python -m bench.inplace [--frames 128] [--seconds 15] [--rounds 1] [--out bench/out]

The 4K frames of ``bench.stream_bench``: the HR and x4 LR members of its PNG shards written out as
plain files (``inplace-src/hr/f000.png``, ``inplace-src/lr/f000x4.png``: the very bytes the PNG shards
hold, so in place and PNG shards decode the same data), indexed with ``shardmaker index`` (timed,
from the page cache), then in place, PNG shards and QOI shards streamed one after the other (HR patch
192, batch 16, 2 workers) at k=16 and k=64, for ``--rounds`` rounds (the order rotated each round):
patches/s and the time from making the loader to its first batch; ratios of the medians over the rounds.
Local disk, page cache warm.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from bench.common import loader_table, machine_line, parser, report, shards
from shardmaker import format as fmt
from shardmaker import storage
from shardmaker.indexfiles import FileIndexConfig, index_files
from wdsr.tools.bench import bench_stream


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


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    head = machine_line()
    work = Path(args.out)
    ours = shards(work, args.frames)
    src = files_of(ours["png"], work / "inplace-src")
    os.sync()
    t0 = time.perf_counter()
    cfg = FileIndexConfig(lr=(str(src / "lr"),), overwrite=True, progress=False)
    res = index_files(str(src / "hr"), str(work / "inplace-idx"), cfg)
    t_index = time.perf_counter() - t0
    gb = res.manifest.bytes / 1e9
    sets = {"in place (PNG files)": str(work / "inplace-idx"), "PNG shards": ours["png"], "QOI shards": ours["qoi"]}
    lines = [
        f"{head}; {args.frames} 4K frames, HR patch 192, x4, batch 16, 2 workers, local disk (page cache warm); "
        f"{args.seconds:.0f} s per run after warm-up, {args.rounds} round(s):",
        "",
        f"`shardmaker index` (HR + x4 LR files, xxh3_64 of every file): {res.manifest.samples} pairs, {gb:.2f} GB "
        f"in {t_index:.1f} s ({res.manifest.samples / t_index:.0f} pairs/s, {gb * 1e3 / t_index:.0f} MB/s).",
        "",
    ]
    summary = []
    for k in (16, 64):
        kw = dict(workers=2, batch_size=16, patch_size=192, scale=4, patches_per_image=k, seconds=args.seconds)
        bench_stream(ours["png"], name="warm-up", **{**kw, "seconds": 3.0})
        order = list(sets.items())
        runs = []
        for r in range(args.rounds):
            turn = order[r % len(order) :] + order[: r % len(order)]  # rotated: no loader always runs first
            runs += [bench_stream(url, name=f"{name}, k={k}, round {r + 1}", **kw) for name, url in turn]
        rate = {name: statistics.median(x.patches_per_s for x in runs if x.name.startswith(name)) for name in sets}
        lines += [
            loader_table(runs, ("patches/s", "first batch", "MB/s", "decode ms", "of ceiling")),
            "",
            f"- k={k}, medians: in place / PNG shards **{rate['in place (PNG files)'] / rate['PNG shards'] * 100:.1f}%**, "
            f"in place / QOI shards {rate['in place (PNG files)'] / rate['QOI shards'] * 100:.1f}%",
            "",
        ]
        summary.append({"k": k, "rates": rate, "index_s": t_index, "gb": gb})
    report(work, "inplace", "\n".join(lines), summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
