"""``shardmaker`` command line: parsing only; the work lives in builder/, index.py, indexfiles.py, verify.py and peek.py."""

from __future__ import annotations

import argparse
import collections
import logging
import os
import posixpath
import re
import signal
import sys
from typing import Any

from shardmaker.builder import BuildConfig, build, merge_when_ready
from shardmaker.builder.clips import DEFAULT_MAX_SPAN, DEFAULT_SEGMENT, ClipOptions
from shardmaker.builder.fromindex import load_files_index
from shardmaker.builder.regions import DEFAULT_REGION
from shardmaker.builder.sample import LrMethod, SampleConfig
from shardmaker.commandline import OneLineParser, configure_logging, error_exit, parse_args, parse_part, parse_scales, parse_size
from shardmaker.errors import OnError, ShardmakerError, brief
from shardmaker.imaging.codecs import Codec
from shardmaker.imaging.resize import ResizeMethod
from shardmaker.index import IndexConfig, index
from shardmaker.indexfiles import FileIndexConfig, index_files
from shardmaker.peek import cat, ls_lines
from shardmaker.verify import info_text, verify
from shardmaker.version import __version__

log = logging.getLogger("shardmaker")


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="shardmaker",
        description="Pack HR/LR super-resolution image pairs into deterministic WebDataset tar shards "
        "(format wdsr-shards/1) with a manifest of samples, byte offsets and sha256 hashes.",
    )
    p.add_argument("--version", action="version", version=f"shardmaker {__version__}")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars, warnings and errors only")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    _build_parser(sub)
    _merge_parser(sub)
    _index_parser(sub)
    _check_parsers(sub)
    _peek_parsers(sub)
    return p


def _build_parser(sub: Any) -> None:
    """``build``: what goes in (sources, LR, codec); :func:`_build_run_args` adds how it runs."""
    b = sub.add_parser(
        "build",
        help="build shards from a folder of HR images",
        description="Build shards from HR_SRC (PNG/JPEG/TIFF/BMP/WebP, 8/16-bit, grey/RGB) into OUT "
        "(a folder or fsspec URL). LR images come from --lr folders, or are made with "
        "MATLAB-exact bicubic (imresize) at --scale.",
    )
    b.add_argument(
        "hr_src",
        metavar="HR_SRC",
        nargs="*",
        help="folder of HR images (searched recursively; symbolic links are "
        "followed, also out of the folder; FIFOs and other non-regular files are skipped with a warning); "
        "or several folders, or brace patterns of files ('photos/{0001..0800}.png'): then each key starts "
        "with its source's path below their common folder (DIV2K/0001, Flickr2K/000001)",
    )
    b.add_argument("out", metavar="OUT", help="output folder or URL (memory://, s3://bucket/prefix, ...)")
    b.add_argument(
        "--from",
        dest="from_index",
        default=None,
        metavar="IDX",
        help="build from an index of image files (shardmaker index DIR ...) instead of HR_SRC: the shards a build from "
        "its folders writes (its LR if it has one), each file checked against the index first",
    )
    b.add_argument(
        "--lr",
        action="append",
        default=[],
        metavar="SRC",
        help="folder of provided LR images, one per scale (repeatable); pairs by relative name, "
        "or name + 'x<scale>' (babyx4.png), or as --lr-pattern says; the scale is read from the size ratio",
    )
    b.add_argument(
        "--lr-pattern",
        default=None,
        metavar="PATTERN",
        help="the LR file names of --lr folders, without extension, from the HR name {stem} and the scale {s}: "
        "'{stem}_LRBI_x{s}' (RCAN), '{stem}_SRF_{s}_LR' (Urban100), '{stem}_LR'; {s} must agree with the size ratio",
    )
    b.add_argument(
        "--scale", type=parse_scales, default=None, help="scales to generate without --lr, e.g. 4 or 2,3,4 (default 4)"
    )
    b.add_argument(
        "--lr-method",
        choices=[m.value for m in ResizeMethod],
        default=ResizeMethod.MATLAB.value,
        help="matlab (default): imresize on im2double input, rounded once (BasicSR); matlab-uint8: "
        "imresize on uint8 input, rounded after each pass (Set5/Set14/RCAN test sets)",
    )
    b.add_argument(
        "--hr-only",
        action="store_true",
        help="store HR images alone, no LR: SRDataset(..., lr='bicubic') then makes each LR patch MATLAB-exactly, "
        "at any integer scale (lr_method none in the manifest)",
    )
    b.add_argument(
        "--codec",
        choices=[c.value for c in Codec],
        default=Codec.PNG.value,
        help="png (default): 8/16-bit, grey/RGB; qoi: 8-bit RGB only, ~1.8x faster to decode, ~25%% larger",
    )
    b.add_argument(
        "--tiles",
        type=_tiles,
        default="off",
        metavar="auto|off|N",
        help="store large images as tiles that a patch decodes only a few of (docs/format.md): auto tiles images "
        "over 8 Mpx with the smallest side >= 256 every scale divides (256 for x2/x4, 264 with x3); N: that side "
        "in HR pixels; off (default): whole images",
    )
    _build_layout_args(b)
    b.add_argument(
        "--png-level",
        type=int,
        default=1,
        choices=range(10),
        metavar="0-9",
        help="zlib level (default 1: run-length deflate, ~5x faster to encode than level 6)",
    )
    b.add_argument(
        "--shard-size",
        type=parse_size,
        default=parse_size("256MB"),
        help="start a new shard past this size (default 256MB; units kB, MB, GB, KiB, MiB, GiB)",
    )
    _build_run_args(b)


