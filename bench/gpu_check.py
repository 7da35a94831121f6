"""Does the loader keep one GPU fed? One script, at most 8 minutes on a CUDA machine, no network needed.

    python -m bench.gpu_check [--out bench/out/gpu_check.md] [--work bench/out/gpu_check] [--budget 480]
    python -m bench.gpu_check --device cpu --quick --out /tmp/gpu_check.md    # the dry run: tiny data, a few steps

It builds its own data (the 4K real-photo mosaics of ``bench/common.py``, x4 PNG shards) and measures, for
EDSR-baseline (``wdsr train``'s) and SPAN (spandrel's), HR patch 192, x4, batch 16, k=16:

- a short training loop as ``wdsr train`` runs it (L1, Adam, AMP on CUDA, channels_last) with 2, 4, 8 and
  16 DataLoader workers, the decoded cache off and warm: ms per step and ``data_wait``, the share of the
  step spent waiting for the next batch, timed as ``wdsr/train/loop.py`` times it;
- each model alone on a fixed batch (the patches/s the loader has to feed it);
- the loader alone (no model): patches/s at the same worker counts (``wdsr bench``'s harness);
- the Degrader on the device against the CPU (``bench/gpu_degrade.py``).

It prints a Markdown report (the card, the date, the tables, the target "data_wait < 5% of the step for
EDSR-baseline with 8 workers": met or not) and writes it to ``--out``, the raw numbers beside it
(``.json``). The time guard shares what is left of ``--budget`` among the runs still to do: a run measures
fewer steps when time is short, and a run that no longer fits is skipped and listed.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import logging
import math
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench import gpu_data, gpu_degrade, gpu_report
from bench.gpu_train import Limits, alone_ms, span_unavailable, train_run
from wdsr.tools.bench import bench_stream, fill_decoded_cache

log = logging.getLogger("gpu_check")
TARGET_WORKERS, TARGET_SHARE = 8, 0.05


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one check runs; :data:`FULL` and :data:`QUICK` are the two presets."""

    device: str
    workers: tuple[int, ...]
    frames: int
    frame_wh: tuple[int, int]
    patch: int
    batch: int
    k: int  # patches per image
    shuffle_buffer: int
    steps: int  # measured steps a training run aims at
    min_steps: int  # measured steps a training run always takes
    run_s: float  # measured seconds of a training run, at most
    loader_s: float  # measured seconds of the loader alone
    model_steps: int  # timed steps of a model alone
    degrade: tuple[int, int]  # the Degrader check's batch: patches, side
    repeat: int  # timings of a Degrader op: the best of
    budget_s: float
    min_run_s: float  # a run whose share of the budget is under this is skipped
    scale: int = 4

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"--device must be cpu or cuda, got {self.device!r}")
        if not self.workers or min(self.workers) < 1:
            raise ValueError(f"--workers must be counts >= 1, got {self.workers}")
        w, h = self.frame_wh
        if not (self.patch <= min(w, h) and w <= gpu_data.FRAME_WH[0] and h <= gpu_data.FRAME_WH[1]):
            raise ValueError(f"frames of {w} x {h} must hold the HR patch {self.patch} and fit in {gpu_data.FRAME_WH}")
        if self.patch % self.scale:
            raise ValueError(f"the HR patch {self.patch} is not a multiple of the scale {self.scale}")
        counts = (self.frames, self.batch, self.k, self.steps, self.min_steps, self.model_steps, self.repeat, *self.degrade)
        if min(counts) < 1 or self.min_steps > self.steps:
            raise ValueError(f"counts must be >= 1 and min_steps <= steps: {self}")
        if not (self.budget_s > 0 and self.run_s > 0 and self.loader_s > 0 and self.min_run_s >= 0):
            raise ValueError(f"--budget and the run times must be positive: {self}")


