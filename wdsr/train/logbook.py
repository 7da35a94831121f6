"""Rank 0's record of a run: ``metrics.jsonl`` (+ TensorBoard), the progress bar, and the log lines
of a window of steps (loss, lr, patches/s, data_wait, summed over the ranks) and of a validation."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from shardmaker import storage
from shardmaker.errors import require_extra
from wdsr.train import history
from wdsr.train.checkpoint import Diverged, RunDir
from wdsr.train.config import TrainConfig
from wdsr.train.context import Ctx

log = logging.getLogger("wdsr")


class MetricsLog:
    """Rank 0's ``metrics.jsonl`` and TensorBoard files: OUT's own when OUT is local; in ``--log-dir`` (or a
    temp folder) when it is remote, copied into OUT at each checkpoint and at the end. Either way the
    history of earlier attempts is carried over up to ``start``, the step this attempt starts from
    (:mod:`wdsr.train.history`)."""

    def __init__(self, run: RunDir, cfg: TrainConfig, start: int = 0, standby: bool = False) -> None:
        self.run = run
        if run.local:
            folder = Path(run.root)
        elif standby:  # another rank taking over from rank 0: never rank 0's --log-dir (the same on one node)
            folder = Path(tempfile.mkdtemp(prefix="wdsr-train-standby-"))
        else:
            folder = Path(cfg.log_dir or tempfile.mkdtemp(prefix="wdsr-train-"))
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / history.NAME
        history.restore(run, self.path, start)
        self.tb = None
        self.tb_uploads: history.Uploads | None = None
        if cfg.tensorboard and not standby:
            tb = require_extra("torch.utils.tensorboard", "--tensorboard", package="tensorboard")
            # an event file per attempt; TensorBoard hides the earlier attempts' steps after ``start``
            self.tb = tb.SummaryWriter(str(folder / "tb"), purge_step=start + 1)
            if not run.local:
                self.tb_uploads = history.Uploads(run, folder / "tb", "tb")
        if not run.local:
            log.info("metrics: %s (copied to %s/%s at each checkpoint)", self.path, run.url, history.NAME)

    def write(self, record: dict[str, Any]) -> None:
        with storage.naming(str(self.path)), open(self.path, "a") as f:  # a full disk names metrics.jsonl
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if k not in ("step", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, record["step"])
            self.tb.flush()

    def sync(self) -> None:
        """A remote OUT gets the whole history and the TensorBoard files written since the last sync."""
        if not self.run.local and self.path.exists():
            self.run.upload(history.NAME, storage.read_local(str(self.path)))
        if self.tb_uploads is not None:
            self.tb_uploads.sync()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.tb_uploads is not None:
            self.tb_uploads.sync()


class Standby:
    """Rank 0's stand-in on another rank of a run: the records logged since rank 0 last brought OUT's
    history up to date (every rank computes the same records), so that this rank can write a preemption
    checkpoint, with OUT's history up to its step, when rank 0's node is going away (:meth:`take_over`).
    TensorBoard files rank 0 wrote since its last sync are not carried over."""

    def __init__(self, run: RunDir, cfg: TrainConfig, start: int = 0) -> None:
        self.run, self.cfg = run, cfg
        self.synced_at = start  # OUT's history reaches this step (rank 0's start or its last sync)
        self.records: list[dict[str, Any]] = []
        self.log: MetricsLog | None = None  # once this rank records for the run

    def write(self, record: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.write(record)
        else:
            self.records.append(record)

    def synced(self, step: int) -> None:
        """Rank 0 (or a rank that took over) brought OUT's history up to ``step``."""
        self.synced_at = step
        self.records.clear()

    def take_over(self, step: int) -> None:
        """Record for the run from ``step`` on (rank 0 stops recording): a local OUT's file already holds
        every line up to ``step`` (rank 0 wrote each one there); a remote OUT's holds those up to the last
        sync, and the records since are added here."""
        if self.log is not None:
            return
        self.log = MetricsLog(self.run, self.cfg, step if self.run.local else self.synced_at, standby=True)
        if not self.run.local:
            for record in self.records:
                self.log.write(record)
        self.records.clear()

    def sync(self) -> None:
        if self.log is not None:
            self.log.sync()

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


Recorder = MetricsLog | Standby  # rank 0's MetricsLog, another rank's Standby


