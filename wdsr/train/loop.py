"""``wdsr train``: the reference DDP training loop (L1, Adam, AMP), fed by an SRDataset.

One process, or one per GPU/CPU slot under ``torchrun`` (rank and world from its environment).
Rank 0 logs, validates the gathered results and writes checkpoints (every ``--ckpt-every`` steps, and
once ``--ckpt-minutes`` passed on rank 0's clock). SIGTERM: every rank stops at the same step (the one
after the per-step vote that saw it: :mod:`wdsr.train.vote`) and a checkpoint is written, by the lowest
rank that was not told to stop (its node is not going away); the rank told exits 0. Image datasets train an image
model on patches, clip datasets a video model on windows of frames (``--clip-frames``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardmaker.errors import brief
from wdsr.dataset import SRDataset
from wdsr.degrade import Degrader
from wdsr.loader import LoaderStateError, SRLoader, make_loader, sample_meta, to_float
from wdsr.pipeline.sample import first_folder_clips
from wdsr.train.checkpoint import FORMAT, Diverged, RunDir, RunError
from wdsr.train.clipvalidate import bicubic_clips, val_clip_config, validate_clips
from wdsr.train.config import Amp, ConfigError, Schedule, TrainConfig
from wdsr.train.context import Ctx, pin_threads, setup
from wdsr.train.logbook import (
    MetricsLog,
    Recorder,
    Standby,
    Window,
    diverged_message,
    log_bicubic,
    log_val,
    log_window,
    progress_bar,
)
from wdsr.train.models import Residual, build_model, residual_of
from wdsr.train.validate import bicubic_baseline, validate
from wdsr.train.vote import Verdict, Vote
from wdsr.train.zoo import ZooModel
from wdsr.train.zooload import for_run

log = logging.getLogger("wdsr")

# A rank that stopped because another rank was told to (SIGTERM there: a preemption): it checkpointed
# like the others, but did not finish; not 0, so a Job counts the pod as failed and restarts it
# (EX_TEMPFAIL: try again with --resume). The rank that got the SIGTERM exits 0.
EXIT_PEER_STOPPED = 75


class StopFlag:
    """First SIGTERM: stop once every rank knows (the next step; checkpoint, exit 0). A second one: exit at once."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> Any:
        """Install the handler; returns the previous one (restored when the run ends)."""
        return signal.signal(signal.SIGTERM, self._handler)

    def _handler(self, signum: int, _frame: Any) -> None:
        if self.requested:
            os._exit(128 + signum)
        self.requested = True
        log.warning("SIGTERM: stopping after the next step, then writing a checkpoint and exiting (again to exit at once)")


def open_data(cfg: TrainConfig) -> tuple[SRDataset, SRDataset | None]:
    """The train (and val) datasets; every bad-input error surfaces here, before workers start."""
    try:
        train = SRDataset(cfg.data, config=cfg.dataset)
    except ValueError:
        _refuse_other_kind(cfg)  # a clip dataset for an image model, or images for a video model: in flag words
        raise
    _check_span(cfg, train)
    train.check_batches(cfg.workers)
    val = None
    if cfg.val_data and cfg.val_every:
        d = cfg.dataset
        try:
            clip = None if d.clip is None else val_clip_config(d.clip)  # whole clips, scored per clip
            val = SRDataset(cfg.val_data, scale=d.scale, split="val", tile=cfg.val_tile, on_error=d.on_error, clip=clip)
        except ValueError as exc:
            if "HR-only" in str(exc):  # the dataset's advice (lr='bicubic') is not a train setting
                raise ConfigError(
                    f"--val-data {cfg.val_data}: an HR-only dataset; validation compares with stored LR: give a dataset "
                    f"built with --scale {d.scale}"
                ) from None
            raise
    return train, val


def _refuse_other_kind(cfg: TrainConfig) -> None:
    """When the dataset refused to open: if its (first) folder holds the other kind of data than the
    model trains on, say so in the flags' words; otherwise the dataset's own error stands."""
    try:
        folder, clips = first_folder_clips(cfg.data)
    except (ValueError, OSError):
        return
    if clips and cfg.dataset.clip is None:
        raise ConfigError(
            f"{folder}: a clip dataset (shardmaker build --clips): train a video model on it (--model tinyvsr --clip-frames T)"
        )
    if not clips and cfg.dataset.clip is not None:
        raise ConfigError(
            f"{folder}: an image dataset; --model {cfg.model.value} --clip-frames trains on clip datasets "
            "(shardmaker build --clips): train an image model (edsr-baseline, espcn) on it"
        )


