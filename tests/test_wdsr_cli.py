"""wdsr bench / preview on real shards."""

from __future__ import annotations

import json
import sys

import numpy as np
from PIL import Image

from wdsr.dataset import SRDataset
from wdsr.tools.cli import main
from wdsr.tools.preview import LABEL_H


def test_bench_prints_table_and_compares(photo_shards, tmp_path, capsys):
    out = tmp_path / "b.json"
    rc = main(
        [
            "bench",
            str(photo_shards),
            "--workers",
            "1",
            "--patch-size",
            "32",
            "--scale",
            "2",
            "-k",
            "4",
            "--batch-size",
            "4",
            "--seconds",
            "1",
            "--compare-naive",
            "--json",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    assert "patches/s" in text and "peak RSS/worker" in text and "wdsr / naive:" in text
    rows = json.loads(out.read_text())
    assert rows[0]["patches_per_s"] > 0 and rows[0]["decode_ms"] > 0 and 0 < rows[0]["decode_share"] <= 1
    assert rows[0]["mb_per_s"] > 0 and rows[0]["peak_rss_mb"] > 0 and len(rows) == 3


def test_bench_with_a_decoded_cache_fills_it_then_decodes_nothing(photo_shards, tmp_path, capsys):
    out = tmp_path / "b.json"
    cache = tmp_path / "dc"
    rc = main(
        [
            "bench",
            str(photo_shards),
            "--workers",
            "1",
            "--patch-size",
            "32",
            "--scale",
            "2",
            "-k",
            "4",
            "--batch-size",
            "4",
            "--seconds",
            "1",
            "--decoded-cache",
            str(cache),
            "--json",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0 and f"decoded cache {cache}: 10 pairs written" in text
    row = json.loads(out.read_text())[0]
    assert row["patches_per_s"] > 0 and row["decode_ms"] == 0 and row["mb_per_s"] == 0  # every pair from the cache
    assert main(["cache", "info", str(cache)]) == 0 and " 10 " in capsys.readouterr().out


def test_preview_writes_lr_next_to_hr_under_its_key(photo_shards, tmp_path, capsys):
    png = tmp_path / "p.png"
    assert main(["preview", str(photo_shards), "-o", str(png), "--scale", "4", "--patch-size", "32", "-n", "6"]) == 0
    img = np.asarray(Image.open(png))
    row = LABEL_H + 32 + 4
    assert img.shape == (6 * row - 4, 2 * 32 + 4, 3)
    left, right = img[LABEL_H : LABEL_H + 32, :32].astype(int), img[LABEL_H : LABEL_H + 32, 36:].astype(int)
    # the left half is the LR nearest-upscaled: constant 4x4 blocks, close in colour to the HR
    assert (left[::4, ::4] == left[3::4, 3::4]).all()
    assert abs(left.mean() - right.mean()) < 8
    # each row's label is its key: the same key draws the same strip, another key another one
    ds = SRDataset(
        str(photo_shards), scale=4, patch_size=32, patches_per_image=2, batch_size=6, shuffle_buffer=64, seed=0, return_keys=True
    )
    keys = next(iter(ds))[2]
    strips = [img[i * row : i * row + LABEL_H] for i in range(6)]
    assert len(set(keys)) > 1
    for i in range(6):
        assert (strips[i] < 100).all(axis=2).sum() > 10  # dark text on white
        for j in range(6):
            assert np.array_equal(strips[i], strips[j]) == (keys[i] == keys[j]), (keys[i], keys[j])


def test_the_progress_bar_shows_the_loss_and_patches_per_s(photo_shards, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: rank 0 draws the tqdm bar
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            "--data",
            str(photo_shards),
            "--out",
            str(out),
            "--model",
            "espcn",
            "--patch-size",
            "32",
            "-k",
            "2",
            "--batch-size",
            "2",
            "--workers",
            "0",
            "--steps",
            "4",
            "--log-every",
            "2",
            "--val-every",
            "0",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 0
    last = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x][-1]
    assert f"loss={last['loss']:.4f}, patches_s={last['patches_per_s']:.1f}" in err, err[-500:]
    assert "4/4" in err


def test_errors_are_clear(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "nothing")]) == 2
    assert "no manifest.json" in capsys.readouterr().err
