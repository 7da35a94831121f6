"""``wdsr plot``: a run's curves from ``metrics.jsonl`` as one PNG, drawn with Pillow (no plotting library).

One panel per metric over steps: loss, lr, patches_per_s, data_wait (log lines) and psnr_y,
ssim_y (validation lines); a panel without values says so.
"""

from __future__ import annotations

import io
import json
import posixpath
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from shardmaker import storage

PANELS = ("loss", "lr", "psnr_y", "ssim_y", "patches_per_s", "data_wait")
PANEL_W, PANEL_H = 480, 260  # one panel's size
_PAD = 62  # its inner margin (room for the y labels)
COLS = 2
LINE = (31, 119, 180)


def read_metrics(run: str) -> list[dict[str, Any]]:
    """The records of ``RUN/metrics.jsonl`` (or of a ``.jsonl`` file named directly); a torn last line is skipped."""
    url = run if run.endswith(".jsonl") else posixpath.join(run.rstrip("/"), "metrics.jsonl")
    fs, path = storage.open_dir(url)
    try:
        text = storage.read_bytes(fs, path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise FileNotFoundError(f"{url}: no such file (is {run} a wdsr train run folder?)") from None
    records = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue  # a run still writing: its last line may be incomplete
            raise ValueError(f"{url}:{i + 1}: not a JSON line") from None
        if isinstance(d, dict) and isinstance(d.get("step"), int):
            records.append(d)
    if not records:
        raise ValueError(f"{url}: no metric records (JSON lines with a 'step')")
    return records


def series(records: list[dict[str, Any]], name: str) -> list[tuple[float, float]]:
    """``name``'s (step, value) points in step order; a step given twice (a history written before runs
    carried it over, with the steps a resumed run logged again) keeps its later value."""
    points = {
        float(r["step"]): float(r[name])
        for r in records
        if isinstance(r.get(name), (int, float)) and not isinstance(r.get(name), bool)
    }
    return sorted(points.items())


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"


def _panel(name: str, points: list[tuple[float, float]], font: Any) -> Image.Image:
    img = Image.new("RGB", (PANEL_W, PANEL_H), "white")
    d = ImageDraw.Draw(img)
    d.text((_PAD, 8), name, fill="black", font=font)
    x0, y0, x1, y1 = _PAD, _PAD - 18, PANEL_W - 12, PANEL_H - 28
    d.rectangle((x0, y0, x1, y1), outline=(90, 90, 90))
    if not points:
        d.text((x0 + 10, (y0 + y1) // 2), "no values in this run", fill=(120, 120, 120), font=font)
        return img
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    lo_x, hi_x, lo_y, hi_y = min(xs), max(xs), min(ys), max(ys)
    if hi_y == lo_y:
        lo_y, hi_y = lo_y - (abs(lo_y) or 1) * 0.05, hi_y + (abs(hi_y) or 1) * 0.05

    def at(x: float, y: float) -> tuple[float, float]:
        fx = (x - lo_x) / (hi_x - lo_x) if hi_x > lo_x else 0.5
        return x0 + 4 + fx * (x1 - x0 - 8), y1 - 4 - (y - lo_y) / (hi_y - lo_y) * (y1 - y0 - 8)

    pts = [at(x, y) for x, y in points]
    if len(pts) > 1:
        d.line(pts, fill=LINE, width=2)
    for px, py in pts if len(pts) <= 50 else pts[-1:]:
        d.ellipse((px - 2.5, py - 2.5, px + 2.5, py + 2.5), fill=LINE)
    d.text((2, y0), _fmt(hi_y), fill="black", font=font)
    d.text((2, y1 - 10), _fmt(lo_y), fill="black", font=font)
    d.text((x0, y1 + 6), f"step {lo_x:.0f}", fill="black", font=font)
    last = f"step {hi_x:.0f}: {_fmt(ys[-1])}"
    d.text((x1 - 7 * len(last), y1 + 6), last, fill="black", font=font)
    return img


def draw(records: list[dict[str, Any]], panels: tuple[str, ...] = PANELS) -> Image.Image:
    """The panels, two a row, as one RGB image."""
    font = ImageFont.load_default()
    rows = -(-len(panels) // COLS)
    sheet = Image.new("RGB", (COLS * PANEL_W, rows * PANEL_H), "white")
    for i, name in enumerate(panels):
        sheet.paste(_panel(name, series(records, name), font), ((i % COLS) * PANEL_W, (i // COLS) * PANEL_H))
    return sheet


def plot_run(run: str, output: str) -> list[str]:
    """Draw ``run``'s metrics into the PNG ``output`` (local or fsspec URL); the panels that have values."""
    records = read_metrics(run)
    buf = io.BytesIO()
    draw(records).save(buf, format="PNG")
    fs, path = storage.open_dir(output)
    if storage.is_local(fs):
        fs.makedirs(posixpath.dirname(path) or ".", exist_ok=True)
    storage.write_atomic(fs, path, buf.getvalue())
    return [name for name in PANELS if series(records, name)]