def _check_span(cfg: TrainConfig, train: SRDataset) -> None:
    """Windows longer than the dataset's segments may hold (its ``--max-span``) would fail in a worker: refuse
    now. A dataset whose every clip is one segment (as many samples as clips) holds windows of any span."""
    clip = cfg.dataset.clip
    built = (getattr(train.manifest, "build", None) or {}).get("clips")
    most = built.get("max_span") if isinstance(built, dict) else None
    split = isinstance(built, dict) and isinstance(built.get("clips"), int) and train.manifest.samples > built["clips"]
    if clip is not None and isinstance(most, int) and clip.span > most and split:
        raise ConfigError(
            f"{train.url}: windows of --clip-frames {clip.frames} at --clip-interval {max(clip.interval)} span {clip.span} "
            f"frames; this dataset was built with --max-span {most}: lower them, or rebuild with --max-span {clip.span}"
        )


def amp_setting(amp: Amp, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None, whether a GradScaler is needed)."""
    if amp is Amp.AUTO:
        if device.type != "cuda":
            return None, False
        amp = Amp.BF16 if torch.cuda.is_bf16_supported() else Amp.FP16
    if amp is Amp.BF16:
        return torch.bfloat16, False
    if amp is Amp.FP16:
        return torch.float16, True
    return None, False


def lr_factor(cfg: TrainConfig, total: int) -> Callable[[int], float]:
    if cfg.schedule is Schedule.STEP:
        return lambda step: cfg.lr_gamma ** (step // cfg.lr_step)
    return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(1, total)))


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _exit_before_training(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """Inside: SIGTERM exits at once with 143 (``SystemExit``). A process with a handler gets the signal
    even as a container's PID 1, where the kernel drops an unhandled one: the pre-flight, the settings
    read from ``OUT/run.json`` on storage (``--resume``) and the rendezvous all end on a pod's SIGTERM."""
    previous = signal.signal(signal.SIGTERM, _exit_before_training)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def train(cfg: TrainConfig) -> int:
    """Run the loop; returns the exit status: 0 when finished or stopped by SIGTERM,
    ``EXIT_PEER_STOPPED`` (75) when stopped because another rank was (rerun with ``--resume``).
    SIGTERM before the loop (the ``--check`` pre-flight, the rendezvous) exits at once with 143
    (:func:`sigterm_exits`)."""
    with sigterm_exits():
        return _train(cfg)


def _train(cfg: TrainConfig) -> int:
    train_ds, val_ds = open_data(cfg)
    run = RunDir(cfg.out)
    resume_state = run.load_latest() if cfg.resume else None
    if resume_state is not None:
        _check_resume(resume_state, cfg, run)
        cpu = Ctx(0, 1, torch.device("cpu"), None)  # the checkpoint loaded into this model once, before any worker
        where = f"{run.url}/{(run.latest() or {}).get('path')}"
        _build_model(cfg, cpu, int(sample_meta(train_ds).get("channels", 3)), 1, resume_state, where)
    elif not cfg.resume and (run.has_checkpoints() or run.run_info() is not None):  # every rank checks: none hangs
        raise RunError(
            f"{cfg.out} already holds a training run (checkpoints or run.json); pass --resume to "
            "continue it, or choose another --out"
        )
    if cfg.check:
        for ds in (train_ds, val_ds):
            if ds is not None:
                ds.check_shards()  # a missing or truncated shard: exit 2 now, not retries in every pod
        at = f"resume at step {resume_state['step']}" if resume_state is not None else "start at step 0"
        print(
            f"wdsr train --check: OK: {train_ds.manifest.samples} samples x{cfg.dataset.scale} in {cfg.data}; "
            f"{cfg.out} would {at}"
        )
        return 0
    ctx = setup(cfg.device)
    stop = StopFlag()
    caller_threads = torch.get_num_threads()
    threads = pin_threads(resume_state.get("threads") if resume_state is not None else None)
    if resume_state is not None and threads != caller_threads and ctx.rank == 0:
        log.info("resuming with the checkpoint's %d intra-op threads (this process had %d)", threads, caller_threads)
    previous = stop.install()
    try:
        return _loop(cfg, ctx, run, train_ds, val_ds, resume_state, stop)
    finally:
        signal.signal(signal.SIGTERM, previous)
        torch.set_num_threads(caller_threads)
        if ctx.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


