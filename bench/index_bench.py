"""wdsr on foreign shards indexed in place (``shardmaker index``) vs the same data in our own format.

    .venv/bin/python -m bench.index_bench [--frames 128] [--seconds 15] [--rounds 2] [--out bench/out]

The 128 4K frames of ``bench.stream_bench`` (PNG and QOI, x4). Each of our shards is rewritten the way
another tool would write it: ``wds.ShardWriter`` with members ``{key}.x4.<codec>`` (LR first), a
caption ``{key}.txt`` and ``{key}.<codec>`` (HR), PAX headers, the same samples per shard. That copy is
indexed with ``shardmaker index`` (timed), then both are streamed side by side (HR patch 192, batch 16,
k=16, 2 workers), alternating ours / foreign for ``--rounds`` rounds; the ratio is foreign / ours of the
mean patches/s, per codec.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import webdataset as wds

from bench.common import loader_table, machine_line, parser, report, shards
from shardmaker import format as fmt
from shardmaker.index import IndexConfig, index
from wdsr.tools.bench import bench_stream


def foreign_copy(ours: str, out: Path) -> Path:
    """Our shards rewritten by wds.ShardWriter with another tool's member names and order."""
    m = fmt.load(ours)
    codec = m.codec
    if (out / "part-000000.tar").exists() and len(list(out.glob("part-*.tar"))) == len(m.shards):
        return out
    out.mkdir(parents=True, exist_ok=True)
    per_shard = max(s.samples for s in m.shards)
    with wds.ShardWriter(str(out / "part-%06d.tar"), maxcount=per_shard, maxsize=1 << 40, verbose=0) as sink:
        for info in m.shards:
            with open(Path(ours) / info.name, "rb") as f:
                for key, _, members in fmt.iter_samples(f):
                    sink.write(
                        {
                            "__key__": f"frames/{key}.v1",  # a key with a dot, as other tools write them
                            f"x4.{codec}": members[fmt.lr_member(4, codec)],
                            "txt": b"a 4K frame",
                            codec: members[fmt.hr_member(codec)],
                        }
                    )
    return out


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--frames", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="bench/out")
    args = ap.parse_args()
    head = machine_line()
    work = Path(args.out)
    ours = shards(work, args.frames)
    lines = [
        f"{head}; {args.frames} 4K frames, HR patch 192, x4, batch 16, k=16, 2 workers; {args.seconds:.0f} s per run, "
        f"ours and foreign alternating, {args.rounds} rounds:",
        "",
    ]
    summary = []
    for codec in ("png", "qoi"):
        folder = foreign_copy(ours[codec], work / f"foreign-{codec}")
        os.sync()
        t0 = time.perf_counter()
        res = index(str(folder), None, IndexConfig(hr=codec, lr={4: f"x4.{codec}"}, overwrite=True, progress=False))
        t_index = time.perf_counter() - t0
        gb = res.manifest.bytes / 1e9
        kw = dict(workers=2, batch_size=16, patch_size=192, scale=4, patches_per_image=16, seconds=args.seconds)
        bench_stream(ours[codec], name="warm-up", **{**kw, "seconds": 5.0})
        runs = []
        for r in range(args.rounds):
            runs.append(bench_stream(ours[codec], name=f"{codec.upper()} ours, round {r + 1}", **kw))
            runs.append(bench_stream(str(folder), name=f"{codec.upper()} foreign (indexed), round {r + 1}", **kw))
        mine = [x.patches_per_s for x in runs if "ours" in x.name]
        theirs = [x.patches_per_s for x in runs if "foreign" in x.name]
        ratio = (sum(theirs) / len(theirs)) / (sum(mine) / len(mine))
        lines += [
            f"{codec.upper()}: `shardmaker index` read {gb:.2f} GB in {t_index:.1f} s ({gb * 1e3 / t_index:.0f} MB/s, "
            f"{len(res.manifest.shards)} shards, 4 at a time):",
            "",
            loader_table(runs, ("patches/s", "MB/s", "decode ms", "ms/patch", "of ceiling", "private")),
            "",
            f"- foreign / ours ({codec.upper()}): **{ratio * 100:.1f}%** (mean of {args.rounds} runs each)",
            "",
        ]
        summary.append({"codec": codec, "ratio": ratio, "ours": mine, "foreign": theirs, "index_s": t_index, "gb": gb})
    report(work, "index_bench", "\n".join(lines), summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
