"""``wdsr`` command line: ``bench``, ``preview``, ``train``, ``cache``, ``upscale``, ``export``, ``plot``.

Parsing only; the work is elsewhere."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from shardmaker.commandline import OneLineParser, configure_logging, error_exit, parse_args, parse_size
from shardmaker.exitcodes import ExitCode
from wdsr.bounds import default_of
from wdsr.config import DatasetConfig
from wdsr.degrade.registry import DEGRADATIONS, NAMES
from wdsr.loader import WorkerDied
from wdsr.pipeline.clips import ClipConfig
from wdsr.train.config import DEFAULT_STEPS, TrainConfig

D = DatasetConfig()  # the SRDataset defaults that --help shows


def _default(name: str) -> Any:
    """A ``wdsr train`` setting's default, from the dataclass that owns it (TrainConfig, DatasetConfig)."""
    return default_of(TrainConfig, name) if name in TrainConfig.__dataclass_fields__ else getattr(D, name)


def _degrade_help(head: str, tail: str = "", fixed_scale: bool = False) -> str:
    """``--degrade``'s help: ``head``, each model of ``wdsr.degrade.registry`` in a few words (those of a
    float scale marked when ``fixed_scale`` models train here), then ``tail``."""
    models = "; ".join(
        f"{d.name} = {d.summary}"
        + (" (refused here: the models upscale by one integer --scale)" if fixed_scale and d.float_scale else "")
        for d in DEGRADATIONS.values()
    )
    return f"{head}: {models} (docs/degrade.md){tail}"


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="wdsr", description="Stream aligned SR patch batches from wdsr-shards/1 datasets.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    b = sub.add_parser(
        "bench",
        help="measure patches/s, MB/s read, decode share and memory per worker",
        description="Stream a dataset for --seconds and print a table (after a short warm-up). "
        "--compare-naive also runs the decode-per-patch map-style Dataset on the same shards.",
    )
    b.add_argument("url", metavar="URL")
    b.add_argument("--workers", type=int, default=2, help="DataLoader workers (default %(default)s)")
    b.add_argument("--batch-size", type=int, default=D.batch_size, help="patches per batch (default %(default)s)")
    b.add_argument(
        "--patches-per-image",
        "-k",
        type=int,
        default=D.patches_per_image,
        help="patches cut per decoded pair (default %(default)s)",
    )
    b.add_argument(
        "--patch-size", type=int, default=D.patch_size, help="HR patch side, a multiple of --scale (default %(default)s)"
    )
    b.add_argument("--scale", type=int, default=D.scale, help="which LR (default %(default)s)")
    b.add_argument("--seconds", type=float, default=20.0, help="measuring time per loader (default %(default)g)")
    b.add_argument(
        "--shuffle-buffer", type=int, default=256, help="patches in each worker's shuffle buffer (default %(default)s)"
    )
    b.add_argument(
        "--verify",
        choices=["none", "xxh3_64", "sha256"],
        default=D.verify.value,
        help="check image members against their digests in {key}.json before decoding (default %(default)s)",
    )
    b.add_argument("--compare-naive", action="store_true", help="also run the decode-per-patch baseline; print the ratio")
    b.add_argument(
        "--compare",
        metavar="URL2",
        help="also stream URL2 (e.g. the same shards in S3) right after URL, same settings; print URL2 / URL",
    )
    b.add_argument(
        "--read-ahead",
        type=int,
        default=D.read_ahead,
        help="remote: samples fetched while one decodes (default %(default)s; 0 = off)",
    )
    b.add_argument(
        "--fetch",
        choices=["ranges", "fsspec"],
        default="ranges",
        help="remote: our resilient range reads (default) or an fsspec file with its read-ahead block cache",
    )
    b.add_argument("--cache-dir", help="remote: keep whole shards in this local folder (LRU); the table shows the hit rate")
    b.add_argument("--cache-limit", type=_gb, metavar="SIZE", help="remote: cache size limit (20GB, 500MiB; a bare number is GB)")
    b.add_argument(
        "--decoded-cache",
        metavar="DIR",
        help="node-wide decoded-pair cache (e.g. /dev/shm/wdsr); it is filled first (one decode per image), "
        "then the measured run cuts patches from it",
    )
    b.add_argument(
        "--decoded-cache-limit", type=_gb, metavar="SIZE", help="decoded cache limit (20GB; a bare number is GB; default: all)"
    )
    b.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    _preview_parser(sub)
    c = sub.add_parser(
        "cache",
        help="show or remove a node-wide decoded-pair cache",
        description="info: the datasets in a decoded cache folder, their pairs, GB and unfinished writes "
        "(a killed writer's temp files, never read). clear: remove them (only files wdsr made; "
        "processes that have a pair mapped keep reading it until they let go).",
    )
    c.add_argument("action", choices=["info", "clear"])
    c.add_argument("dir", metavar="DIR", help="the decoded_cache folder (e.g. /dev/shm/wdsr)")
    c.add_argument("--dataset", metavar="ID", help="clear: only this dataset (its manifest sha256, or a prefix)")
    _train_parser(sub)
    _tool_parsers(sub)
    return p