def progress_bar(ctx: Ctx, total: int, step: int) -> Any:
    """Rank 0's tqdm bar on a terminal (None elsewhere); ``log_window`` sets its loss and patches/s."""
    if ctx.rank != 0 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=step, unit="step", dynamic_ncols=True)


def emit(metrics: Recorder | None, bar: Any, record: dict[str, Any], text: str) -> None:
    if metrics is None:
        return
    metrics.write(record)
    if isinstance(metrics, Standby):  # rank 0 says it
        return
    if bar is not None:
        bar.write("wdsr: " + text)
    else:
        log.info("%s", text)


@dataclasses.dataclass
class Window:
    """What happened since the last log line, on this rank."""

    t: float  # when the window started
    wait: float  # seconds spent waiting for batches
    steps: int
    loss: torch.Tensor  # summed on the device, read only when logging


def diverged_message(cfg: TrainConfig, run: RunDir | None, step: int, what: str) -> str:
    """One line: what went inf/NaN by which step, and the checkpoint the run can go back to."""
    try:
        run = run or RunDir(cfg.out)
        latest = run.latest()
    except (ValueError, OSError):
        latest = None
    kept = f"{cfg.out}/{latest['path']} (step {latest['step']})" if latest else "none was written"
    return (
        f"training diverged: {what} went inf/NaN by step {step} (--lr {cfg.lr:g}; try a lower one); "
        f"nothing after the last good checkpoint was saved: {kept}"
    )


def log_window(
    cfg: TrainConfig, ctx: Ctx, metrics: Recorder | None, bar: Any, win: Window, step: int, epoch: int, lr: float
) -> None:
    now = time.perf_counter()
    elapsed = max(now - win.t, 1e-9)
    loss_sum, steps_sum, wait_sum, time_sum = ctx.all_sum([float(win.loss), win.steps, win.wait, elapsed])
    if not math.isfinite(loss_sum):  # summed over the ranks: every rank stops here, at the same step
        raise Diverged(diverged_message(cfg, metrics.run if metrics is not None else None, step, "the loss"))
    patches = cfg.dataset.batch_size * steps_sum / max(time_sum / ctx.world, 1e-9)
    record = {
        "step": step,
        "epoch": epoch,
        "loss": loss_sum / max(steps_sum, 1),
        "lr": lr,
        "patches_per_s": patches,
        "data_wait": wait_sum / max(time_sum, 1e-9),
    }
    if bar is not None:  # the bar shows the latest window's numbers between log lines
        bar.set_postfix(loss=f"{record['loss']:.4f}", patches_s=f"{patches:.1f}", refresh=False)
    emit(
        metrics,
        bar,
        record,
        f"step {step} epoch {epoch} loss {record['loss']:.5f} lr {lr:.3g} "
        f"patches/s {patches:.1f} data_wait {record['data_wait']:.1%}",
    )
    win.t, win.wait, win.steps, win.loss = now, 0.0, 0, torch.zeros_like(win.loss)


def log_bicubic(ctx: Ctx, metrics: Recorder | None, bar: Any, sums: list[float], unit: str = "images") -> None:
    """The val set's bicubic PSNR-Y/SSIM-Y (``validate.bicubic_baseline``), one record at step 0; ``unit``:
    what the means are over (``images``, or ``clips``: per-clip means averaged, ``clipvalidate``)."""
    psnr, ssim, n = ctx.all_sum(sums)
    if n == 0:
        return
    record = {"step": 0, "bicubic_psnr_y": psnr / n, "bicubic_ssim_y": ssim / n, f"val_{unit}": int(n)}
    text = f"val bicubic (the baseline): PSNR-Y {psnr / n:.3f} dB, SSIM-Y {ssim / n:.4f} ({int(n)} {unit})"
    emit(metrics, bar, record, text)


def log_val(
    cfg: TrainConfig, ctx: Ctx, metrics: Recorder | None, bar: Any, sums: list[float], step: int, epoch: int, unit: str = "images"
) -> None:
    psnr, ssim, n = ctx.all_sum(sums)
    if n == 0:
        return
    record = {"step": step, "epoch": epoch, "psnr_y": psnr / n, "ssim_y": ssim / n, f"val_{unit}": int(n)}
    emit(
        metrics,
        bar,
        record,
        f"val step {step}: PSNR-Y {record['psnr_y']:.3f} dB, SSIM-Y {record['ssim_y']:.4f} ({int(n)} {unit})",
    )
