"""`wdsr train` against hostile and unlucky input: a latest.json that points outside OUT, a YAML
"billion laughs", out-of-range or non-finite settings, settings given twice, a run that diverges,
checkpoints that are truncated, garbage, pickle payloads or of another shape; and a fuzz of the
train config. Each ends in one line and a known exit status, within bounded time and memory."""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import ROOT, descendants, wait_until
from wdsr.tools.cli import main
from wdsr.train.checkpoint import FORMAT, RunDir, RunError, checkpoint_path
from wdsr.train.config import CLIP_KEYS, DATASET_KEYS, ConfigError, TrainConfig, make_config
from wdsr.train.models import ESPCN, build_model

SMALL = ["--model", "espcn", "--patch-size", "48", "-k", "4", "--batch-size", "4", "--shuffle-buffer", "16", "--val-every", "0"]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture(scope="module")
def trained(photo_shards, tmp_path_factory) -> Path:
    """A finished 2-step run (checkpoints at steps 1 and 2), copied by each test that edits it."""
    out = tmp_path_factory.mktemp("trained") / "run"
    assert main(_train_argv(photo_shards, out, 2, "--ckpt-every", "1", "--log-every", "1")) == 0
    return out


def _train_argv(photo_shards, out: Path, steps: int, *more: str) -> list[str]:
    return ["train", "--data", str(photo_shards), "--out", str(out), *SMALL, "--workers", "0", "--steps", str(steps), *more]


def resume_check(photo_shards, out: Path, *more: str) -> int:
    return main(_train_argv(photo_shards, out, 4, "--resume", "--check", *more))


# ---- 1. latest.json names a checkpoint of this run folder, and nothing else ------------------------
@pytest.mark.parametrize(
    "path",
    [
        "ABS",  # an absolute path to a real, valid checkpoint outside OUT
        "../elsewhere/checkpoints/step-00000002.pt",
        "checkpoints/../../elsewhere/checkpoints/step-00000002.pt",
        "./checkpoints/step-00000002.pt",
        "checkpoints//step-00000002.pt",
        "run.json",
        "metrics.jsonl",
        "checkpoints/step-2.pt",
        ["checkpoints/step-00000002.pt"],
        "x" * 100_000,
    ],
)
def test_latest_json_naming_anything_but_a_checkpoint_under_out_is_refused(photo_shards, trained, tmp_path, capsys, path):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    elsewhere = tmp_path / "elsewhere" / "checkpoints"
    elsewhere.mkdir(parents=True)
    shutil.copy(out / "checkpoints" / "step-00000002.pt", elsewhere)  # a loadable checkpoint, outside OUT
    if path == "ABS":
        path = str(elsewhere / "step-00000002.pt")
    (out / "latest.json").write_text(json.dumps({"step": 2, "path": path}))
    assert resume_check(photo_shards, out) == 2
    err = one_line(capsys)
    assert "latest.json: 'path' must be checkpoints/step-NNNNNNNN.pt" in err and len(err) < 400, err


@pytest.mark.parametrize(
    "latest",
    [
        {"step": 1, "path": "checkpoints/step-00000002.pt"},
        {"step": True, "path": "checkpoints/step-00000001.pt"},
        {"path": "checkpoints/step-00000002.pt"},
    ],
)
def test_latest_json_step_must_be_the_step_its_path_names(photo_shards, trained, tmp_path, capsys, latest):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    (out / "latest.json").write_text(json.dumps(latest))
    assert resume_check(photo_shards, out) == 2
    assert "latest.json: 'step' must be" in one_line(capsys)


@pytest.mark.parametrize(
    "value",
    [
        "/other-bucket/checkpoints/step-00000001.pt",  # on S3, joined to OUT's bucket path: another bucket
        "s3://other-bucket/run/checkpoints/step-00000001.pt",
        "other-bucket/checkpoints/step-00000001.pt",
        "checkpoints/step-00000001.pt/../../../other-bucket/x",
        "checkpoints\\step-00000001.pt",
        "checkpoints/step-\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0661.pt",  # Arabic-Indic digits match a plain \d
        "checkpoints/step-00000001.pt\n",
        "checkpoints/step-" + "1" * 5000 + ".pt",
        None,
        7,
        {"path": "checkpoints/step-00000001.pt"},
    ],
)
def test_the_checkpoint_path_rule_refuses_every_other_name(value):
    with pytest.raises(RunError, match="'path' must be checkpoints/step-NNNNNNNN.pt") as info:
        checkpoint_path(value, "s3://bucket/run/latest.json")
    assert len(str(info.value)) < 300
    assert checkpoint_path("checkpoints/step-00001000.pt", "x") == ("checkpoints/step-00001000.pt", 1000)