def _preview_parser(sub: Any) -> None:
    v = sub.add_parser(
        "preview",
        help="write a contact sheet of LR (nearest-upscaled) | HR patch pairs, labelled with key and transform",
        description="Draw patches as epoch 0 of training cuts them (same seed, positions, augmentation and "
        "flat-patch rejection) from the first images in manifest order, LR left of its HR, each pair under "
        "its label: the image's key, the patch's index and its transform (rot 90/180/270 counter-clockwise, "
        "then flip = mirrored left-right).",
    )
    v.add_argument("url", metavar="URL")
    v.add_argument("-o", "--output", required=True, help="PNG file to write (local path or fsspec URL)")
    v.add_argument("--scale", type=int, default=D.scale)
    v.add_argument(
        "--patch-size",
        type=int,
        default=None,
        help="HR patch side, a multiple of --scale (default 128; with --degrade, the model's own gt_size: 256, "
        "Real-ESRNet's yml, as wdsr train uses)",
    )
    v.add_argument("-n", "--count", type=int, default=8, help="patch pairs to draw (default %(default)s)")
    v.add_argument(
        "--per-image", type=int, default=2, help="patches cut from each image, in manifest order (default %(default)s)"
    )
    v.add_argument("--seed", type=int, default=D.seed)
    v.add_argument("--clip-frames", type=int, default=5, help="clip datasets: frames per window (default %(default)s)")
    v.add_argument("--clip-interval", type=int, default=1, help="clip datasets: the frame step (default %(default)s)")
    v.add_argument(
        "--lr",
        choices=["stored", "bicubic", "bicubic-uint8"],
        default="stored",
        help="stored (default): the dataset's LR; bicubic(-uint8): made from HR per patch, MATLAB-exactly (HR-only datasets)",
    )
    v.add_argument(
        "--degrade",
        choices=NAMES,
        help=_degrade_help(
            "show degraded pairs: the LR that the model makes from each HR patch with the parameters training draws "
            "for it (HR-only datasets too)"
        ),
    )