# what a resumed run cannot change: the checkpoint's weights would not fit, or mean something else
_FIXED = ("model", "scale", "model_args")


def _check_resume(state: dict[str, Any], cfg: TrainConfig, run: RunDir) -> None:
    """The checkpoint's and run.json's settings against this start: model and scale must match (the
    settings that changed since run.json were logged by ``make_config``). run.json, if there, must be
    this format's."""
    now = cfg.dict
    info = run.run_info()
    if info is not None and (info.get("format") != FORMAT or not isinstance(info.get("config"), dict)):
        raise RunError(f"{run.url}/run.json: not a {FORMAT} run (its 'format' or 'config' is missing or wrong)")
    for label, saved in ((f"{run.url}/run.json", info and info["config"]), ("the checkpoint", state["config"])):
        if saved is None:
            continue
        for key in _FIXED:
            if saved.get(key) != now[key]:
                raise RunError(f"--resume: {run.url} was trained with {key}={brief(saved.get(key))} ({label}), not {now[key]!r}")


@dataclasses.dataclass
class _Model:
    """What a step changes, and what a checkpoint saves with the data position."""

    model: nn.Module
    run_model: nn.Module  # the model, or its DDP wrapper
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype | None
    residual: Residual  # the model's variant: a new run's is bicubic, a resumed one's its checkpoint's
    record: dict[str, Any]  # what else a checkpoint's config says of the model (a spandrel model's options)
    net: nn.Module  # the model as it runs (padded to a spandrel model's size requirements): what validation calls

    def step(self, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, float]:
        """One optimisation step on a batch; its loss (on the device) and the learning rate it used."""
        with torch.autocast(device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
            out = self.run_model(x)
        if out.shape != y.shape:  # l1_loss would broadcast (a centre-frame HR against T frames' output)
            raise ValueError(f"the model's output {tuple(out.shape)} is not the shape of the HR batch {tuple(y.shape)}")
        loss = nn.functional.l1_loss(out.float(), y)
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        step_lr = float(self.sched.get_last_lr()[0])
        self.sched.step()
        return loss.detach(), step_lr


def _build_model(
    cfg: TrainConfig, ctx: Ctx, channels: int, total: int, state: dict[str, Any] | None, where: str = "checkpoint"
) -> _Model:
    torch.manual_seed(cfg.dataset.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    center = cfg.dataset.clip is not None and cfg.dataset.clip.window == "center"
    try:
        residual = residual_of(state["config"], where) if state is not None else Residual.BICUBIC
    except ValueError as exc:
        raise RunError(str(exc)) from None
    record: dict[str, Any] = {}
    if isinstance(cfg.model, ZooModel):  # spandrel: rebuilt from the checkpoint's record, else --init, else fresh
        saved = state["config"].get("spandrel") if state is not None else None
        weights = state["model"] if state is not None else None  # the record is held to them before it is built
        model, net, spec = for_run(cfg.model, cfg.model_args or {}, cfg.init, cfg.dataset.scale, channels, saved, where, weights)
        record, residual = {"spandrel": spec}, Residual.NONE
    else:
        model = net = build_model(cfg.model, cfg.dataset.scale, channels, center=center, residual=residual)
    model.to(ctx.device)
    if ctx.device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs lack it
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(cfg, total))
    amp_dtype, use_scaler = amp_setting(cfg.amp, ctx.device)
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=use_scaler)
    if state is not None:
        _restore(model, opt, sched, scaler, state, where)
    run_model: nn.Module = net
    if ctx.world > 1:
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        # a spandrel model may hold weights its training forward leaves unused (SPAN's eval_conv): a static
        # graph (fixed patches; validation runs the bare net) lets DDP find them at the first step only,
        # not walk the autograd graph at every step as find_unused_parameters does
        run_model = nn.parallel.DistributedDataParallel(net, device_ids=ids, static_graph=bool(record))
    return _Model(model, run_model, opt, sched, scaler, amp_dtype, residual, record, net)