def test_on_an_object_store_latest_json_cannot_reach_another_bucket():
    run = RunDir("memory://bucket-a/run")
    run.fs.pipe("/bucket-b/checkpoints/step-00000001.pt", b"someone else's")
    run.fs.pipe(run.path("latest.json"), json.dumps({"step": 1, "path": "/bucket-b/checkpoints/step-00000001.pt"}).encode())
    with pytest.raises(RunError, match="latest.json: 'path' must be"):
        run.load_latest()


# ---- 2. a YAML billion laughs, a FIFO, a huge file: bounded time and memory, one line ---------------
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)

_DRIVER = """
import contextlib, io, json, sys
from wdsr.tools.cli import main
results = []
for path in sys.argv[3:]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["train", "--data", sys.argv[1], "--out", sys.argv[2], "--config", path, "--check"])
    results.append([path, rc, err.getvalue()])
print(json.dumps({"results": results, "peak_rss_kb": int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))}))  # VmHWM, not ru_maxrss (the parent's peak)
"""


def test_billion_laughs_fifo_and_huge_config_files_end_quickly_in_one_line(photo_shards, tmp_path):
    """Run in a child capped at 3 GiB of address space (the laughs expand to 9^9 items: tens of GB as
    a repr), its peak RSS reported, with a 60 s guard against hangs only. A FIFO would block a plain
    open() for ever."""
    bombs = {
        "model": "model: *i\n",
        "lr": "lr: *i\n",
        "on_error": "on_error: *i\n",
        "retry": "retry: {attempts: *i}\n",
        "dataset": "dataset: *i\n",
        "a key": "? *i\n: 1\n",
        "a nested value": "dataset: {seed: *i}\n",
    }
    files = []
    for i, tail in enumerate(bombs.values()):
        (tmp_path / f"bomb{i}.yaml").write_text(LAUGHS + tail)
        files.append(tmp_path / f"bomb{i}.yaml")
    whole = tmp_path / "whole.yaml"  # the document itself a bomb: a list of aliases of lists
    whole.write_text(
        "- &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(f"- &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
    )
    big = tmp_path / "big.yaml"
    big.write_text("data: x\n" + "# padding\n" * 120_000)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    files += [whole, big, fifo]

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(photo_shards), str(tmp_path / "run"), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=cap,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["peak_rss_kb"] < 1 << 20, report["peak_rss_kb"]  # under 1 GiB: torch's import and little more
    results = report["results"]
    for path, rc, err in results:
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and len(lines[0]) < 1000, (path, rc, err[:2000])
        assert Path(path).name in lines[0]
    why = {Path(p).name: e for p, _, e in results}
    assert "once YAML aliases are expanded" in why["whole.yaml"]
    assert "over 1 MiB" in why["big.yaml"] and "is a FIFO" in why["fifo.yaml"]
    assert not (tmp_path / "run").exists()


