"""The training side of ``bench.gpu_check``: the models, a step as ``wdsr train`` takes it, and the timed
loop that measures ``data_wait`` as ``wdsr/train/loop.py`` does (the seconds blocked in ``next()`` on the
loader, over the seconds of the window; the device synchronised at both ends of the window)."""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from shardmaker.errors import MissingExtraError
from wdsr import SRDataset, SRLoader, make_loader, to_float
from wdsr.train.config import Amp
from wdsr.train.loop import amp_setting
from wdsr.train.models import build_model
from wdsr.train.zoo import ZooError
from wdsr.train.zooload import build as build_zoo

log = logging.getLogger("gpu_check")
WARM_MIN = 3  # steps before any window: the first batches, cuDNN's first calls


def build_span(scale: int) -> nn.Module:
    """SPAN at spandrel's defaults (48 features), random weights: what ``wdsr train --model spandrel:SPAN``
    builds (optional: spandrel, whose import needs torchvision)."""
    return build_zoo("spandrel:SPAN", scale)


MODELS: dict[str, Callable[[int], nn.Module]] = {"edsr-baseline": lambda s: build_model("edsr-baseline", s), "span": build_span}


def span_unavailable(scale: int) -> str | None:
    """Why SPAN cannot be built here (spandrel or torchvision missing), or None."""
    try:
        build_span(scale)
    except (ImportError, ZooError, MissingExtraError) as exc:  # spandrel, or its torchvision, missing
        return f"spandrel cannot be used here ({exc})"
    return None


@dataclasses.dataclass
class Trainer:
    """One optimisation step on a uint8 batch, as ``wdsr train`` takes it (L1, Adam, AMP on CUDA)."""

    model: nn.Module
    opt: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    amp: torch.dtype | None
    device: torch.device

    def step(self, lr: torch.Tensor, hr: torch.Tensor) -> torch.Tensor:
        x = to_float(lr.to(self.device, non_blocking=True))
        y = to_float(hr.to(self.device, non_blocking=True))
        if self.device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            out = self.model(x)
        loss = nn.functional.l1_loss(out.float(), y)
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        return loss.detach()


def trainer(name: str, scale: int, device: torch.device) -> Trainer:
    torch.manual_seed(0)
    model = MODELS[name](scale).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's stubs lack it
    amp, scaled = amp_setting(Amp.AUTO, device)
    opt = torch.optim.Adam(model.parameters(), lr=2e-4, betas=(0.9, 0.99))
    return Trainer(model, opt, torch.amp.GradScaler(device.type, enabled=scaled), amp, device)


@dataclasses.dataclass(frozen=True)
class Limits:
    """A run measures ``steps`` steps, or stops at ``run_s`` seconds of window or at the clock's ``end``,
    whichever comes first, but never before ``min_steps``."""

    steps: int
    min_steps: int
    run_s: float
    end: float


@dataclasses.dataclass
class Window:
    start: float = 0.0
    seconds: float = 0.0
    steps: int = 0
    wait: float = 0.0
    first_wait: float = 0.0  # waiting for the first batch of a pass (the workers refill their shuffle buffers)
    passes: int = 0  # epochs that started inside the window

    def add(self, waited: float, first: bool) -> None:
        self.steps += 1
        self.wait += waited
        if first:
            self.first_wait += waited
            self.passes += 1

    def result(self, batch: int) -> dict[str, float]:
        t = max(self.seconds, 1e-9)
        return {
            "steps": self.steps,
            "seconds": self.seconds,
            "step_ms": t / self.steps * 1e3,
            "compute_ms": (t - self.wait) / self.steps * 1e3,
            "data_wait": self.wait / t,
            "data_wait_steady": (self.wait - self.first_wait) / max(t - self.first_wait, 1e-9),
            "patches_per_s": batch * self.steps / t,
            "epoch_starts": self.passes,
        }


def warm_steps(workers: int, shuffle_buffer: int, batch: int) -> int:
    """Steps before the window, past the shuffle buffers' first fill (as ``wdsr bench`` warms up)."""
    return max(WARM_MIN, -(-workers * shuffle_buffer // batch) + 2 * workers)


def timed_steps(loader: SRLoader, step: Callable[[Any], torch.Tensor], warm: int, lim: Limits) -> Window:
    """Steps over passes of ``loader``: ``warm`` of them, then the window (see :class:`Limits`)."""
    win, done = Window(), 0
    while True:
        it, first, got = iter(loader), True, 0
        try:
            while True:
                t0 = time.perf_counter()
                item = next(it, None)
                if item is None:
                    break
                waited = time.perf_counter() - t0
                loss, done, got = step(item), done + 1, got + 1
                if done == warm:
                    float(loss)  # the device catches up: the window starts with an empty queue
                    win.start = time.perf_counter()
                elif done > warm:
                    win.add(waited, first)
                    now = time.perf_counter()
                    if win.steps >= lim.min_steps and (win.steps >= lim.steps or now >= min(win.start + lim.run_s, lim.end)):
                        float(loss)
                        win.seconds = time.perf_counter() - win.start
                        return win
                first = False
        finally:
            if hasattr(it, "close"):
                it.close()
        if not got:
            raise RuntimeError("the loader gave no batch in a whole pass")


def train_run(url: str, dataset: dict[str, Any], model: str, workers: int, device: torch.device, lim: Limits) -> dict[str, float]:
    """``model`` trained on ``url`` with ``workers`` DataLoader workers: the window's numbers."""
    ds = SRDataset(url, seed=0, **dataset)
    c = ds.config
    loader = make_loader(ds, num_workers=workers, pin_memory=device.type == "cuda")
    tr = trainer(model, c.scale, device)
    try:
        win = timed_steps(
            loader, lambda item: tr.step(item[0], item[1]), warm_steps(workers, c.shuffle_buffer, c.batch_size), lim
        )
    finally:
        del loader  # its persistent workers stop
        gc.collect()
    res = win.result(c.batch_size)
    log.info("  %.1f ms/step, data_wait %.1f%%, %.0f patches/s", res["step_ms"], res["data_wait"] * 100, res["patches_per_s"])
    return res


def alone_ms(name: str, scale: int, batch: int, patch: int, steps: int, device: torch.device) -> dict[str, float]:
    """``name`` on one fixed uint8 batch (copied to the device each step, as from the loader): ms per step."""
    tr = trainer(name, scale, device)
    g = torch.Generator().manual_seed(0)
    lr = torch.randint(0, 256, (batch, 3, patch // scale, patch // scale), dtype=torch.uint8, generator=g)
    hr = torch.randint(0, 256, (batch, 3, patch, patch), dtype=torch.uint8, generator=g)
    if device.type == "cuda":
        lr, hr = lr.pin_memory(), hr.pin_memory()
    for _ in range(WARM_MIN):
        loss = tr.step(lr, hr)
    float(loss)
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = tr.step(lr, hr)
    float(loss)
    dt = time.perf_counter() - t0
    log.info("  %.1f ms/step", dt / steps * 1e3)
    return {"step_ms": dt / steps * 1e3, "patches_per_s": batch * steps / dt}