def _restore(model: nn.Module, opt: Any, sched: Any, scaler: Any, state: dict[str, Any], where: str) -> None:
    """A checkpoint's weights, optimizer, schedule, scaler and RNG into this run's; a checkpoint that does
    not fit (another architecture, shapes, a hand-made file) is one RunError naming it."""
    try:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        for group in opt.param_groups:
            for param in group["params"]:
                for name, value in opt.state.get(param, {}).items():
                    if name.startswith("exp_avg") and getattr(value, "shape", None) != param.shape:
                        raise ValueError(f"optimizer state {name} has shape {tuple(value.shape)}, not {tuple(param.shape)}")
        sched.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"]["torch"])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        text = " ".join(line.strip() for line in str(exc).strip().splitlines()[:3])[:200] or type(exc).__name__
        raise RunError(f"{where}: does not fit this {type(model).__name__} x{state['config'].get('scale')} ({text})") from None


def _finite(m: _Model, win: Window | None) -> str | None:
    """What went inf/NaN (the window's loss, the weights), or None: read at log and checkpoint steps only."""
    if not all(bool(torch.isfinite(p).all()) for p in m.model.parameters()):
        return "the weights"
    if win is not None and not bool(torch.isfinite(win.loss)):
        return "the loss"
    return None


def _checkpoint(
    cfg: TrainConfig,
    ctx: Ctx,
    run: RunDir,
    m: _Model,
    loader: SRLoader,
    step: int,
    metrics: Recorder | None,
    win: Window | None = None,
    writer: int = 0,
) -> None:
    """Rank ``writer`` writes (0, or at a preemption the lowest rank not told to stop: the others wait for
    it); the epoch recorded is the one to continue (a finished epoch counts as the next). Never weights
    that went inf/NaN: every rank checks, all stop with :class:`Diverged` together."""
    bad = _finite(m, win)
    if ctx.all_sum([1.0 if bad else 0.0])[0] > 0:
        raise Diverged(diverged_message(cfg, run, step, bad or "another rank's loss or weights"))
    if ctx.rank == writer:
        state = _state(cfg, ctx, m, loader, step)
        assert metrics is not None
        if isinstance(metrics, Standby):
            metrics.take_over(step)  # rank 0's node is going away: this rank records the run from here
        metrics.sync()  # first: OUT's history always reaches the step latest.json names (history.py)
        where = run.save(state, step, cfg.keep_ckpts)
        by = f" (written by rank {writer}: rank 0 was told to stop)" if writer else ""
        log.info("checkpoint: %s%s", where, by)
    elif isinstance(metrics, Standby):
        metrics.synced(step)
    if writer != 0:  # a preemption: no rank exits before the checkpoint is complete
        dist.barrier(group=ctx.cpu_group)


def _state(cfg: TrainConfig, ctx: Ctx, m: _Model, loader: SRLoader, step: int) -> dict[str, Any]:
    """What a checkpoint holds: the same on every rank (DDP keeps the weights and the optimizer in step; the
    data position is global), so any rank may write it."""
    at = loader.state_dict()  # the data position, which also knows a re-planned (elastic) epoch
    return {
        "format": FORMAT,
        "step": step,
        "epoch": at["epoch"],
        "epoch_batches": at["batches"],
        "loader": at,  # the exact data position (wdsr-loader/1)
        "world_size": ctx.world,
        "model": m.model.state_dict(),
        "optimizer": m.opt.state_dict(),
        "scheduler": m.sched.state_dict(),
        "scaler": m.scaler.state_dict(),
        "rng": {"torch": torch.get_rng_state()},
        "threads": torch.get_num_threads(),  # a resume computes with as many (pin_threads)
        "config": {**cfg.dict, "residual": m.residual.value, **m.record},  # the model's variant: what wdsr upscale builds
    }


