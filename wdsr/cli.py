"""``wdsr`` command line: ``bench`` and ``preview``. Parsing only; the work is in bench.py/preview.py."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wdsr", description="Stream aligned SR patch batches from wdsr-shards/1 datasets.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    b = sub.add_parser("bench", help="measure patches/s, MB/s read, decode share and memory per worker",
                       description="Stream a dataset for --seconds and print a table (after a short warm-up). "
                       "--compare-naive also runs the decode-per-patch map-style Dataset on the same shards.")
    b.add_argument("url", metavar="URL")
    b.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    b.add_argument("--batch-size", type=int, default=16, help="patches per batch (default 16)")
    b.add_argument("--patches-per-image", "-k", type=int, default=16, help="patches cut per decoded pair (default 16)")
    b.add_argument("--patch-size", type=int, default=192, help="HR patch side, a multiple of --scale (default 192)")
    b.add_argument("--scale", type=int, default=4, help="which LR (default 4)")
    b.add_argument("--seconds", type=float, default=20.0, help="measuring time per loader (default 20)")
    b.add_argument("--shuffle-buffer", type=int, default=256, help="patches in each worker's shuffle buffer (default 256)")
    b.add_argument("--verify", choices=["none", "xxh3_64", "sha256"], default="xxh3_64",
                   help="check image members against their digests in {key}.json before decoding (default xxh3_64)")
    b.add_argument("--compare-naive", action="store_true", help="also run the decode-per-patch baseline; print the ratio")
    b.add_argument("--compare", metavar="URL2", help="also stream URL2 (e.g. the same shards in S3) right after URL, "
                   "same settings; print URL2 / URL")
    b.add_argument("--read-ahead", type=int, default=1, help="remote: samples fetched while one decodes (default 1; 0 = off)")
    b.add_argument("--fetch", choices=["ranges", "fsspec"], default="ranges",
                   help="remote: our resilient range reads (default) or an fsspec file with its read-ahead block cache")
    b.add_argument("--cache-dir", help="remote: keep whole shards in this local folder (LRU); the table shows the hit rate")
    b.add_argument("--cache-limit", type=float, help="remote: cache size limit in GB (default: no limit)")
    b.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    v = sub.add_parser("preview", help="write a contact sheet of LR (nearest-upscaled) | HR patch pairs",
                       description="Draw patches as the training loop sees them (augmented), LR left of its HR.")
    v.add_argument("url", metavar="URL")
    v.add_argument("-o", "--output", required=True, help="PNG file to write (local path or fsspec URL)")
    v.add_argument("--scale", type=int, default=4)
    v.add_argument("--patch-size", type=int, default=128)
    v.add_argument("-n", "--count", type=int, default=8, help="patch pairs to draw (default 8)")
    v.add_argument("--seed", type=int, default=0)
    return p


def _bench(args: argparse.Namespace) -> int:
    from wdsr.bench import bench_naive, bench_stream, table

    kw = dict(workers=args.workers, batch_size=args.batch_size, patch_size=args.patch_size, scale=args.scale,
              seconds=args.seconds)
    read = dict(read_ahead=args.read_ahead, fetch=args.fetch, cache_dir=args.cache_dir,
                cache_limit=int(args.cache_limit * 1e9) if args.cache_limit else None)
    stream = dict(k=args.patches_per_image, verify=args.verify, shuffle_buffer=args.shuffle_buffer, **read, **kw)
    results = [bench_stream(args.url, name=f"wdsr k={args.patches_per_image}: {args.url}", **stream)]
    if args.compare:
        results.append(bench_stream(args.compare, name=f"wdsr k={args.patches_per_image}: {args.compare}", **stream))
    if args.compare_naive:
        results.append(bench_naive(args.url, decoder="pillow", **kw))
        results.append(bench_naive(args.url, decoder="same", **kw))
    print(f"{args.url}: x{args.scale}, HR patch {args.patch_size}, batch {args.batch_size}, {args.workers} workers")
    print(table(results, args.patches_per_image))
    if args.compare:
        print(f"{args.compare} / {args.url}: {results[1].patches_per_s / results[0].patches_per_s * 100:.1f}% of the patches/s")
    if args.compare_naive:
        ours, pil, same = results[0], results[-2], results[-1]
        print(f"wdsr / naive: {ours.patches_per_s / pil.patches_per_s:.1f}x (naive with Pillow), "
              f"{ours.patches_per_s / same.patches_per_s:.1f}x (naive with wdsr's decoders)")
    if args.json:
        import dataclasses

        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) | {"efficiency": r.efficiency} for r in results], f, indent=1)
    return 0


def _preview(args: argparse.Namespace) -> int:
    from wdsr.dataset import SRDataset
    from wdsr.preview import contact_sheet, write_png

    ds = SRDataset(args.url, scale=args.scale, patch_size=args.patch_size, patches_per_image=2, batch_size=args.count,
                   shuffle_buffer=64, seed=args.seed)
    sheet = contact_sheet(ds, args.count)
    write_png(args.output, sheet)
    print(f"wrote {args.output}: {args.count} LR|HR pairs, {sheet.shape[1]}x{sheet.shape[0]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="wdsr: %(message)s")
    try:
        return _bench(args) if args.cmd == "bench" else _preview(args)
    except (ValueError, OSError) as exc:
        print(f"wdsr {args.cmd}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