# ---- 3. every setting checked up front: flags and files alike ---------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--lr", "inf"], "--lr must be a finite number in (0, 1], got inf"),
        (["--lr", "1e400"], "--lr must be a finite number"),
        (["--lr", "nan"], "--lr must be a finite number"),
        (["--lr", "0"], "--lr must be a finite number in (0, 1]"),
        (["--lr", "5"], "--lr must be a finite number in (0, 1]"),
        (["--lr-gamma", "nan"], "--lr-gamma must be"),
        (["--lr-gamma", "-1"], "--lr-gamma must be"),
        (["--lr-gamma", "2"], "--lr-gamma must be"),
        (["-k", str(10**21)], "--patches-per-image must be an integer in [1, 65536]"),
        (["-k", "0"], "--patches-per-image must be an integer in [1, 65536]"),
        (["--seed", str(10**23)], "--seed must be an integer in [0, 9223372036854775807]"),
        (["--seed", "-1"], "--seed must be an integer in [0, 9223372036854775807]"),
        (["--workers", "10000"], "--workers must be an integer in [0, 256]"),
        (["--workers", "-1"], "--workers must be an integer in [0, 256]"),
        (["--steps", str(10**30)], "--steps must be an integer in [1, 1000000000000]"),
        (["--batch-size", str(10**12)], "--batch-size must be an integer in [1, 65536]"),
        (["--shuffle-buffer", "-1"], "--shuffle-buffer must be an integer"),
        (["--keep-ckpts", "-3"], "--keep-ckpts must be an integer"),
        (["--decoded-cache-limit", "0"], "--decoded-cache-limit is 0 bytes"),
        (["--decoded-cache-limit", "inf"], "not a size"),
        (["--decoded-cache-limit", "1e400"], "over the 1 TiB maximum"),
        (["--patch-size", "400"], "lower patch_size"),  # larger than every image, counted from the manifest
    ],
)
def test_each_bad_flag_is_refused_by_check_in_one_line(photo_shards, tmp_path, capsys, args, message):
    argv = ["train", "--data", str(photo_shards), "--out", str(tmp_path / "run"), *SMALL, "--workers", "1", *args]
    assert main([*argv, "--check"]) == 2
    err = one_line(capsys)
    assert message in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "text, message",
    [
        ("lr: .inf\n", "--lr must be a finite number"),
        ("lr: 1.0e+400\n", "--lr must be a finite number"),
        ("lr-gamma: .nan\n", "--lr-gamma must be"),
        ("seed: -1\n", "--seed must be an integer"),
        ("seed: 100000000000000000000000\n", "--seed must be an integer"),
        ("k: 1e21\n", "--patches-per-image must be an integer"),
        ("workers: 10000\n", "--workers must be"),
        ("decoded_cache_limit: 0\n", "decoded_cache_limit is 0 bytes"),
        ("decoded_cache_limit: .inf\n", "not a size"),
        ("augment: 'no'\n", "augment must be true or false"),
        ("on_error: [skip]\n", "on_error must be one of fail, skip"),
        ("retry: {attempts: 0}\n", "retry.attempts must be an integer in [1, 1000]"),
        ("retry: {timeout_s: .inf}\n", "retry.timeout_s must be a finite number"),
        ("retry: [1, 2]\n", "retry must be a mapping"),
        ("dataset: 7\n", "dataset must be a mapping"),
        ("dataset: {lr: 0.1}\n", "unknown setting 'dataset.lr'"),
        ("patch_size: 48\ndataset:\n  patch_size: 96\n", "'patch_size' and 'dataset.patch_size' both set patch_size"),
        ("patches-per-image: 4\npatches_per_image: 8\n", "'patches-per-image' and 'patches_per_image' both set"),
        ("k: 4\npatches_per_image: 4\n", "'k' and 'patches_per_image' both set patches_per_image"),
        ("lr: 1.0e-3\nlr: 1.0e-4\n", "'lr' is given twice"),
        ("[1, 2]\n", "expected a mapping of setting names"),
    ],
)
def test_each_bad_config_file_value_is_refused_by_check_in_one_line(photo_shards, tmp_path, capsys, text, message):
    (tmp_path / "c.yaml").write_text(text)
    argv = ["train", "--data", str(photo_shards), "--out", str(tmp_path / "run"), "--config", str(tmp_path / "c.yaml")]
    assert main([*argv, "--check"]) == 2
    err = one_line(capsys)
    assert message in err, err


@pytest.mark.parametrize(
    "field",
    [
        "model",
        "lr",
        "seed",
        "on_error",
        "verify",
        "augment",
        "decoded_cache_limit",
        "retry",
        "dataset",
        "data",
        "min_patch_std",
        "a" * 5000,
    ],
)
@pytest.mark.parametrize("value", ["x" * 200_000, list(range(5000)), {str(i): i for i in range(5000)}, 10**4000])
def test_a_long_value_is_quoted_briefly_in_its_error(tmp_path, field, value):
    """Under the alias bound, but far too long to quote: every message formats values with brief()."""
    (tmp_path / "c.json").write_text(json.dumps({"data": "/d", "out": "/o", field: value}))
    with pytest.raises(ConfigError) as info:
        make_config({"config": str(tmp_path / "c.json")})
    assert len(str(info.value)) < 1000 and "\n" not in str(info.value), str(info.value)[:3000]


def test_a_json_config_with_a_key_given_twice_is_refused(tmp_path):
    (tmp_path / "c.json").write_text('{"data": "/d", "out": "/o", "lr": 0.001, "lr": 0.1}')
    with pytest.raises(ConfigError, match="'lr' is given twice"):
        make_config({"config": str(tmp_path / "c.json")})