def _recorder(cfg: TrainConfig, ctx: Ctx, run: RunDir, m: _Model, loader: SRLoader, total: int, step: int) -> Recorder | None:
    """Rank 0's MetricsLog (the history of earlier attempts, up to ``step``); another rank's Standby."""
    if ctx.rank != 0:
        return Standby(run, cfg, step) if ctx.world > 1 else None
    run.start({**cfg.dict, "residual": m.residual.value, **m.record})
    metrics = MetricsLog(run, cfg, step)
    amp = {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}[m.amp_dtype]
    clip, degrade = cfg.dataset.clip, cfg.dataset.degrade
    what = "" if clip is None else f" (windows of {clip.frames} frames, {clip.window})"
    what += "" if degrade is None else f" (LR made on the device: {type(degrade).__name__})"
    log.info(
        "training %s x%d on %s%s: %d batches/epoch/rank, %d ranks, %d steps, amp %s, device %s",
        *(cfg.model.value, cfg.dataset.scale, cfg.data, what, len(loader), ctx.world, total, amp, ctx.device),
    )
    return metrics


def _loop(
    cfg: TrainConfig,
    ctx: Ctx,
    run: RunDir,
    train_ds: SRDataset,
    val_ds: SRDataset | None,
    state: dict[str, Any] | None,
    stop: StopFlag,
) -> int:
    channels = int(sample_meta(train_ds).get("channels", 3))
    loader = make_loader(train_ds, num_workers=cfg.workers, pin_memory=ctx.device.type == "cuda")
    total = cfg.steps if cfg.steps is not None else (cfg.epochs or 1) * len(loader)
    m = _build_model(cfg, ctx, channels, total, state)
    step = int(state["step"]) if state is not None else 0
    if state is not None:
        _resume_data(loader, state, step, ctx.rank)  # the loader now knows the epoch and batch to continue at
    metrics = _recorder(cfg, ctx, run, m, loader, total, step)
    degrade = cfg.dataset.degrade
    degrader = Degrader(degrade).to(ctx.device) if degrade is not None else None
    bar = progress_bar(ctx, total, step)
    clips = cfg.dataset.clip is not None  # validated per clip (REDS4), not per image
    if val_ds is not None and state is None:  # the baseline, once: wdsr plot's reference line
        if clips:
            log_bicubic(ctx, metrics, bar, bicubic_clips(val_ds, cfg, ctx, channels), unit="clips")
        else:
            log_bicubic(ctx, metrics, bar, bicubic_baseline(val_ds, cfg, ctx, channels))
    win = Window(time.perf_counter(), 0.0, 0, torch.zeros((), device=ctx.device))
    last_ckpt = step if state is not None else -1
    vote = Vote(ctx, cfg.ckpt_minutes)
    verdict = Verdict(world=ctx.world)
    try:
        while step < total and not verdict.stop:
            it = iter(loader)  # the loader owns the epoch: the resumed one first, then one more per pass
            epoch = loader.epoch
            try:
                while step < total:
                    t0 = time.perf_counter()
                    item = next(it, None)
                    if item is None:
                        break
                    win.wait += time.perf_counter() - t0
                    if degrader is not None:  # --degrade: (hr, params) -> (lr, hr) on the device
                        x, y = degrader(item)
                    else:
                        x = to_float(item[0].to(ctx.device, non_blocking=True))
                        y = to_float(item[1].to(ctx.device, non_blocking=True))
                    if ctx.device.type == "cuda" and x.ndim == 4:  # clips [B, T, C, h, w]: the model folds T into B
                        x = x.contiguous(memory_format=torch.channels_last)
                    loss, step_lr = m.step(x, y, ctx.device)
                    step += 1
                    win.steps += 1
                    win.loss += loss  # read at log and checkpoint steps only: no device sync per step
                    verdict = vote.read()  # cast after the previous step: the same answer on every rank
                    if bar is not None:
                        bar.update(1)
                    if step % cfg.log_every == 0 or step == total or verdict.stop:
                        log_window(cfg, ctx, metrics, bar, win, step, epoch, step_lr)
                    if val_ds is not None and step % cfg.val_every == 0:
                        sums = validate_clips(m.net, val_ds, cfg, ctx) if clips else validate(m.net, val_ds, cfg, ctx)
                        log_val(cfg, ctx, metrics, bar, sums, step, epoch, unit="clips" if clips else "images")
                        win.t = time.perf_counter()
                    periodic = cfg.ckpt_every and step % cfg.ckpt_every == 0
                    if periodic or step == total or verdict.stop or verdict.checkpoint_due:
                        _checkpoint(cfg, ctx, run, m, loader, step, metrics, win, verdict.writer if verdict.stop else 0)
                        last_ckpt = step
                        vote.checkpointed()
                    if verdict.stop:
                        break
                    if step < total:
                        vote.cast(stop.requested)  # read after the next step, which hides its cost
            finally:
                if hasattr(it, "close"):
                    it.close()
        vote.drain()
        if last_ckpt != step:
            _checkpoint(cfg, ctx, run, m, loader, step, metrics, win)
    except Diverged:
        vote.drain()  # every rank raises at the same step, after casting the same votes
        if isinstance(metrics, MetricsLog):  # the last line of metrics.jsonl says so (plots end there)
            metrics.write({"step": step, "epoch": loader.epoch, "event": "diverged"})
            metrics.sync()
            metrics.close()
        raise
    except BaseException:
        with contextlib.suppress(Exception):  # every rank cast it: waited for, none is left in flight
            vote.drain()
        raise
    writer = verdict.writer if verdict.stop else 0
    _finish(ctx, m, metrics if ctx.rank == writer else None, bar, step, loader.state_dict()["epoch"], verdict.stop)
    if ctx.rank != writer and isinstance(metrics, MetricsLog):  # rank 0, told to stop: another rank recorded
        metrics.close()
    return EXIT_PEER_STOPPED if verdict.stop and not stop.requested else 0


