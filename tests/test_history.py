"""A run's history across attempts: `OUT/metrics.jsonl` and `OUT/tb` hold every step once, in order, after a
resume by a new pod (a fresh --log-dir) against a real S3 server, with a torn last line repaired."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tests.helpers import S3_BUCKET
from tests.s3server import s3fs_for
from wdsr.jsonl import lines
from wdsr.tools.cli import main
from wdsr.tools.plot import read_metrics, series
from wdsr.train.history import Carried, carry

SMALL = ["--patch-size", "48", "-k", "4", "--batch-size", "4", "--workers", "1", "--shuffle-buffer", "16"]
TORN = b'{"step": 7, "epoch": 0, "lo'  # what a process killed mid-write leaves


def _train(data: Path, out: str, steps: int, *extra: str) -> None:
    argv = ["train", "--data", str(data), "--out", out, "--model", "espcn", *SMALL, "--steps", str(steps)]
    argv += ["--log-every", "1", "--ckpt-every", "2", "--keep-ckpts", "3", "--val-every", "0", *extra]
    assert main(argv) == 0


def _parsed(text: bytes) -> list[dict]:
    assert text.endswith(b"\n")
    return [json.loads(line) for line in text.decode().splitlines()]  # every line whole


def _one_history(records: list[dict], last: int) -> None:
    """Each step's log line once, in step order; the earlier attempt's end (finished at 6) gone with the
    steps it logged after the checkpoint the next attempt resumed from."""
    assert [r["step"] for r in records if "loss" in r] == list(range(1, last + 1)), records
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)
    assert [(r["step"], r["event"]) for r in records if "event" in r] == [(last, "finished")]


def test_a_new_pod_resuming_on_s3_keeps_the_whole_history_and_tensorboard(s3, photo_shards, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fs = s3fs_for(s3.endpoint)
    out = f"{S3_BUCKET}/runs/history"
    _train(photo_shards, f"s3://{out}", 6, "--log-dir", str(tmp_path / "pod1"), "--tensorboard")
    assert [r["step"] for r in _parsed(fs.cat(f"{out}/metrics.jsonl")) if "loss" in r] == [1, 2, 3, 4, 5, 6]
    # the first pod died after its history reached OUT at step 6, before the checkpoint of step 6 was
    # complete (latest.json still names step 4), and something left a torn line at the end
    fs.pipe(f"{out}/latest.json", json.dumps({"step": 4, "path": "checkpoints/step-00000004.pt"}).encode())
    fs.pipe(f"{out}/metrics.jsonl", fs.cat(f"{out}/metrics.jsonl") + TORN)

    _train(photo_shards, f"s3://{out}", 8, "--log-dir", str(tmp_path / "pod2"), "--tensorboard", "--resume")
    _one_history(_parsed(fs.cat(f"{out}/metrics.jsonl")), 8)

    assert main(["plot", f"s3://{out}", "-o", str(tmp_path / "curves.png")]) == 0
    assert [s for s, _ in series(read_metrics(f"s3://{out}"), "loss")] == list(range(1, 9))

    events = sorted(p.rsplit("/", 1)[1] for p in fs.find(f"{out}/tb"))
    assert len(events) == 2 and all(n.startswith("events.out.tfevents.") for n in events), events  # one per pod
    fs.get(f"{out}/tb/", str(tmp_path / "tb"), recursive=True)
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == list(range(1, 9))  # steps 5, 6 of pod 1 purged


def test_a_local_run_resumed_after_a_torn_line_and_replayed_steps_keeps_one_history(photo_shards, tmp_path):
    out = tmp_path / "run"
    _train(photo_shards, str(out), 6)
    (out / "latest.json").write_text(json.dumps({"step": 4, "path": "checkpoints/step-00000004.pt"}))
    with open(out / "metrics.jsonl", "ab") as f:
        f.write(TORN)
    _train(photo_shards, str(out), 8, "--resume")
    _one_history(_parsed((out / "metrics.jsonl").read_bytes()), 8)
    assert [s for s, _ in series(read_metrics(str(out)), "loss")] == list(range(1, 9))


def test_carry_keeps_steps_up_to_the_start_and_repairs_the_tail():
    rec = [json.dumps({"step": s, "loss": s / 10}).encode() + b"\n" for s in range(1, 6)]
    other = b'["not a record, kept"]\n'
    cases = [
        (b"".join(rec) + TORN, 5, rec, Carried(5, 0, True, 0)),
        (b"".join(rec), 3, rec[:3], Carried(3, 2, False, 0)),
        (b"".join(rec)[:-1], 9, rec, Carried(5, 0, False, 0)),  # a whole last line that lost its newline
        (rec[0] + b"{oops\n" + other + b"\xff\xfe\n" + rec[1], 9, [rec[0], other, rec[1]], Carried(3, 0, False, 2)),
        (b"", 0, [], Carried(0, 0, False, 0)),
    ]
    for src, upto, want, counts in cases:
        dst = io.BytesIO()
        assert carry(io.BytesIO(src), dst, upto) == counts, src
        assert dst.getvalue() == b"".join(want), src


def test_lines_over_the_bound_are_skipped_without_reading_them_whole():
    big = b"x" * 300_000
    src = b'{"step": 1}\n' + big + b"\n" + b'{"step": 2}\n' + big
    assert list(lines(io.BytesIO(src), bound=1000)) == [b'{"step": 1}\n', None, b'{"step": 2}\n', None]
    assert list(lines(io.BytesIO(b"a\nbc"))) == [b"a\n", b"bc"]


def test_plot_shows_a_replayed_step_once_with_its_later_value(tmp_path):
    lines_ = [{"step": 1, "loss": 0.9}, {"step": 2, "loss": 0.8}, {"step": 2, "loss": 0.7}, {"step": 3, "loss": 0.6}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines_))
    assert series(read_metrics(str(tmp_path)), "loss") == [(1.0, 0.9), (2.0, 0.7), (3.0, 0.6)]