def _tool_parsers(sub: Any) -> None:
    u = sub.add_parser(
        "upscale",
        help="apply a model (wdsr train's, or a spandrel-loadable file) to images of any size (tiled), optionally vs HR",
        description="Read the checkpoint (a file, or a run folder's newest), build its model and upscale each image "
        "(PNG/JPEG/TIFF/BMP/WebP, 8/16-bit, grey/RGB) to OUT/<name>.png with the same depth, in overlapping LR tiles. "
        "--hr DIR prints PSNR-Y / SSIM-Y (border = scale) against the HR images of the same names.",
    )
    u.add_argument(
        "checkpoint",
        metavar="MODEL",
        help="checkpoints/step-N.pt, a wdsr train run folder, or any spandrel-loadable SR model file (.pth, .safetensors)",
    )
    u.add_argument(
        "images",
        metavar="IMAGES",
        nargs="+",
        help="image files or folders of them; or one video file (.mp4 .mkv .mov .avi .webm: the video extra), or a "
        "folder of one clip's frames with a video model or --video",
    )
    u.add_argument("-o", "--output", required=True, metavar="OUT", help="folder for the upscaled PNGs")
    u.add_argument("--tile", type=int, default=256, help="LR tile side (default 256; 0 = whole images)")
    u.add_argument(
        "--overlap",
        type=int,
        help="LR pixels neighbouring tiles share; each tile also sees half of it "
        "as context beyond its edges (default 32, at most a quarter of --tile)",
    )
    u.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto (default): CUDA if there")
    u.add_argument(
        "--hr",
        metavar="HR_DIR",
        help="folder of HR references: print PSNR-Y/SSIM-Y; paired as shardmaker build --lr pairs "
        "(the same name, or the name + 'x<scale>': babyx4.png with baby.png), all checked before any work",
    )
    u.add_argument(
        "--lr-pattern",
        metavar="PATTERN",
        help="with --hr: the IMAGES' names (no extension) from the HR name {stem} and the scale {s}, "
        "as shardmaker build --lr-pattern: '{stem}_LRBI_x{s}'",
    )
    u.add_argument("--overwrite", action="store_true", help="replace existing OUT/<name>.png files (an input is never replaced)")
    u.add_argument(
        "--video",
        action="store_true",
        help="IMAGES is one clip (a video file or a folder of frames): write it as a lossless FFV1 video, -o OUT.mkv "
        "(without it a clip becomes OUT/frame_000000.png ...)",
    )
    e = sub.add_parser(
        "export",
        help="write a run's spandrel model as a plain state dict (.safetensors or .pth) that spandrel and chaiNNer load",
        description="Read the run's newest checkpoint (or a checkpoint file) of a --model spandrel:NAME or --init run and "
        "write its weights under the architecture's own names; spandrel detects the architecture and scale from them.",
    )
    e.add_argument("run", metavar="RUN", help="a wdsr train run folder, or one of its checkpoints/step-N.pt")
    e.add_argument("-o", "--output", required=True, metavar="FILE", help="FILE.safetensors or FILE.pth")
    e.add_argument("--overwrite", action="store_true", help="replace FILE if it exists")
    g = sub.add_parser(
        "plot",
        help="draw a run's curves (loss, lr, PSNR/SSIM-Y, patches/s, data_wait) from metrics.jsonl as a PNG",
        description="Read RUN/metrics.jsonl (a local folder or an fsspec URL such as s3://...) and draw one panel "
        "per metric over steps.",
    )
    g.add_argument("run", metavar="RUN", help="wdsr train run folder (or its metrics.jsonl)")
    g.add_argument("-o", "--output", required=True, help="PNG file to write (local path or fsspec URL)")


