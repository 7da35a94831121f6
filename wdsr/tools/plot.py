"""``wdsr plot``: a run's curves from ``metrics.jsonl`` as one PNG, drawn with Pillow (no plotting library).

One panel per metric over steps: loss, lr, patches_per_s, data_wait (log lines) and psnr_y,
ssim_y (validation lines), with the val set's bicubic PSNR/SSIM (logged once at step 0) as a dashed
line labelled "bicubic"; a panel without values says so. The file is read by :mod:`wdsr.tools.curves`
(streamed, decimated, bad lines skipped); non-finite values are red ticks on the panel's top edge.
"""

from __future__ import annotations

import io
import posixpath
import sys
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from shardmaker import storage
from wdsr.tools.curves import PANELS, Curve, Metrics, read_metrics, reference, series

__all__ = ["COLS", "LINE", "PANELS", "REF", "PANEL_H", "PANEL_W", "draw", "plot_run", "read_metrics", "series"]
PANEL_W, PANEL_H = 480, 260  # one panel's size
_PAD = 62  # its inner margin (room for the y labels)
COLS = 2
LINE = (31, 119, 180)
BAD = (214, 39, 40)  # the marks of non-finite values
REF = (255, 127, 14)  # the dashed baseline (bicubic)


def _fmt(v: float) -> str:
    return f"{v:.0f}" if 1e4 <= abs(v) < 1e9 else f"{v:.3g}"


def _scale(v: float, lo: float, hi: float) -> float:
    """Where ``v`` lies between ``lo`` and ``hi``, 0..1, even when ``hi - lo`` is past the largest float."""
    if hi <= lo:
        return 0.5
    span = hi - lo
    return (v - lo) / span if span < float("inf") else (v / 2 - lo / 2) / (hi / 2 - lo / 2)


def _y_range(ys: list[float]) -> tuple[float, float]:
    lo, hi = min(ys), max(ys)
    if hi == lo:
        pad = (abs(lo) or 1) * 0.05
        return max(lo - pad, -sys.float_info.max), min(hi + pad, sys.float_info.max)
    return lo, hi


def _dashed(d: ImageDraw.ImageDraw, x0: float, x1: float, y: float, dash: int = 8) -> None:
    """A horizontal dashed line at ``y`` from ``x0`` to ``x1``."""
    x = x0
    while x < x1:
        d.line((x, y, min(x + dash, x1), y), fill=REF, width=2)
        x += 2 * dash


def _panel(name: str, curve: Curve, font: Any, ref: float | None = None) -> Image.Image:
    img = Image.new("RGB", (PANEL_W, PANEL_H), "white")
    d = ImageDraw.Draw(img)
    points, bad = curve.points(), curve.bad_steps()
    title = f"{name} ({curve.nonfinite} NaN/inf: red ticks)" if bad else name
    d.text((_PAD, 8), title, fill="black", font=font)
    x0, y0, x1, y1 = _PAD, _PAD - 18, PANEL_W - 12, PANEL_H - 28
    d.rectangle((x0, y0, x1, y1), outline=(90, 90, 90))
    if not points and not bad:
        d.text((x0 + 10, (y0 + y1) // 2), "no values in this run", fill=(120, 120, 120), font=font)
        return img
    steps = [float(p[0]) for p in points] + [float(s) for s in bad]
    lo_x, hi_x = min(steps), max(steps)

    def px(x: float) -> float:
        return x0 + 4 + _scale(x, lo_x, hi_x) * (x1 - x0 - 8)

    for s in bad:
        d.line((px(s), y0 + 1, px(s), y0 + 9), fill=BAD, width=2)
    d.text((x0, y1 + 6), f"step {lo_x:.0f}", fill="black", font=font)
    if not points:
        d.text((x0 + 10, (y0 + y1) // 2), "no finite values in this run", fill=(120, 120, 120), font=font)
        return img
    lo_y, hi_y = _y_range([p[1] for p in points] + ([] if ref is None else [ref]))

    def py(y: float) -> float:
        return y1 - 4 - _scale(y, lo_y, hi_y) * (y1 - y0 - 8)

    if ref is not None:  # the baseline the model must beat, under the curve
        _dashed(d, x0 + 4, x1 - 4, py(ref))
        d.text((x0 + 8, py(ref) - 12), f"bicubic {_fmt(ref)}", fill=REF, font=font)
    pts = [(px(x), py(y)) for x, y in points]
    if len(pts) > 1:
        d.line(pts, fill=LINE, width=2)
    for cx, cy in pts if len(pts) <= 50 else pts[-1:]:
        d.ellipse((cx - 2.5, cy - 2.5, cx + 2.5, cy + 2.5), fill=LINE)
    d.text((2, y0), _fmt(hi_y), fill="black", font=font)
    d.text((2, y1 - 10), _fmt(lo_y), fill="black", font=font)
    last = f"step {points[-1][0]}: {_fmt(points[-1][1])}"
    d.text((x1 - 7 * len(last), y1 + 6), last, fill="black", font=font)
    return img


def draw(metrics: Metrics, panels: tuple[str, ...] = PANELS) -> Image.Image:
    """The panels, two a row, as one RGB image."""
    font = ImageFont.load_default()
    rows = -(-len(panels) // COLS)
    sheet = Image.new("RGB", (COLS * PANEL_W, rows * PANEL_H), "white")
    for i, name in enumerate(panels):
        panel = _panel(name, metrics.curves[name], font, reference(metrics, name))
        sheet.paste(panel, ((i % COLS) * PANEL_W, (i // COLS) * PANEL_H))
    return sheet


def plot_run(run: str, output: str) -> list[str]:
    """Draw ``run``'s metrics into the PNG ``output`` (local or fsspec URL); the panels that have values."""
    metrics = read_metrics(run)
    buf = io.BytesIO()
    draw(metrics).save(buf, format="PNG")
    fs, path = storage.open_dir(output)
    if storage.is_local(fs):
        fs.makedirs(posixpath.dirname(path) or ".", exist_ok=True)
    storage.write_atomic(fs, path, buf.getvalue())
    return [name for name in PANELS if metrics.curves[name].buckets]
