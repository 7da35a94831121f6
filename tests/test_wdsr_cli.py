"""wdsr bench / preview on real shards."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
from PIL import Image

from shardmaker import format as fmt
from wdsr.config import DatasetConfig
from wdsr.dataset import SRDataset
from wdsr.tools.cli import main
from wdsr.tools.preview import LABEL_H, TRANSFORMS, label_strip, labelled_patches


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


def test_preview_writes_lr_next_to_hr_under_its_label(photo_shards, tmp_path, capsys):
    """Rows are the patches epoch 0 cuts (the stream's own cut_patches), each under the label that
    names its key, index and transform; the LR half is the LR nearest-upscaled."""
    png = tmp_path / "p.png"
    argv = ["preview", str(photo_shards), "-o", str(png), "--scale", "4", "--patch-size", "32", "-n", "6"]
    assert main(argv) == 0
    img = np.asarray(Image.open(png))
    row = LABEL_H + 32 + 4
    assert img.shape == (6 * row - 4, 2 * 32 + 4, 3)
    cfg = DatasetConfig(scale=4, patch_size=32, seed=0)
    got = labelled_patches(str(photo_shards), cfg, 6)
    assert len({label.split()[0] for _, label in got}) == 3  # two patches from each of the first 3 images
    assert len({p.t for p, _ in got}) > 1 and all(label.endswith(TRANSFORMS[p.t]) for p, label in got)
    m = fmt.load(str(photo_shards))
    assert [label.split()[0] for _, label in got] == [k for k in m.shards[0].keys[:3] for _ in range(2)]
    # they are patches training gets: epoch 0 of the stream (k=2, any batch size) holds each of them
    train = SRDataset(str(photo_shards), config=dataclasses.replace(cfg, patches_per_image=2, batch_size=2, return_keys=True))
    streamed = {(key, hr.numpy().tobytes()) for _, hrs, keys in train for hr, key in zip(hrs, keys, strict=True)}
    assert all((label.split()[0], p.hr.tobytes()) in streamed for p, label in got)
    for i, (patch, label) in enumerate(got):
        top = i * row
        np.testing.assert_array_equal(img[top : top + LABEL_H], label_strip(label, 2 * 32 + 4))
        lr, hr = img[top + LABEL_H : top + LABEL_H + 32, :32], img[top + LABEL_H : top + LABEL_H + 32, 36:]
        np.testing.assert_array_equal(lr, patch.lr.transpose(1, 2, 0).repeat(4, axis=0).repeat(4, axis=1))
        np.testing.assert_array_equal(hr, patch.hr.transpose(1, 2, 0))


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


def test_a_dead_dataloader_worker_is_one_line_and_exit_3(monkeypatch, capsys):
    """``WorkerDied`` (a worker killed, e.g. out of memory) ends any command with the contract's code 3
    and one line that says what to do, never a traceback (exit 1, a crash to retry blindly)."""
    from shardmaker.exitcodes import ExitCode
    from wdsr.loader import WorkerDied
    from wdsr.tools import cli

    def dies(args):
        raise WorkerDied([(4242, -9)])

    monkeypatch.setitem(cli._COMMANDS, "bench", dies)
    assert cli.main(["bench", "some/data"]) == ExitCode.WORKER_DIED == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "DataLoader worker (pid 4242) died: killed by signal SIGKILL" in err[0] and "--resume" in err[0]