def _finish(ctx: Ctx, m: _Model, metrics: Recorder | None, bar: Any, step: int, epoch: int, stopped: bool) -> None:
    """The last line of metrics.jsonl: whether the run finished or stopped, and the weights of every rank;
    ``metrics`` is the recorder of the rank that writes it (None on the others)."""
    digests = [weights_digest(m.model)]
    if ctx.world > 1:
        gathered: list[Any] = [None] * ctx.world
        dist.all_gather_object(gathered, digests[0], group=ctx.cpu_group)
        digests = gathered
    if bar is not None:
        bar.close()
    if metrics is None:  # not the rank that records
        return
    record = {
        "step": step,
        "epoch": epoch,
        "event": "stopped" if stopped else "finished",
        "weights_sha256": digests,
        "weights_in_sync": len(set(digests)) == 1,
    }
    metrics.write(record)
    metrics.sync()
    metrics.close()
    log.info("%s at step %d (weights identical on all %d ranks: %s)", record["event"], step, ctx.world, record["weights_in_sync"])


def _resume_data(loader: SRLoader, state: dict[str, Any], step: int, rank: int) -> None:
    """Put the loader where the checkpoint's data position was (the loader owns the epoch from here)."""
    epoch = int(state["epoch"])
    saved = state.get("loader")
    if saved is not None:
        try:
            loader.load_state_dict(saved)
        except LoaderStateError as exc:
            if rank == 0:
                log.warning("resuming at step %d: %s; the data continues at the next epoch boundary", step, exc)
        else:
            at = loader.state_dict()
            if rank == 0 and loader.elastic_report is not None:
                log.info(
                    "resuming at step %d: the checkpoint's world was %d x %d, this one is %d x %d; the rest of epoch %d is "
                    "re-planned over it (elastic): %s",
                    step,
                    saved["world_size"],
                    saved["num_workers"],
                    at["world_size"],
                    at["num_workers"],
                    at["epoch"],
                    loader.elastic_report,
                )
            elif rank == 0:
                log.info(
                    "resuming at step %d: epoch %d, batch %d of %d (exact data position)",
                    step,
                    at["epoch"],
                    at["batches"],
                    loader.pass_length(),
                )
            return
    if int(state["epoch_batches"]) > 0:
        if rank == 0 and saved is None:
            log.info("resuming at step %d: the checkpoint has no data position; epoch %d starts afresh", step, epoch + 1)
        loader.set_epoch(epoch + 1)
        return
    if rank == 0:
        log.info("resuming at step %d, epoch %d", step, epoch)
    loader.set_epoch(epoch)
