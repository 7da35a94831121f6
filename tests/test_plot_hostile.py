"""`wdsr plot` on hostile and unlucky `metrics.jsonl` files: bad lines skipped and counted in one warning,
non-finite values kept off the axes (and marked), memory bounded whatever the lines (measured in a child
under RLIMIT_AS), every series decimated to a bounded number of points."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wdsr.jsonl import MAX_LINE, lines
from wdsr.tools.cli import main
from wdsr.tools.curves import Curve, read_metrics
from wdsr.tools.plot import BAD, COLS, LINE, PANEL_H, PANEL_W, PANELS, draw, series

ROOT = Path(__file__).resolve().parents[1]
CAP = 16 << 20  # what the child may allocate past its imports: the old reader needed 96 MB and 131 MB


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def _rec(**fields: object) -> bytes:
    return json.dumps(fields).encode() + b"\n"


def _panel(img: Image.Image, name: str) -> np.ndarray:
    i = PANELS.index(name)
    a = np.asarray(img.convert("RGB"))
    return a[(i // COLS) * PANEL_H : (i // COLS + 1) * PANEL_H, (i % COLS) * PANEL_W : (i % COLS + 1) * PANEL_W]


def _rows_of(panel: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    return np.nonzero(np.all(panel == colour, axis=2).any(axis=1))[0]


HOSTILE = [  # (line, the reason it is counted under)
    (b'{"step": 7, "epoch": 0, "lo' + _rec(step=5, loss=0.5), "not JSON"),  # a torn line a resume appended to
    (b"not json\n", "not JSON"),
    (b"\xff\xfe{}\n", "not JSON"),
    (b"[" * 100_000 + b"\n", "not JSON"),  # nested past the parser's depth
    (b'{"step": 3, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "not JSON"),
    (b'{"step": 3, "loss": ' + b"9" * 5000 + b"}\n", "not JSON"),  # an int over Python's 4300 digits
    (b"[1, 2]\n", "not a JSON object"),
    (b'"step"\n', "not a JSON object"),
    (_rec(step=True, loss=9.0), "without a step (an integer in [0, 2^53])"),
    (_rec(step=int("9" * 400), loss=9.0), "without a step (an integer in [0, 2^53])"),
    (_rec(step=2.5, loss=9.0), "without a step (an integer in [0, 2^53])"),
    (_rec(step="4", loss=9.0), "without a step (an integer in [0, 2^53])"),
    (_rec(step=-1, loss=9.0), "without a step (an integer in [0, 2^53])"),
    (_rec(loss=9.0), "without a step (an integer in [0, 2^53])"),
    (b'{"step": 3, "loss": "' + b"x" * MAX_LINE + b'"}\n', "over 1 MiB"),
]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_bad_lines_are_skipped_and_counted_in_one_warning(tmp_path, caplog):
    good = [_rec(step=s, loss=1.0 / s, lr=0.1) for s in (1, 2, 3, 4)]
    lines = [good[0], good[1], *(line for line, _ in HOSTILE), good[2], good[3], b'{"step": 5, "loss": 0.']
    _write(tmp_path / "metrics.jsonl", lines)
    rc = main(["plot", str(tmp_path), "-o", str(tmp_path / "c.png")])
    err = _warnings(caplog)
    assert rc == 0 and len(err) == 1, err
    want: dict[str, int] = {}
    for _, reason in HOSTILE:
        want[reason] = want.get(reason, 0) + 1
    want["a half-written last line"] = 1
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(want.items()))
    assert err[0] == f"plot: {tmp_path}/metrics.jsonl: skipped {len(HOSTILE) + 1} lines ({why})"
    m = read_metrics(str(tmp_path))
    assert series(m, "loss") == [(1.0, 1.0), (2.0, 0.5), (3.0, 1 / 3), (4.0, 0.25)]  # never step True = 1
    assert m.records == 4 and sum(m.skipped.values()) == len(HOSTILE) + 1


def test_a_file_of_bad_lines_only_is_one_line_and_exit_2(tmp_path, capsys):
    _write(tmp_path / "metrics.jsonl", [line for line, _ in HOSTILE])
    rc = main(["plot", str(tmp_path), "-o", str(tmp_path / "c.png")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "no metric records" in err and f"skipped {len(HOSTILE)} lines" in err
    assert not (tmp_path / "c.png").exists()


def test_non_finite_values_are_marked_and_never_reach_the_axes(tmp_path, caplog):
    steps = range(1, 41)
    loss = [b"NaN" if s % 5 == 0 else f"{1 + s / 40}".encode() for s in steps]  # every 5th loss NaN
    lr = [b"Infinity" if s == 20 else b"-1e999" if s == 21 else b"9" * 400 if s == 22 else f"{s}".encode() for s in steps]
    lines = [b'{"step": %d, "loss": %s, "lr": %s}\n' % (s, a, b) for s, a, b in zip(steps, loss, lr, strict=True)]
    _write(tmp_path / "metrics.jsonl", lines)
    assert main(["plot", str(tmp_path), "-o", str(tmp_path / "c.png")]) == 0
    assert _warnings(caplog) == [
        f"plot: {tmp_path}/metrics.jsonl: non-finite values (NaN, inf) left off the axes, marked in red: loss 8, lr 3"
    ]
    m = read_metrics(str(tmp_path))
    assert [s for s, _ in series(m, "loss")] == [s for s in steps if s % 5]
    assert [v for _, v in series(m, "lr")] == [s for s in steps if s not in (20, 21, 22)]
    with Image.open(tmp_path / "c.png") as img:
        for name in ("loss", "lr"):
            p = _panel(img, name)
            curve = _rows_of(p, LINE)
            assert curve.size and curve.max() - curve.min() > PANEL_H // 2, name  # finite values span the axis
            assert _rows_of(p, BAD).size, name  # the non-finite ones are marked


def test_a_curve_keeps_bounded_points_with_its_extremes_and_replayed_steps_once():
    c = Curve(cap=100)
    rng = np.random.default_rng(0)
    values = rng.normal(size=100_000)
    values[77_777], values[12_345] = 50.0, -50.0  # spikes a decimation by even spacing would drop
    for s, v in enumerate(values.tolist()):
        c.add(s, v)
    pts = c.points()
    assert len(pts) <= 200 and pts[0][0] <= 1024 and pts[-1][0] >= 100_000 - 1024
    assert (77_777, 50.0) in pts and (12_345, -50.0) in pts
    assert [s for s, _ in pts] == sorted({s for s, _ in pts})
    c.add(60_000, 7.0)  # a resumed attempt replays from 60,000 on: what came after is gone
    assert c.points()[-1] == (60_000, 7.0) and (77_777, 50.0) not in c.points()
    assert max(v for _, v in c.points()) < 50.0


def test_a_resume_replay_replaces_later_lines_of_every_series(tmp_path):
    first = [_rec(step=s, loss=1.0) for s in range(1, 7)] + [_rec(step=6, psnr_y=20.0)]
    second = [_rec(step=s, loss=0.5) for s in range(5, 9)] + [_rec(step=8, psnr_y=25.0)]
    _write(tmp_path / "metrics.jsonl", first + second)
    m = read_metrics(str(tmp_path))
    assert series(m, "loss") == [(float(s), 1.0 if s < 5 else 0.5) for s in range(1, 9)]
    assert series(m, "psnr_y") == [(8.0, 25.0)]  # the dead attempt's validation at step 6 is gone
    draw(m)


def test_chunked_lines_equal_a_split_whatever_the_chunk_and_bound():
    rng = np.random.default_rng(1)
    for _ in range(3000):
        data = bytes(rng.choice(list(b"ab\n"), size=int(rng.integers(0, 40))).tolist())
        bound, chunk = int(rng.integers(0, 8)), int(rng.integers(1, 10))
        pieces = data.split(b"\n")
        want = [p + b"\n" for p in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
        want_ = [None if len(w.rstrip(b"\n")) > bound else w for w in want]
        assert list(lines(io.BytesIO(data), bound, chunk)) == want_, (data, bound, chunk)


def _child(*files: Path) -> subprocess.CompletedProcess[str]:
    """``plot_run`` over ``files`` in a fresh interpreter that may allocate ``CAP`` past its imports."""
    script = textwrap.dedent(f"""
        import resource, sys
        from wdsr.tools.plot import plot_run
        now = next(int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmSize:")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (now + {CAP}, now + {CAP}))
        for f in sys.argv[1:]:
            print(plot_run(f, f + ".png"))
    """)
    return subprocess.run([sys.executable, "-c", script, *map(str, files)], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_plot_memory_is_bounded_whatever_the_lines(tmp_path):
    # 16 MB in one line: the old reader held it three times over (96 MB for 32 MB)
    huge = [_rec(step=1, loss=0.5), b'{"step": 2, "loss": "' + b"x" * CAP + b'"}\n', _rec(step=3, loss=0.25)]
    # 100k short lines (3 MB): the old reader held a dict per line (~65 MB), undecimated points ~45 MB
    many = [b'{"step": %d, "loss": 0.%d}\n' % (s, s % 997) for s in range(1, 100_001)]
    files = [_write(tmp_path / "huge.jsonl", huge), _write(tmp_path / "many.jsonl", many)]
    proc = _child(*files)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["['loss']", "['loss']"]
    assert all(Path(f"{f}.png").stat().st_size > 0 for f in files)