def _train_parser(sub: Any) -> None:
    S = argparse.SUPPRESS  # only flags given on the command line override --config
    t = sub.add_parser(
        "train",
        help="train EDSR-baseline or ESPCN on images, TinyVSR on video clips (one process, or DDP under torchrun)",
        argument_default=S,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The reference training loop: L1 loss, Adam, cosine or step LR, AMP on CUDA, DDP under torchrun\n"
        "(gloo on CPU, nccl on CUDA; rank and world from torchrun's environment).\n\n"
        "Rank 0 prints a line and appends a JSON line to OUT/metrics.jsonl every --log-every steps:\n"
        "step, epoch, loss, lr, patches_per_s (all ranks) and data_wait (share of step time spent\n"
        "waiting for the next batch: near 0 means the loader keeps up). Validation lines carry\n"
        "psnr_y/ssim_y (and a step-0 line the val set's bicubic_psnr_y/bicubic_ssim_y, the baseline).\n"
        "Checkpoints go to OUT/checkpoints/, OUT/latest.json names the newest.\n"
        "SIGTERM (Kubernetes preemption): every rank stops after the next step, a checkpoint is written\n"
        "(by a rank that was not told to stop) and exits 0; a second SIGTERM exits at once. --resume continues\n"
        "from OUT/latest.json (or starts fresh if there is none) at the exact batch of the checkpoint; another\n"
        "number of ranks or --workers re-plans the rest of that epoch over them. Config file keys are the flag\n"
        "names; flags override the file.",
        epilog="example:\n  wdsr train --data demo-out/shards --val-data demo-out/val --out demo-out/run \\\n"
        "             --model espcn --patch-size 96 --steps 200 --workers 2\n"
        "  torchrun --nproc-per-node 8 -m wdsr train --config train.yaml --resume",
    )
    t.add_argument("--data", metavar="URL", help="training dataset (folder or s3://... with manifest.json)")
    t.add_argument(
        "--val-data",
        metavar="URL",
        help="validation dataset, every image once; with --clip-frames every clip, scored per clip then over clips "
        "(default: no validation)",
    )
    t.add_argument("--out", metavar="DIR_OR_URL", help="run folder: checkpoints, latest.json, metrics.jsonl, run.json")
    t.add_argument("--config", metavar="FILE", help="YAML or JSON file of settings (keys = flag names)")
    t.add_argument(
        "--model",
        metavar="NAME",
        help="edsr-baseline (16 blocks x 64 ch) or espcn for image datasets; tinyvsr (a small recurrent "
        "BasicVSR-like model) for clip datasets, with --clip-frames; or spandrel:ARCH, any SR architecture "
        "spandrel builds (pip install 'wdsr[zoo]'), by its spandrel id or class name: spandrel:SPAN, "
        "spandrel:ESRGAN (RRDBNet), spandrel:Compact (SRVGGNetCompact), spandrel:SwinIR, spandrel:HAT, spandrel:DAT, "
        "spandrel:PLKSR, spandrel:RealPLKSR, ... (an unknown name lists them; docs/models.md) "
        f"(default {_default('model').value})",
    )
    t.add_argument(
        "--model-args",
        metavar="K=V,...",
        help="a spandrel architecture's options beyond its defaults, e.g. feature_channels=32 or "
        "depths=[6,6],num_heads=[6,6] (in a config file: model: {name: spandrel:SwinIR, depths: [6, 6]})",
    )
    t.add_argument(
        "--init",
        metavar="FILE",
        help="fine-tune a shared model: any spandrel-loadable .pth/.safetensors SR file; its architecture and scale "
        "come from the file (--scale, if given, must agree); --resume continues from the run's checkpoint",
    )
    t.add_argument("--scale", type=int, help=f"upscaling factor; the data must hold this LR (default {_default('scale')})")
    t.add_argument(
        "--patch-size",
        type=int,
        help=f"HR patch side, a multiple of --scale (default {_default('patch_size')}; with --degrade, the model's "
        "own gt_size: 256, Real-ESRNet's yml)",
    )
    t.add_argument(
        "-k", "--patches-per-image", type=int, help=f"patches cut per decoded pair (default {_default('patches_per_image')})"
    )
    t.add_argument("--batch-size", type=int, help=f"patches per batch per rank (default {_default('batch_size')})")
    t.add_argument("--workers", type=int, help="DataLoader workers per rank (default: this machine's cores, at most 8)")
    t.add_argument(
        "--shuffle-buffer", type=int, help=f"patches in each worker's shuffle buffer (default {_default('shuffle_buffer')})"
    )
    t.add_argument(
        "--clip-frames",
        type=int,
        metavar="T",
        help="clip datasets (shardmaker build --clips): windows of T frames; a batch is lr [B, T, C, h, w]",
    )
    clip = ClipConfig()
    intervals = ",".join(map(str, clip.interval))
    t.add_argument(
        "--clip-interval", metavar="I[,I...]", help=f"frame steps, one drawn per window (default {intervals}; e.g. 1,2)"
    )
    t.add_argument(
        "--clip-window",
        choices=["recurrent", "center"],
        help=f"recurrent: the HR of all T frames; center: of the centre frame only (T odd) (default {clip.window})",
    )
    t.add_argument(
        "--clip-reverse", type=float, metavar="P", help=f"probability of a window's frames reversed (default {clip.reverse:g})"
    )
    t.add_argument(
        "--degrade",
        choices=NAMES,
        help=_degrade_help(
            "train from HR alone, the LR made on the device from each batch (Real-ESRNet-style) with parameters drawn "
            "per patch in the workers",
            ". Default: the stored LR",
            fixed_scale=True,
        ),
    )
    _train_run_flags(t)


