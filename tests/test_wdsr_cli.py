"""wdsr bench / preview on real shards."""
from __future__ import annotations

import json

import numpy as np
from PIL import Image

from wdsr.tools.cli import main


def test_bench_prints_table_and_compares(photo_shards, tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = main(["bench", str(photo_shards), "--workers", "1", "--patch-size", "32", "--scale", "2", "-k", "4",
               "--batch-size", "4", "--seconds", "1", "--compare-naive", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert "patches/s" in text and "peak RSS/worker" in text and "wdsr / naive:" in text
    rows = json.loads(out.read_text())
    assert rows[0]["patches_per_s"] > 0 and rows[0]["decode_ms"] > 0 and 0 < rows[0]["decode_share"] <= 1
    assert rows[0]["mb_per_s"] > 0 and rows[0]["peak_rss_mb"] > 0 and len(rows) == 3


def test_bench_with_a_decoded_cache_fills_it_then_decodes_nothing(photo_shards, tmp_path, capsys):
    out = tmp_path / "b.json"
    cache = tmp_path / "dc"
    rc = main(["bench", str(photo_shards), "--workers", "1", "--patch-size", "32", "--scale", "2", "-k", "4",
               "--batch-size", "4", "--seconds", "1", "--decoded-cache", str(cache), "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0 and f"decoded cache {cache}: 10 pairs written" in text
    row = json.loads(out.read_text())[0]
    assert row["patches_per_s"] > 0 and row["decode_ms"] == 0 and row["mb_per_s"] == 0  # every pair from the cache
    assert main(["cache", "info", str(cache)]) == 0 and " 10 " in capsys.readouterr().out


def test_preview_writes_lr_next_to_hr(photo_shards, tmp_path, capsys):
    png = tmp_path / "p.png"
    assert main(["preview", str(photo_shards), "-o", str(png), "--scale", "4", "--patch-size", "32", "-n", "3"]) == 0
    img = np.asarray(Image.open(png))
    assert img.shape == (3 * 32 + 2 * 4, 2 * 32 + 4, 3)
    left, right = img[:32, :32].astype(int), img[:32, 36:].astype(int)
    # the left half is the LR nearest-upscaled: constant 4x4 blocks, close in colour to the HR
    assert (left[::4, ::4] == left[3::4, 3::4]).all()
    assert abs(left.mean() - right.mean()) < 8


def test_errors_are_clear(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "nothing")]) == 2
    assert "no manifest.json" in capsys.readouterr().err
