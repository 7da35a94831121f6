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

    def __init__(self, run: RunDir, cfg: TrainConfig, start: int = 0) -> None:
        self.run = run
        if run.local:
            folder = Path(run.root)
        else:
            folder = Path(cfg.log_dir or tempfile.mkdtemp(prefix="wdsr-train-"))
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / history.NAME
        history.restore(run, self.path, start)
        self.tb = None
        self.tb_uploads: history.Uploads | None = None
        if cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ValueError(
                    "--tensorboard needs the tensorboard package: pip install tensorboard (the 'tensorboard' extra)"
                ) from None
            # an event file per attempt; TensorBoard hides the earlier attempts' steps after ``start``
            self.tb = SummaryWriter(str(folder / "tb"), purge_step=start + 1)
            if not run.local:
                self.tb_uploads = history.Uploads(run, folder / "tb", "tb")
        if not run.local:
            log.info("metrics: %s (copied to %s/%s at each checkpoint)", self.path, run.url, history.NAME)

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if k not in ("step", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, record["step"])
            self.tb.flush()

    def sync(self) -> None:
        """A remote OUT gets the whole history and the TensorBoard files written since the last sync."""
        if not self.run.local and self.path.exists():
            self.run.upload(history.NAME, self.path.read_bytes())
        if self.tb_uploads is not None:
            self.tb_uploads.sync()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.tb_uploads is not None:
            self.tb_uploads.sync()


def progress_bar(ctx: Ctx, total: int, step: int) -> Any:
    """Rank 0's tqdm bar on a terminal (None elsewhere); ``log_window`` sets its loss and patches/s."""
    if ctx.rank != 0 or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=step, unit="step", dynamic_ncols=True)


def emit(metrics: MetricsLog | None, bar: Any, record: dict[str, Any], text: str) -> None:
    if metrics is None:
        return
    metrics.write(record)
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
    cfg: TrainConfig, ctx: Ctx, metrics: MetricsLog | None, bar: Any, win: Window, step: int, epoch: int, lr: float
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


def log_val(cfg: TrainConfig, ctx: Ctx, metrics: MetricsLog | None, bar: Any, sums: list[float], step: int, epoch: int) -> None:
    psnr, ssim, n = ctx.all_sum(sums)
    if n == 0:
        return
    record = {"step": step, "epoch": epoch, "psnr_y": psnr / n, "ssim_y": ssim / n, "val_images": int(n)}
    emit(
        metrics,
        bar,
        record,
        f"val step {step}: PSNR-Y {record['psnr_y']:.3f} dB, SSIM-Y {record['ssim_y']:.4f} ({int(n)} images)",
    )