def _build_layout_args(b: argparse.ArgumentParser) -> None:
    """What a sample is: a region of a large image (``--region``, ``--min-valid``) or a clip segment (``--clips``)."""
    b.add_argument(
        "--region",
        type=int,
        default=DEFAULT_REGION,
        metavar="N",
        help=f"images larger than N HR pixels on a side (default {DEFAULT_REGION}) become region samples of at most "
        "NxN, keyed KEY_yYYYYYYY_xXXXXXXX; a TIFF source (tiled, BigTIFF, OME, pyramidal level 0) is read region by "
        "region, so a build's memory is bounded by the region, never the whole slide",
    )
    b.add_argument(
        "--min-valid",
        type=float,
        default=0.0,
        metavar="F",
        help="drop samples (regions, images) whose share of non-flat 64x64 blocks is below F, e.g. 0.2: glass "
        "background of a slide, nodata of a scene; listed in the manifest (build.dropped); default 0: keep all",
    )
    b.add_argument(
        "--clips",
        action="store_true",
        help="HR_SRC is a folder of video clips: folders of frames (REDS 000/00000000.png, Vimeo-90K "
        "00001/0001/im1.png, frame1.png .. frame10.png sorted naturally) and video files (.mp4 .mkv .mov .avi .webm, "
        "decoded frame-exactly by PyAV); --lr: folders of LR clips at the same relative paths. Samples are clip "
        "segments (docs/cli.md)",
    )
    b.add_argument(
        "--segment",
        type=int,
        default=DEFAULT_SEGMENT,
        metavar="N",
        help=f"--clips: at most N frames per sample (default {DEFAULT_SEGMENT}); a clip no longer is one sample",
    )
    b.add_argument(
        "--max-span",
        type=int,
        default=DEFAULT_MAX_SPAN,
        metavar="M",
        help=f"--clips: the longest window the stream may cut, (T - 1) x interval + 1 frames (default {DEFAULT_MAX_SPAN}); "
        "segments of longer clips overlap by M - 1 frames so every window lies in one",
    )


def _build_run_args(b: argparse.ArgumentParser) -> None:
    """How a build runs: shard limits, workers, order, parts, bad inputs, an OUT already there."""
    b.add_argument("--max-samples", type=int, default=None, help="at most this many samples per shard (default: no limit)")
    b.add_argument(
        "--workers",
        type=int,
        default=min(os.cpu_count() or 1, 16),
        help="encoding processes (default: all cores, at most 16); the output bytes do not depend on it",
    )
    b.add_argument("--seed", type=int, default=0, help="seed of the sample order shuffle (default 0)")
    b.add_argument(
        "--part",
        type=parse_part,
        default=None,
        metavar="I/N",
        help="build only slice I of N (0-based; a Kubernetes Indexed Job index), then `shardmaker merge OUT`",
    )
    b.add_argument(
        "--mod-crop",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="allow HR sides up to s-1 px larger than s x LR; the pair is HR[:s*h, :s*w] (default: on)",
    )
    b.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="fail (default): stop at the first bad file, exit 2; skip: leave it out, list it in the summary",
    )
    b.add_argument("--drop-alpha", action="store_true", help="accept RGBA/grey+alpha images by dropping alpha")
    b.add_argument(
        "--max-pixels",
        type=int,
        default=1 << 28,
        help="refuse images with more pixels than this (decompression-bomb guard; default 2^28)",
    )
    b.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a different wdsr dataset already in OUT: the new one is built in OUT/_staging and "
        "swapped in only once complete; only files the old manifest lists are deleted",
    )
    b.add_argument(
        "--strict-resume",
        action="store_true",
        help="a rerun keeps finished shards only if every source's content hash is unchanged (reads all "
        "sources once more); by default file size and modification time decide",
    )