FULL: dict[str, Any] = dict(
    workers=(2, 4, 8, 16), frames=128, frame_wh=(3840, 2160), patch=192, batch=16, k=16, shuffle_buffer=64,
    steps=400, min_steps=20, run_s=10.0, loader_s=5.0, model_steps=50, degrade=(12, 256), repeat=3,
    budget_s=480.0, min_run_s=4.0,
)  # fmt: skip
QUICK: dict[str, Any] = dict(
    workers=(2,), frames=6, frame_wh=(480, 320), patch=32, batch=4, k=4, shuffle_buffer=4,
    steps=4, min_steps=2, run_s=60.0, loader_s=0.2, model_steps=2, degrade=(2, 128), repeat=1,
    budget_s=120.0, min_run_s=0.0,
)  # fmt: skip


class Budget:
    """What is left of the script's time, and the share of it that the next run may take."""

    RESERVE_S = 5.0  # the report and the clean-up

    def __init__(self, seconds: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.start = clock()
        self.end = self.start + seconds

    def left(self) -> float:
        return self.end - self.clock()

    def spent(self) -> float:
        return self.clock() - self.start

    def share(self, runs: int, least: float) -> float | None:
        """Seconds for the next of ``runs`` runs still to do: an equal part of what is left; when that is
        under ``least``, what is left shared by the runs that ``least`` each lets fit (those at the tail will
        be skipped); None when not even one fits."""
        usable = max(0.0, self.left() - self.RESERVE_S)
        if least <= 0:
            return usable / max(1, runs)
        fit = min(runs, int(usable // least))
        return usable / fit if fit else None


class Kind(str, enum.Enum):
    DEGRADER = "degrader"
    ALONE = "model alone"
    TRAIN = "train"
    LOADER = "loader alone"


@dataclasses.dataclass(frozen=True)
class Task:
    kind: Kind
    model: str = ""
    workers: int = 0
    cache: bool = False

    @property
    def name(self) -> str:
        parts = [self.kind.value, self.model, f"{self.workers} workers" if self.workers else ""]
        return ", ".join(p for p in parts if p) + (", decoded cache" if self.cache else "")


TARGET = Task(Kind.TRAIN, "edsr-baseline", TARGET_WORKERS)


def plan(workers: Sequence[int], models: Sequence[str]) -> list[Task]:
    """Every run, most wanted first (what a short budget skips is the tail): the Degrader, the models
    alone, the target run, EDSR-baseline's other runs, the loader alone, then the other models."""
    runs = [(w, c) for c in (False, True) for w in workers]
    train = [Task(Kind.TRAIN, m, w, c) for m in models for w, c in runs]
    first = [t for t in train if t == TARGET]
    edsr = [t for t in train if t.model == "edsr-baseline" and t != TARGET]
    return [
        Task(Kind.DEGRADER),
        *(Task(Kind.ALONE, m) for m in models),
        *first,
        *edsr,
        *(Task(Kind.LOADER, "", w, c) for w, c in runs),
        *(t for t in train if t.model != "edsr-baseline"),
    ]


def run_tasks(tasks: Sequence[Task], budget: Budget, min_s: float, run: Callable[[Task, float], Any]) -> tuple[list, list[str]]:
    """``run(task, seconds)`` for each task while the budget gives it at least ``min_s`` seconds (the most
    wanted first): ([(task, result)], [lines naming the runs skipped])."""
    done, skipped = [], []
    for i, task in enumerate(tasks):
        share = budget.share(len(tasks) - i, min_s)
        if share is None:
            skipped.append(f"{task.name}: skipped by the time guard ({budget.left():.0f} s left for {len(tasks) - i} runs)")
            log.warning(skipped[-1])
            continue
        log.info("%s (up to %.0f s)", task.name, share)
        done.append((task, run(task, share)))
    return done, skipped


@dataclasses.dataclass
class Runner:
    """Runs one task on the data built for this check."""

    s: Settings
    device: torch.device
    url: str
    cache: Path

    def __call__(self, task: Task, seconds: float) -> Any:
        s, cache = self.s, str(self.cache) if task.cache else None
        if task.kind is Kind.DEGRADER:
            return gpu_degrade.check(self.device, *s.degrade, s.repeat)
        if task.kind is Kind.ALONE:
            return alone_ms(task.model, s.scale, s.batch, s.patch, s.model_steps, self.device)
        if task.kind is Kind.LOADER:
            seconds = max(0.05, min(s.loader_s, seconds / 2))  # the rest: workers start, buffers fill
            r = bench_stream(
                self.url,
                task.workers,
                s.batch,
                s.k,
                s.patch,
                s.scale,
                seconds,
                shuffle_buffer=s.shuffle_buffer,
                decoded_cache=cache,
            )
            return {
                "patches_per_s": r.patches_per_s,
                "decode_ms": r.decode_ms,
                "patch_ms": r.patch_ms,
                "first_batch_s": r.first_batch_s,
            }
        dataset = dict(
            scale=s.scale, patch_size=s.patch, patches_per_image=s.k, batch_size=s.batch, shuffle_buffer=s.shuffle_buffer
        )
        limits = Limits(s.steps, s.min_steps, s.run_s, time.perf_counter() + seconds)
        return train_run(self.url, {**dataset, "decoded_cache": cache}, task.model, task.workers, self.device, limits)


def target(done: Sequence[tuple[Task, Any]]) -> dict[str, Any]:
    """The target line: EDSR-baseline, 8 workers, decoded cache off: data_wait under 5% of the step."""
    want = f"data_wait < {TARGET_SHARE:.0%} of the step for EDSR-baseline with {TARGET_WORKERS} workers"
    got = next((r for t, r in done if t == TARGET), None)
    if got is None:
        return {"text": f"Target: {want}: **not measured** (no such run here)", "met": None, "data_wait": None}
    met = got["data_wait"] < TARGET_SHARE
    verdict = "met" if met else "not met"
    return {
        "text": f"Target: {want}: **{verdict}** ({got['data_wait']:.1%}, decoded cache off)",
        "met": met,
        "data_wait": got["data_wait"],
    }


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Settings]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--quick", action="store_true", help="the dry run: tiny frames, 2 workers, a few steps")
    ap.add_argument("--out", default="bench/out/gpu_check.md", help="the report (Markdown); its .json beside it")
    ap.add_argument("--work", default="bench/out/gpu_check", help="frames and shards, reused by a later run")
    ap.add_argument("--cache-dir", help="the decoded cache (default: under /dev/shm when it has room, else --work)")
    ap.add_argument("--budget", type=float, help="seconds for the whole check (default 480; --quick 120)")
    ap.add_argument("--workers", help="DataLoader worker counts, e.g. 2,4,8,16 (default; --quick 2)")
    args = ap.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    if args.budget is not None:
        preset["budget_s"] = args.budget
    if args.workers:
        try:
            preset["workers"] = tuple(int(w) for w in args.workers.split(","))
        except ValueError:
            raise ValueError(f"--workers must be counts like 2,4,8,16, got {args.workers!r}") from None
    return args, Settings(device=args.device, **preset)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="gpu_check %(relativeCreated)7.0f ms: %(message)s")
    try:
        args, s = parse(argv)
    except ValueError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    if s.device == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu_check: --device cuda: torch {torch.__version__} sees no CUDA device; the dry run is --device cpu --quick",
            file=sys.stderr,
        )
        return 2
    budget, device, work = Budget(s.budget_s), torch.device(s.device), Path(args.work)
    models, skipped = ["edsr-baseline"], []
    why = span_unavailable(s.scale)
    models += [] if why else ["span"]
    skipped += [f"SPAN: skipped: {why}"] if why else []
    data = gpu_data.prepare(work, s.frames, s.frame_wh, s.scale, args.cache_dir)
    made_cache = not data.cache.exists()
    data.cache_fill_s = fill_decoded_cache(data.url, s.scale, str(data.cache), None, max(s.workers))[1]
    try:
        done, late = run_tasks(plan(s.workers, models), budget, s.min_run_s, Runner(s, device, data.url, data.cache))
    finally:
        if made_cache:
            shutil.rmtree(data.cache, ignore_errors=True)
    command = " ".join(["python -m bench.gpu_check", *(sys.argv[1:] if argv is None else argv)])
    meta = gpu_report.meta(device, s, data, budget.spent(), command)
    text, raw = gpu_report.render(meta, done, skipped + late, target(done))
    gpu_report.write(Path(args.out), text, raw)
    bad = [k for k, v in gpu_report.numbers(raw) if not math.isfinite(v)]
    if bad:
        log.warning("numbers that are not finite: %s", ", ".join(bad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