def test_yaml_merge_keys_still_work_and_an_explicit_key_overrides_a_merged_one(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "data: /d\nout: /o\ndataset:\n  <<: {patch_size: 96, shuffle_buffer: 8}\n  shuffle_buffer: 4\n"
    )
    cfg = make_config({"config": str(tmp_path / "c.yaml")})
    assert (cfg.dataset.patch_size, cfg.dataset.shuffle_buffer) == (96, 4)


# ---- 4. a run that diverges stops, non-zero, and keeps its good checkpoints ---------------------------
@pytest.mark.parametrize("log_every", [1, 100])  # found at a log step (the loss) or at a checkpoint (the weights)
def test_a_run_that_goes_nan_stops_non_zero_and_keeps_the_good_checkpoints(photo_shards, tmp_path, capsys, log_every):
    """The real loop on real shards with a DataLoader worker; from the 5th forward pass on, the model's
    output is NaN (a global forward hook, as an overflowing layer would make it)."""
    calls = []

    def poison(module, inputs, output):
        if isinstance(module, ESPCN):
            calls.append(1)
            if len(calls) >= 5:
                return output * float("nan")
        return None

    out = tmp_path / "run"
    before = set(descendants(os.getpid()))  # helpers earlier tests left running (resource trackers, ...)
    handle = torch.nn.modules.module.register_module_forward_hook(poison)
    try:
        rc = main(
            [
                "train",
                "--data",
                str(photo_shards),
                "--out",
                str(out),
                *SMALL,
                "--workers",
                "1",
                "--steps",
                "8",
                "--ckpt-every",
                "2",
                "--keep-ckpts",
                "2",
                "--log-every",
                str(log_every),
            ]
        )
    finally:
        handle.remove()
    assert rc == 2  # bad input: it diverges again from the same checkpoint with the same settings
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "training diverged" in err and "step-00000004.pt (step 4)" in err, err
    assert ("the loss" if log_every == 1 else "the weights") in err
    run = RunDir(str(out))
    assert run.checkpoints() == ["step-00000002.pt", "step-00000004.pt"] and run.latest()["step"] == 4
    state = run.load_latest()
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "diverged" and last["step"] in (5, 6)
    # the DataLoader worker is reaped: it exits (a leaked one never does; the wait is only a hang guard)
    wait_until(lambda: not set(descendants(os.getpid())) - before, "the DataLoader worker to exit")
    assert resume_check(photo_shards, out) == 0  # the kept checkpoint resumes