def _merge_parser(sub: Any) -> None:
    g = sub.add_parser(
        "merge",
        help="write manifest.json from the part manifests of a --part build",
        description="Join the part manifests of a `build --part I/N` run into OUT/manifest.json.",
    )
    g.add_argument("out", metavar="OUT")
    g.add_argument(
        "--wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="while parts are still being built, check again every 10 s for up to SECONDS "
        "(a merge Job started next to the part builds; default 0: fail at once)",
    )


def _index_parser(sub: Any) -> None:
    x = sub.add_parser(
        "index",
        help="write a manifest for image files in place, or for tar shards another tool wrote, without converting them",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Image files (give --lr FOLDER or --hr-only): list and pair the folder or prefix as `build` does,\n"
        "read each file's header and xxh3_64 once (no decode), and write an index (-o) naming the files in\n"
        "place; SRDataset(IDX) streams them, `shardmaker build --from IDX OUT` makes shards of them later.\n\n"
        "Tar shards (give --hr NAME --lr SCALE:NAME): read each shard once (streaming, several at a time) and\n"
        "write a wdsr manifest beside them: the samples, where each member is, the members' xxh3_64, each\n"
        "shard's sha256 and the HR sizes (from the image headers, no decode). Members are matched by the names\n"
        "given: with --hr jpg --lr 4:x4.jpg, 'a.b.x4.jpg' is the x4 LR of sample 'a.b' (the longest name first).\n"
        "Decoders: png (8/16-bit), qoi, jpg/jpeg (libjpeg-turbo through simplejpeg, else Pillow), webp.\n\n"
        "examples:\n"
        "  shardmaker index /data/DIV2K_train_HR --lr /data/DIV2K_train_LR_bicubic/X4 -o /data/idx/div2k\n"
        "  shardmaker index s3://bucket/photos/ --hr-only -o s3://mine/idx/photos\n"
        "  shardmaker index 's3://bucket/div2k/train-{000000..000099}.tar' --hr hr.png --lr 4:lr.png\n"
        "  shardmaker index /data/df2k --hr jpg --lr 2:x2.jpg --lr 4:x4.jpg -o /data/df2k/wdsr.json --on-error skip",
    )
    x.add_argument(
        "shards",
        nargs="+",
        metavar="URL_OR_PATTERN",
        help="image files: the HR folder or URL; tar shards: a folder (every *.tar in it), a brace pattern "
        "(shard-{000000..000099}.tar) or shard URLs; one folder",
    )
    x.add_argument(
        "-o",
        "--out",
        metavar="MANIFEST_URL",
        help="image files (required): the index's folder (IDX/manifest.json) or a .json URL, outside the sources; "
        "tar shards: where to write the manifest, in the shards' folder (default: FOLDER/manifest.json)",
    )
    x.add_argument("--hr", metavar="NAME", help="tar shards: the HR member's name after the key: hr.png, jpg, ...")
    x.add_argument(
        "--lr",
        action="append",
        default=[],
        metavar="FOLDER|SCALE:NAME",
        help="image files: a folder or URL of provided LR images, one per scale (repeatable; paired as build pairs: same "
        "name, name + 'x<scale>', or --lr-pattern); tar shards: an LR member and its scale, e.g. 4:x4.jpg",
    )
    x.add_argument("--lr-pattern", default=None, metavar="PATTERN", help="image files: LR names as `build --lr-pattern`")
    x.add_argument("--hr-only", action="store_true", help="image files: HR alone (stream with lr='bicubic' or degrade=)")
    x.add_argument(
        "--no-digest",
        action="store_true",
        help="image files: record sizes alone, not each file's xxh3_64 (faster; a same-size change goes unnoticed)",
    )
    x.add_argument("--seed", type=int, default=0, help="image files: the sample order, as build --seed (default 0)")
    x.add_argument(
        "--on-error",
        choices=[e.value for e in OnError],
        default=OnError.FAIL.value,
        help="a sample that lacks a member, has an unreadable header or an HR that is not s x LR: fail "
        "(default, naming shard and key) or skip it (listed in the manifest's build.skipped)",
    )
    x.add_argument("--workers", type=int, default=4, help="shards (or files) read at a time (default 4)")
    x.add_argument(
        "--max-pixels",
        type=int,
        default=1 << 28,
        help="refuse HR images larger than this many pixels, from their headers (default 2^28)",
    )
    x.add_argument(
        "--channels",
        type=int,
        choices=(1, 3),
        default=None,
        help="tar shards: every sample's channels: 1 (grey) or 3 (RGB); a sample of another kind is a bad sample "
        "(default: the first usable sample's)",
    )
    x.add_argument(
        "--bit-depth",
        type=int,
        choices=(8, 16),
        default=None,
        help="tar shards: every sample's bit depth, 8 or 16; a sample of another is a bad sample "
        "(default: the first usable sample's)",
    )
    x.add_argument(
        "--wids", action="store_true", help="tar shards: also write NAME.wids.json, a shard list for wids.ShardListDataset"
    )
    x.add_argument("--overwrite", action="store_true", help="replace a manifest already at MANIFEST_URL")