def _train_run_flags(t: argparse.ArgumentParser) -> None:
    """``wdsr train``'s flags of the run: schedule, precision, validation, logging, checkpoints, caches."""
    t.add_argument("--steps", type=int, help=f"optimizer steps in all (default {DEFAULT_STEPS} unless --epochs)")
    t.add_argument("--epochs", type=int, help="passes over the data instead of --steps")
    t.add_argument("--lr", type=float, help=f"Adam learning rate (default {_default('lr'):g})")
    t.add_argument(
        "--schedule", choices=["cosine", "step"], help=f"cosine to 0 over the run or step (default {_default('schedule').value})"
    )
    t.add_argument(
        "--lr-step", type=int, help=f"step schedule: multiply by --lr-gamma every N steps (default {_default('lr_step')})"
    )
    t.add_argument("--lr-gamma", type=float, help=f"step schedule factor (default {_default('lr_gamma'):g})")
    t.add_argument(
        "--amp",
        choices=["auto", "bf16", "fp16", "off"],
        help=f"auto: bf16 on CUDA where supported, else fp16 + GradScaler; off on CPU (default {_default('amp').value})",
    )
    t.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        help=f"auto: cuda:LOCAL_RANK if CUDA is there (default {_default('device').value})",
    )
    t.add_argument("--val-every", type=int, help=f"validate every N steps (default {_default('val_every')}; 0 = never)")
    t.add_argument("--val-tile", type=int, help="validate in LR tiles of this side (large images); default whole images")
    t.add_argument("--log-every", type=int, help=f"log every N steps (default {_default('log_every')})")
    t.add_argument(
        "--ckpt-every", type=int, help=f"checkpoint every N steps (default {_default('ckpt_every')}; always at the end)"
    )
    t.add_argument(
        "--ckpt-minutes", type=float, metavar="M", help="also checkpoint every M minutes (rank 0's clock; default off)"
    )
    t.add_argument("--keep-ckpts", type=int, help=f"checkpoints kept (default {_default('keep_ckpts')}; 0 = all)")
    t.add_argument("--seed", type=int, help=f"seed of the weights, patch positions and shuffles (default {_default('seed')})")
    t.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        help=f"bad samples: stop (fail) or skip them, counted (default {_default('on_error').value})",
    )
    t.add_argument("--cache-dir", help="remote data: keep whole shards in this local folder")
    t.add_argument(
        "--decoded-cache",
        metavar="DIR",
        help="keep decoded pairs in DIR (e.g. /dev/shm/wdsr), one copy per node shared by every worker and rank: "
        "epochs after the first cut patches without decoding (batches are the same)",
    )
    t.add_argument(
        "--decoded-cache-limit",
        type=_gb,
        metavar="SIZE",
        help="at most this much of decoded pairs (20GB; a bare number is GB; a fixed subset)",
    )
    t.add_argument("--log-dir", help="where metrics.jsonl and TensorBoard files are written when --out is remote")
    t.add_argument("--tensorboard", action="store_true", help="also write TensorBoard event files (OUT/tb)")
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from latest.json, with the settings in its run.json (--config and flags "
        "given override them, each change logged): --out RUN --resume is enough",
    )
    t.add_argument(
        "--check",
        action="store_true",
        help="check settings, data (manifest, scale) and --out, then exit: "
        "0 if training could start, 2 with the reason (a pre-flight step before torchrun)",
    )


def _gb(text: str) -> int:
    return parse_size(text, unit="GB")