# ---- 5. checkpoints: one line, exit 2, never unpickled -------------------------------------------
class _Payload:
    """Unpickled, this would create a file: a checkpoint must never be able to run code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _state(trained: Path) -> dict:
    return torch.load(io.BytesIO((trained / "checkpoints" / "step-00000002.pt").read_bytes()), weights_only=True)


def _save(state) -> bytes:
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _edit(trained: Path, **changes) -> bytes:
    state = _state(trained)
    state.update(changes)
    return _save(state)


CORRUPT = {
    "truncated": (lambda t, m: (t / "checkpoints" / "step-00000002.pt").read_bytes()[:3000], "not a readable checkpoint"),
    "garbage": (lambda t, m: os.urandom(5000), "not a readable checkpoint"),
    "empty": (lambda t, m: b"", "not a readable checkpoint"),
    "pickle payload": (lambda t, m: _save({"format": FORMAT, "x": _Payload(m)}), "objects other than tensors"),
    "plain pickle": (lambda t, m: __import__("pickle").dumps(_Payload(m), protocol=2), "objects other than tensors"),
    "wrong shape": (lambda t, m: _edit(t, model=build_model("espcn", 2).state_dict()), "does not fit this ESPCN"),
    "another model": (lambda t, m: _edit(t, model=build_model("edsr-baseline", 4).state_dict()), "does not fit"),
    "nan weights": (lambda t, m: _edit(t, model={k: v * float("nan") for k, v in _state(t)["model"].items()}), "inf or NaN"),
    "step a string": (lambda t, m: _edit(t, step="2"), "'step' must be an integer"),
    "step huge": (lambda t, m: _edit(t, step=10**30), "'step' must be an integer"),
    "epoch negative": (lambda t, m: _edit(t, epoch=-1), "'epoch' must be an integer"),
    "epoch a float": (lambda t, m: _edit(t, epoch=1.5), "'epoch' must be an integer"),
    "step not latest's": (lambda t, m: _edit(t, step=7), "holds step 7, but latest.json says 2"),
    "model a list": (lambda t, m: _edit(t, model=[1, 2]), "'model' must be a mapping"),
    "loader a list": (lambda t, m: _edit(t, loader=[1]), "'loader' must be a mapping"),
    "rng missing": (lambda t, m: _edit(t, rng={}), "'rng.torch' must be a uint8 tensor"),
    "optimizer of another shape": (
        lambda t, m: _edit(
            t,
            optimizer=torch.optim.Adam(build_model("espcn", 2).parameters()).state_dict()
            | {
                "state": {
                    i: {"step": torch.tensor(2.0), "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)} for i in range(6)
                }
            },
        ),
        "optimizer state exp_avg has shape",
    ),
    "not ours": (lambda t, m: _save({"weights": torch.zeros(3)}), f"not a {FORMAT} checkpoint"),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_a_bad_checkpoint_is_one_line_exit_2_and_never_unpickled(photo_shards, trained, tmp_path, capsys, case):
    make, message = CORRUPT[case]
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    marker = tmp_path / "pwned"
    (out / "checkpoints" / "step-00000002.pt").write_bytes(make(trained, marker))
    assert resume_check(photo_shards, out) == 2
    err = one_line(capsys)
    assert message in err and "step-00000002.pt" in err and "weights_only=False" not in err, err
    assert not marker.exists()


def test_run_json_is_read_on_resume(photo_shards, trained, tmp_path, capsys, caplog):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    info = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**info, "config": {**info["config"], "scale": 2}}))
    assert resume_check(photo_shards, out, "--scale", "4") == 2
    assert "run.json" in (err := one_line(capsys)) and "scale=2" in err
    assert resume_check(photo_shards, out) == 2  # run.json's scale 2 taken: the checkpoint's 4 refuses it
    assert "the checkpoint" in (err := one_line(capsys)) and "scale=4" in err
    (out / "run.json").write_text("[not a run")
    assert resume_check(photo_shards, out) == 2
    assert "run.json: not valid JSON" in one_line(capsys)
    (out / "run.json").write_text(json.dumps({**info, "config": {**info["config"], "lr": 0.5}}))
    assert resume_check(photo_shards, out, "--lr", "2e-4") == 0
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("--resume: --lr")]
    assert len(said) == 1 and "--lr was 0.5 in" in said[0] and said[0].endswith("now 0.0002"), said


# ---- 6. fuzz: any JSON-able value ends in a TrainConfig or a ConfigError, quickly --------------------
NAMES = sorted(
    {f.name for f in __import__("dataclasses").fields(TrainConfig)} | set(DATASET_KEYS) | set(CLIP_KEYS) | {"k", "patch-size"}
)
EDGES = [
    10**400,
    -(10**400),
    2**63,
    2**63 - 1,
    2**64,
    -(2**63) - 1,
    10**30,
    1e308,
    -0.0,
    float("nan"),
    float("inf"),
    -float("inf"),
    0,
    -1,
    1,
    True,
    False,
    None,
    "",
    "x" * 5000,
    "16",
    "2e-4",
    "1e400",
    "nan",
    "inf",
    "20GB",
    "0",
    "skip",
    "espcn",
    "-1",
]
SCALARS = (
    st.sampled_from(EDGES)
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSONABLE = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12
)


def fuzz(examples: int):
    return settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def _accepts(flags: dict) -> None:
    try:
        cfg = make_config(flags)
    except ConfigError as exc:
        assert len(str(exc)) < 1000 and "\n" not in str(exc), str(exc)
        return
    json.dumps(cfg.dict, allow_nan=False)  # what run.json and checkpoints store: finite, JSON-able


@pytest.mark.parametrize("name", NAMES)
@fuzz(40)
@given(value=JSONABLE)
def test_fuzz_any_value_of_each_setting_ends_in_a_config_or_a_config_error(name, value):
    _accepts({"data": "/d", "out": "/o", name: value})


@fuzz(150)
@given(
    doc=st.dictionaries(st.sampled_from(NAMES + ["dataset", "retry"]) | st.text(max_size=8), JSONABLE, max_size=6) | JSONABLE,
    as_yaml=st.booleans(),
)
def test_fuzz_any_config_file_ends_in_a_config_or_a_config_error(doc, as_yaml):
    if isinstance(doc, dict):
        doc = {"data": "/d", "out": "/o", **doc}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("c.yaml" if as_yaml else "c.json")
        path.write_text(yaml.safe_dump(doc) if as_yaml else json.dumps(doc))
        _accepts({"config": str(path)})