def _check_parsers(sub: Any) -> None:
    v = sub.add_parser(
        "verify",
        help="check shards against the manifest (exit 1 on any mismatch)",
        description="Check each shard's size, sha256, sample keys and offsets against the manifest; "
        "--deep also decodes every pair, checks HR = s x LR and the per-member sha256 in {key}.json.",
    )
    v.add_argument("url", metavar="URL", help="the dataset folder, or its manifest's URL when it has another name")
    v.add_argument("--deep", action="store_true", help="decode every image and check sizes and member hashes")
    i = sub.add_parser("info", help="summary: samples, shards, bytes, scales, codec, HR size range")
    i.add_argument("url", metavar="URL")


def _peek_parsers(sub: Any) -> None:
    ls = sub.add_parser(
        "ls",
        help="list the shards (name, samples, bytes); --keys: every sample's key and HR size",
        description="List a shard set from its manifest: one line per shard (name, samples, bytes) and the "
        "total; with --keys one line per sample: shard, key, HR size (WxH). Reads only the manifest.",
    )
    ls.add_argument("url", metavar="URL", help="the dataset folder, or its manifest's URL when it has another name")
    ls.add_argument("--keys", action="store_true", help="one line per sample: shard, key, HR size")
    c = sub.add_parser(
        "cat",
        help="write one sample's members as files into DIR",
        description="Write the members of sample KEY as files into DIR ({key}.json, {key}.hr.png, "
        "{key}.lr_x4.png, ...; a clip's frames as {key}.hr_f0000.png, {key}.lr_x4_f0000.png, ...; a tiled "
        "member as one PNG assembled from its tiles; an index's members under their names, an index of files' "
        "with each file's extension); '/' in the key becomes folders. "
        "One range read of the shard; the bytes are checked against the manifest and the sample's hashes.",
    )
    c.add_argument("url", metavar="URL", help="the dataset folder, or its manifest's URL when it has another name")
    c.add_argument("key", metavar="KEY", help="the sample's key, as `shardmaker ls URL --keys` prints it")
    c.add_argument("-o", "--out", required=True, metavar="DIR", help="local folder to write into (made if missing)")


def _cat(args: argparse.Namespace) -> int:
    res = cat(args.url, args.key, args.out)
    for path in res.files:
        print(f"{path}  (assembled from {res.assembled[path]})" if path in res.assembled else path)
    return 0


def _scale_member(text: str) -> tuple[int, str]:
    scale, _, name = text.partition(":")
    if not scale.strip().isdigit() or not name or not 2 <= int(scale) <= 16:
        raise ValueError(f"--lr wants SCALE:NAME with SCALE 2..16 (e.g. 4:x4.jpg), got {text!r}")
    return int(scale), name


