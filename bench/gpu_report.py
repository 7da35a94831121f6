"""The report of ``bench.gpu_check``: Markdown tables ready for ``bench/README.md``, and the raw numbers."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common import md_table
from bench.gpu_degrade import OpResult
from wdsr.train.config import Amp
from wdsr.train.loop import amp_setting


def meta(device: torch.device, settings: Any, data: Any, elapsed: float, command: str) -> dict[str, Any]:
    """The card, the date, the software and the settings of this run."""
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"
    amp = {None: "off", torch.bfloat16: "bf16", torch.float16: "fp16"}[amp_setting(Amp.AUTO, device)[0]]
    return {
        "card": card,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": command,
        "device": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "amp": amp,
        "settings": dataclasses.asdict(settings),
        "data": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(data).items()},
        "elapsed_s": elapsed,
    }


def _pct(v: float) -> str:
    return f"{v:.1%}"


def _cache(on: bool) -> str:
    return "warm" if on else "off"


def _train_table(rows: list[dict[str, Any]], alone: list[dict[str, Any]]) -> str:
    """The training runs; "of the model alone": their patches/s over the model's alone on a fixed batch
    (100%: the GPU never waited, whatever data_wait says while queued steps still run on the device)."""
    rate = {r["model"]: r["patches_per_s"] for r in alone}

    def of_alone(r: dict[str, Any]) -> str:
        return _pct(r["patches_per_s"] / rate[r["model"]]) if rate.get(r["model"]) else "-"

    head = ["model", "workers", "decoded cache", "ms/step", "data_wait", "data_wait, epoch starts left out", "patches/s"]
    head += ["of the model alone", "steps", "epoch starts"]
    cells = [
        (r["model"], r["workers"], _cache(r["cache"]), f"{r['step_ms']:.1f}", _pct(r["data_wait"]), _pct(r["data_wait_steady"]))
        + (f"{r['patches_per_s']:.0f}", of_alone(r), r["steps"], r["epoch_starts"])
        for r in rows
    ]
    return md_table(head, cells)


def _degrader_table(rows: list[dict[str, Any]], device: str) -> str:
    def within(r: dict[str, Any]) -> str:
        return "-" if r["within"] is None else ("yes" if r["within"] else "**no**")

    cells = [
        (r["name"], f"{r['cpu_ms']:.1f}", f"{r['device_ms']:.1f}", f"{r['max_abs_diff']:.3g}", r["bound_note"], within(r))
        for r in rows
    ]
    return md_table(["", "cpu ms (reference)", f"{device} ms", f"max abs diff {device} - cpu", "bound", "within"], cells)


def _loader_table(rows: list[dict[str, Any]]) -> str:
    cells = [
        (r["workers"], _cache(r["cache"]), f"{r['patches_per_s']:.0f}", f"{r['decode_ms']:.1f}", f"{r['patch_ms']:.3f}")
        for r in rows
    ]
    return md_table(["workers", "decoded cache", "patches/s", "decode ms/sample", "ms/patch"], cells)


def _alone_table(rows: list[dict[str, Any]]) -> str:
    return md_table(
        ["model", "ms/step", "patches/s"], [(r["model"], f"{r['step_ms']:.1f}", f"{r['patches_per_s']:.0f}") for r in rows]
    )


def sections(raw: dict[str, Any]) -> list[str]:
    """The tables with their titles, in the order of the README section."""
    s, dev = raw["settings"], raw["device"]
    n, side = s["degrade"]
    blocks = [
        (
            "Training, a step as `wdsr train` takes it; data_wait as it logs it (seconds waiting for the next batch over "
            "the seconds of the window):",
            raw["train"] and _train_table(raw["train"], raw["alone"]),
        ),
        ("Each model alone on a fixed batch (what the loader has to feed):", raw["alone"] and _alone_table(raw["alone"])),
        ("The loader alone (no model; `wdsr bench`'s harness):", raw["loader"] and _loader_table(raw["loader"])),
        (
            f"The Degrader on {n} x {side}^2 real-photo patches, {dev} against the CPU (torch threads: {raw['threads']}), "
            f"best of {s['repeat']}, TF32 off:",
            raw["degrader"]["ops"] and _degrader_table(raw["degrader"]["ops"], dev),
        ),
    ]
    return [line for title, table in blocks if table for line in (title, "", table, "")]


def _raw(done: Sequence[tuple[Any, Any]]) -> dict[str, Any]:
    """The results by kind (rows of plain values)."""
    raw: dict[str, Any] = {"train": [], "alone": [], "loader": [], "degrader": {"checked": False, "equal": None, "ops": []}}
    for task, res in done:
        key = {"train": "train", "model alone": "alone", "loader alone": "loader"}.get(task.kind.value)
        if key is not None:
            raw[key].append({"model": task.model, "workers": task.workers, "cache": task.cache, **res})
            continue
        ops: list[OpResult] = res
        bounded = [r.within for r in ops if r.within is not None]
        raw["degrader"] = {
            "checked": bool(bounded),
            "equal": all(bounded) if bounded else None,
            "ops": [{**dataclasses.asdict(r), "within": r.within} for r in ops],
        }
    return raw


def render(meta: dict[str, Any], done: Sequence[tuple[Any, Any]], skipped: list[str], target: dict[str, Any]) -> tuple[str, dict]:
    """(the Markdown report, the raw numbers)."""
    raw = {**meta, "target": target, "skipped": skipped, **_raw(done)}
    s, d = meta["settings"], meta["data"]
    w, h = d["frame_wh"]
    head = (
        f"`{meta['command']}`: {meta['date']}, **{meta['card']}**, torch {meta['torch']} (CUDA {meta['cuda']}), "
        f"{meta['cores']} cores; {d['frames']} frames of {w} x {h} (real-photo mosaics), x{s['scale']} PNG shards; HR patch "
        f"{s['patch']}, batch {s['batch']}, k={s['k']}, shuffle buffer {s['shuffle_buffer']}; AMP {meta['amp']}; decoded cache "
        f"{d['decoded_bytes'] / 1e9:.2f} GB in {d['cache']} (filled in {d['cache_fill_s']:.1f} s); "
        f"{meta['elapsed_s']:.0f} s in all"
    )
    lines = [f"### {meta['card']}, {meta['date'][:10]}", "", head, "", target["text"], "", *sections(raw)]
    if raw["degrader"]["checked"]:
        verdict = "equal within the documented bound" if raw["degrader"]["equal"] else "**not** within the documented bound"
        lines += [f"Degrader {meta['device']} against cpu: {verdict}.", ""]
    lines += ["Skipped:" if skipped else "Skipped: nothing.", *(f"- {line}" for line in skipped)]
    return "\n".join(lines), raw


def numbers(raw: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """Every number in ``raw`` with its path (``train.0.data_wait``)."""
    if isinstance(raw, dict):
        for k, v in raw.items():
            yield from numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(raw, list):
        for i, v in enumerate(raw):
            yield from numbers(v, f"{path}.{i}")
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
        yield path, float(raw)


def write(out: Path, text: str, raw: dict[str, Any]) -> None:
    """Print the report; keep it in ``out`` and the raw numbers in ``out`` with the suffix ``.json``."""
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1))