def _train(args: argparse.Namespace) -> int:
    """Bad settings, data or OUT: one line, exit 2 (through main); a run that diverged: one line, exit 2 too
    (it diverges again from the same checkpoint with the same settings: lower --lr first)."""
    from wdsr.train.checkpoint import Diverged
    from wdsr.train.config import make_config
    from wdsr.train.loop import sigterm_exits, train

    flags = {k: v for k, v in vars(args).items() if k != "cmd"}
    try:
        with sigterm_exits():  # --resume reads OUT/run.json, maybe from storage: a pod's PID 1 must end on SIGTERM there too
            return train(make_config(flags))
    except Diverged as exc:
        print(f"wdsr train: error: {exc}", file=sys.stderr)
        return ExitCode.BAD_INPUT


def _bench(args: argparse.Namespace) -> int:
    from wdsr.tools.bench import bench_naive, bench_stream, table

    kw = dict(
        workers=args.workers, batch_size=args.batch_size, patch_size=args.patch_size, scale=args.scale, seconds=args.seconds
    )
    read = dict(
        read_ahead=args.read_ahead,
        fetch=args.fetch,
        cache_dir=args.cache_dir,
        cache_limit=args.cache_limit,
    )
    if args.decoded_cache:
        from wdsr.tools.bench import fill_decoded_cache

        read["decoded_cache"] = args.decoded_cache
        read["decoded_cache_limit"] = args.decoded_cache_limit
        n, seconds = fill_decoded_cache(args.url, args.scale, args.decoded_cache, read["decoded_cache_limit"], args.workers)
        print(f"decoded cache {args.decoded_cache}: {n} pairs written in {seconds:.1f} s")
    stream = dict(patches_per_image=args.patches_per_image, verify=args.verify, shuffle_buffer=args.shuffle_buffer, **read, **kw)
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
        print(
            f"wdsr / naive: {ours.patches_per_s / pil.patches_per_s:.1f}x (naive with Pillow), "
            f"{ours.patches_per_s / same.patches_per_s:.1f}x (naive with wdsr's decoders)"
        )
    if args.json:
        import dataclasses

        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) | {"efficiency": r.efficiency} for r in results], f, indent=1)
    return 0


def _preview(args: argparse.Namespace) -> int:
    import dataclasses

    from wdsr.config import DatasetConfig
    from wdsr.pipeline.clips import ClipConfig
    from wdsr.tools.preview import clip_sheet, contact_sheet, is_clips, write_png
    from wdsr.train.config import degrade_config, degrade_patch

    if args.patch_size is None:  # what training cuts: the degradation's own gt_size, else 128
        args.patch_size = (args.degrade and degrade_patch(args.degrade, args.scale)) or 128
    # a ConfigError is a ValueError; preview shows float-scale models too
    degrade = degrade_config(args.degrade, args.scale, args.patch_size, "flags", fixed_scale=False)
    config = DatasetConfig(scale=args.scale, patch_size=args.patch_size, seed=args.seed, lr=args.lr, degrade=degrade)
    if is_clips(args.url):  # windows of frames, each frame LR|HR
        clip = ClipConfig(frames=args.clip_frames, interval=args.clip_interval)
        sheet = clip_sheet(args.url, dataclasses.replace(config, clip=clip), args.count, args.per_image)
        write_png(args.output, sheet)
        print(f"wrote {args.output}: {args.count} windows of {args.clip_frames} LR|HR frames, {sheet.shape[1]}x{sheet.shape[0]}")
        return 0
    sheet = contact_sheet(args.url, config, args.count, args.per_image)
    write_png(args.output, sheet)
    what = f"{args.degrade}-degraded LR|HR" if degrade is not None else "LR|HR"
    print(f"wrote {args.output}: {args.count} {what} pairs, {sheet.shape[1]}x{sheet.shape[0]}")
    return 0