def _index(args: argparse.Namespace) -> int:
    if args.hr is None:
        return _index_files(args)
    lr = dict(_scale_member(t) for t in args.lr)
    if not lr:
        raise ValueError("--hr NAME indexes tar shards: give their LR members as --lr SCALE:NAME")
    if len(lr) != len(args.lr):
        raise ValueError("--lr: one member per scale")
    cfg = IndexConfig(
        hr=args.hr,
        lr=lr,
        on_error=OnError(args.on_error),
        workers=args.workers,
        max_pixels=args.max_pixels,
        overwrite=args.overwrite,
        wids=args.wids,
        progress=not args.quiet,
        channels=args.channels,
        bit_depth=args.bit_depth,
    )
    res = index(args.shards if len(args.shards) > 1 else args.shards[0], args.out, cfg)
    m = res.manifest
    print(
        f"wrote {res.path}: {m.samples} samples in {len(m.shards)} shards, {m.bytes / 1e6:.1f} MB indexed "
        f"in {res.seconds:.1f} s ({m.bytes / 1e6 / max(res.seconds, 1e-9):.0f} MB/s)"
    )
    if res.skipped_count:
        print(f"skipped {res.skipped_count}:")
        for s in res.skipped[:_LISTED]:
            print(f"  {s['shard']}{' ' + brief(s['key']) if 'key' in s else ''}: {s['reason']}")
        _and_more(res.skipped_count)
    return 0


