"""`wdsr plot` on the metrics.jsonl of a real (tiny) `wdsr train` run: a PNG with one panel per metric."""

from __future__ import annotations

import io
import json

import fsspec
import numpy as np
from PIL import Image

from tests.test_upscale import trained_run
from wdsr.tools.cli import main
from wdsr.tools.plot import COLS, LINE, PANEL_H, PANEL_W, PANELS, REF, read_metrics, series


def _panels(img: Image.Image) -> list[np.ndarray]:
    a = np.asarray(img.convert("RGB"))
    h, w = PANEL_H, PANEL_W
    return [a[(i // COLS) * h : (i // COLS + 1) * h, (i % COLS) * w : (i % COLS + 1) * w] for i in range(len(PANELS))]


def test_plot_draws_every_metric_of_a_real_run(photo_shards, tmp_path_factory, tmp_path, capsys):
    run = trained_run(photo_shards, tmp_path_factory)
    out = tmp_path / "figs" / "curves.png"
    rc = main(["plot", str(run), "-o", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert text.strip() == f"wrote {out}: {', '.join(PANELS)}"  # val lines gave psnr_y/ssim_y
    assert out.stat().st_size > 0
    with Image.open(out) as img:
        assert img.format == "PNG" and img.size == (COLS * PANEL_W, 3 * PANEL_H)
        panels = _panels(img)
    for name, p in zip(PANELS, panels, strict=True):
        curve = np.all(p == LINE, axis=2).sum()  # pixels of the curve's colour: the data were drawn
        assert curve > 300, (name, curve)  # a line across the panel, not only the points
        assert (p < 128).all(axis=2).sum() > 50, name  # titles, axes and labels in black
    assert [s for s, _ in series(read_metrics(str(run)), "loss")] == [3, 6, 9, 12]
    # --val-data: the val set's bicubic PSNR/SSIM, one record at step 0, drawn as a dashed line on their panels
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0 and 10 < first["bicubic_psnr_y"] < 60 and 0 < first["bicubic_ssim_y"] <= 1, first
    m = read_metrics(str(run))
    assert series(m, "bicubic_psnr_y") == [(0.0, first["bicubic_psnr_y"])] and len(series(m, "bicubic_ssim_y")) == 1
    for name, p in zip(PANELS, panels, strict=True):
        dashes = np.all(p == REF, axis=2).sum()
        assert dashes > 200 if name in ("psnr_y", "ssim_y") else dashes == 0, (name, dashes)


def test_plot_reads_and_writes_fsspec_urls_and_says_what_is_missing(photo_shards, tmp_path_factory, capsys):
    run = trained_run(photo_shards, tmp_path_factory)
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_only = "\n".join(json.dumps(r) for r in lines if "loss" in r) + '\n{"step": 13, "lo'  # torn last line
    with fsspec.open("memory://runs/r1/metrics.jsonl", "w") as f:
        f.write(train_only)
    rc = main(["plot", "memory://runs/r1", "-o", "memory://figs/c.png"])
    assert rc == 0
    assert capsys.readouterr().out.strip() == "wrote memory://figs/c.png: loss, lr, patches_per_s, data_wait"
    with fsspec.open("memory://figs/c.png", "rb") as f:
        img = Image.open(io.BytesIO(f.read()))
        panels = _panels(img)
    assert np.all(panels[PANELS.index("psnr_y")] == LINE, axis=2).sum() == 0  # no val lines: an empty panel
    assert np.all(panels[PANELS.index("loss")] == LINE, axis=2).sum() > 300


def test_plot_errors_are_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "metrics.jsonl").write_text('not json\n{"step": true}\n')  # bad lines only
    for run in (tmp_path / "empty", tmp_path / "bad"):
        rc = main(["plot", str(run), "-o", str(tmp_path / "c.png")])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and err.startswith("wdsr plot: error:"), err
    assert not (tmp_path / "c.png").exists()