def _upscale(args: argparse.Namespace) -> int:
    from pathlib import Path

    from wdsr.tools.frames import is_video_file
    from wdsr.tools.upscale import find_images, load_model, pick_device, plan_outputs, report, upscale_files
    from wdsr.tools.upscale_video import is_video_model

    if args.tile < 0:
        raise ValueError(f"--tile must be >= 0, got {args.tile}")
    if args.video or (len(args.images) == 1 and is_video_file(args.images[0])):
        return _upscale_clip(args, None)
    images = find_images(args.images)
    plan_outputs(images, Path(args.output), args.overwrite)  # before the model is built: a refusal costs nothing
    m = load_model(args.checkpoint, pick_device(args.device))
    if is_video_model(m) and len(args.images) == 1 and Path(args.images[0]).is_dir():
        return _upscale_clip(args, m)  # a video model takes a folder as one clip's frames
    print(f"{m.source}: {m.name} x{m.scale}, step {m.step}; {len(images)} image(s)")
    hr = Path(args.hr) if args.hr else None
    if args.lr_pattern is not None and hr is None:
        raise ValueError("--lr-pattern names the images' HR references: give --hr too")
    overlap = min(32, args.tile // 4) if args.overlap is None else args.overlap
    print(report(upscale_files(m, images, Path(args.output), args.tile or None, overlap, hr, args.overwrite, args.lr_pattern)))
    return 0


def _upscale_clip(args: argparse.Namespace, m: Any) -> int:
    """``wdsr upscale`` of one clip (a video file, or a folder of frames): numbered PNG frames, or ``--video``."""
    from pathlib import Path

    from wdsr.tools.frames import Ffv1Video, PngFrames, open_clip
    from wdsr.tools.upscale import load_model, pick_device
    from wdsr.tools.upscale_video import upscale_clip

    if args.hr or args.lr_pattern:
        raise ValueError("--hr scores images; a clip (a video file, or a folder of frames) is upscaled without scores")
    if len(args.images) != 1:
        raise ValueError(f"a clip is upscaled alone: give one video file or folder of frames, not {len(args.images)} inputs")
    clip = open_clip(Path(args.images[0]))  # a video's declared size checked before anything is decoded
    out = Path(args.output)
    writer = Ffv1Video(out, clip.rate, args.overwrite) if args.video else PngFrames(out, args.overwrite)
    device = pick_device(args.device)
    m = m or load_model(args.checkpoint, device)
    overlap = min(32, args.tile // 4) if args.overlap is None else args.overlap
    print(f"{m.source}: {m.name} x{m.scale}, step {m.step}; {clip.source}: {clip.count} frame(s)")
    n = upscale_clip(m, clip, writer, args.tile or None, overlap, device)
    print(f"{out}: {n} frames" + (" (FFV1, lossless)" if args.video else f" ({out / 'frame_000000.png'} ...)"))
    return 0


def _export(args: argparse.Namespace) -> int:
    from wdsr.tools.export import export

    print(export(args.run, args.output, args.overwrite))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from wdsr.tools.plot import plot_run

    panels = plot_run(args.run, args.output)
    print(f"wrote {args.output}: {', '.join(panels)}")
    return 0


def _cache(args: argparse.Namespace) -> int:
    from wdsr.store import decoded

    if args.action == "info":
        print(decoded.describe(args.dir))
        return 0
    n = decoded.clear(args.dir, args.dataset)
    print(f"removed {n} file(s) from {args.dir}")
    return 0


_COMMANDS = {
    "bench": _bench,
    "preview": _preview,
    "train": _train,
    "cache": _cache,
    "upscale": _upscale,
    "plot": _plot,
    "export": _export,
}


def main(argv: list[str] | None = None) -> int:
    if argv is None and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    args = parse_args(_parser(), argv)
    if isinstance(args, int):  # --help (0) or a usage error (2)
        return args
    configure_logging("wdsr")
    try:
        return _COMMANDS[args.cmd](args)
    except KeyboardInterrupt:
        print(f"wdsr {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except WorkerDied as exc:  # killed (out of memory?) or crashed: its batches are lost, the run's checkpoint is not
        print(f"wdsr {args.cmd}: stopped: {exc} (rerun with --resume: it continues from the last checkpoint)", file=sys.stderr)
        return ExitCode.WORKER_DIED
    except Exception as exc:  # bad input (2), unavailable storage (69): one line; anything else is a crash
        code = error_exit(f"wdsr {args.cmd}", exc)
        if code is None:
            raise
        return code


if __name__ == "__main__":
    sys.exit(main())