def _index_files(args: argparse.Namespace) -> int:
    if any(re.fullmatch(r"\d+:.+", t) for t in args.lr) or args.wids or args.channels or args.bit_depth:
        raise ValueError("--lr SCALE:NAME, --wids, --channels and --bit-depth are for tar shards: give --hr NAME too")
    if len(args.shards) != 1 or not args.out:
        raise ValueError("index of image files: one HR folder or URL, and -o IDX (--hr NAME indexes tar shards)")
    cfg = FileIndexConfig(
        lr=tuple(args.lr),
        lr_pattern=args.lr_pattern,
        hr_only=args.hr_only,
        digest=not args.no_digest,
        on_error=OnError(args.on_error),
        workers=args.workers,
        max_pixels=args.max_pixels,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    res = index_files(args.shards[0], args.out, cfg)
    m = res.manifest
    assert m.members is not None and m.files is not None
    checked = m.files.checked_by.replace("size", "sizes", 1)
    print(
        f"wrote {res.path}: {m.samples} samples ({', '.join(m.members.names())}), {m.bytes / 1e6:.1f} MB of files "
        f"in place, {checked} recorded, {res.seconds:.1f} s"
    )
    if res.skipped_count:
        print(f"skipped {res.skipped_count}:")
        for sk in res.skipped[:_LISTED]:
            print(f"  {sk.get('path', '')}: {sk['reason']}")
        _and_more(res.skipped_count)
    return 0


_LISTED = 20  # skipped samples or sources the summary names; the manifest counts them all by reason


def _and_more(count: int) -> None:
    if count > _LISTED:
        print(f"  ... and {count - _LISTED} more (the manifest's build.skipped_reasons counts them by reason)")


def _tiles(text: str) -> int | str:
    if text in ("auto", "off"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, off or a tile side in pixels, got {brief(text)}") from None


def _build(args: argparse.Namespace) -> int:
    if bool(args.hr_src) == bool(args.from_index) or (args.from_index and (args.lr or args.lr_pattern or args.clips)):
        raise ValueError("give HR_SRC (and --lr folders) or --from IDX (an index of image files, no --lr or --clips), not both")
    provided = bool(args.lr) or bool(args.from_index and load_files_index(args.from_index).scales)
    # With --lr, the scales come from the LR folders; --scale, if given, must agree with them.
    scales = args.scale or (() if provided else (4,))
    if args.hr_only and (args.lr or args.scale):
        raise ValueError("--hr-only stores HR images alone: leave out --lr and --scale (the stream makes LR: lr='bicubic')")
    if args.hr_only and provided:
        raise ValueError("--hr-only stores HR images alone; this index has LR images (build them, or index with --hr-only)")
    method = LrMethod.NONE if args.hr_only else LrMethod.PROVIDED if provided else LrMethod(args.lr_method)
    cfg = SampleConfig(
        scales=scales,
        codec=Codec(args.codec),
        png_level=args.png_level,
        lr_method=method,
        mod_crop=args.mod_crop,
        drop_alpha=args.drop_alpha,
        max_pixels=args.max_pixels,
        tiles=args.tiles,
        region=args.region,
        min_valid=args.min_valid,
    )
    opts = BuildConfig(
        hr_src=args.from_index or (args.hr_src[0] if len(args.hr_src) == 1 else tuple(args.hr_src)),
        out=args.out,
        lr_srcs=tuple(args.lr),
        lr_pattern=args.lr_pattern,
        sample=cfg,
        shard_size=args.shard_size,
        max_samples=args.max_samples,
        workers=args.workers,
        seed=args.seed,
        part=args.part,
        on_error=OnError(args.on_error),
        overwrite=args.overwrite,
        progress=not args.quiet,
        strict_resume=args.strict_resume,
        clips=ClipOptions(args.segment, args.max_span) if args.clips else None,
        from_index=args.from_index,
    )
    res = build(opts)
    # a clip build counts clips (each written as segment samples of frames), an image build images
    done, unit = (res.clips, "clips") if args.clips else (res.samples, "images")
    rate = done / res.seconds if res.seconds else 0.0
    print(
        f"wrote {res.manifest_url}: {res.samples} samples{f' ({res.clips} clip(s))' if args.clips else ''} in {res.shards} "
        f"shards, {res.bytes / 1e6:.1f} MB ({res.reused_shards} shards kept from an earlier run), "
        f"{res.seconds:.1f} s, {rate:.2f} {unit}/s"
    )
    if res.skipped:
        print(f"skipped {len(res.skipped)} source file(s):")
        for s in res.skipped[:_LISTED]:
            print(f"  {s.path}: {s.reason}")
        _and_more(len(res.skipped))
    if res.dropped:
        print(f"dropped {len(res.dropped)} sample(s) under --min-valid {args.min_valid:g} (listed in the manifest)")
    if res.ignored:
        exts = collections.Counter(posixpath.splitext(p)[1].lower() or "(no extension)" for p in res.ignored)
        kinds = ", ".join(f"{n} {e}" for e, n in sorted(exts.items(), key=lambda en: (-en[1], en[0])))
        print(f"ignored {len(res.ignored)} file(s) that are not images ({kinds}):")
        for p in res.ignored[:_LISTED]:
            print(f"  {p}")
        if len(res.ignored) > _LISTED:
            print(f"  ... and {len(res.ignored) - _LISTED} more")
    if not res.complete:
        print("this was one part: run `shardmaker merge OUT` once every part has finished")
    return 0


def main(argv: list[str] | None = None) -> int:
    if argv is None and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `shardmaker info URL | head` ends quietly
    args = parse_args(_parser(), argv)
    if isinstance(args, int):
        return args
    configure_logging("shardmaker", args.quiet)
    try:
        if args.cmd == "build":
            return _build(args)
        if args.cmd == "index":
            return _index(args)
        if args.cmd == "merge":
            m = merge_when_ready(args.out, args.wait)
            print(f"merged {len(m.shards)} shards, {m.samples} samples into {args.out.rstrip('/')}/manifest.json")
            return 0
        if args.cmd == "verify":
            problems = verify(args.url, deep=args.deep, progress=not args.quiet)
            for line in problems:
                print(f"MISMATCH {line}", file=sys.stderr)
            if problems:
                print(f"{args.url}: {len(problems)} problem(s)", file=sys.stderr)
                return 1
            print(f"{args.url}: OK{' (deep)' if args.deep else ''}")
            return 0
        if args.cmd == "info":
            print(info_text(args.url))
            return 0
        if args.cmd == "ls":
            for line in ls_lines(args.url, keys=args.keys):
                print(line)
            return 0
        if args.cmd == "cat":
            return _cat(args)
    except KeyboardInterrupt:
        print(f"shardmaker {args.cmd}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except Exception as exc:  # bad input (2), unavailable storage (69): one line; anything else is a crash
        code = error_exit(f"shardmaker {args.cmd}", exc, (ShardmakerError,))
        if code is None:
            raise
        return code
    return 2


if __name__ == "__main__":
    sys.exit(main())
