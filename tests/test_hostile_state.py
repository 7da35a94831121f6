"""Hostile and unlucky inputs, round 2 (issue 24): loader states (High 7) and brace patterns of shard
URLs (High 4). Every field of a saved state is type-checked and bounded, so a crafted one is one
``LoaderStateError`` naming the field, in bounded time and memory (measured in a child process under
an address-space cap); a pattern is counted before it is expanded and refused above the limit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsr
from tests.helpers import ROOT
from wdsr.env import World

KW = dict(scale=4, patch_size=48, patches_per_image=8, batch_size=4, shuffle_buffer=8, seed=3)
CAP = 768 << 20  # bytes of address space a child may add to what its imports took
GUARD = 60  # seconds: only against a hang, far above what the refusals take


@pytest.fixture(scope="module")
def ds(photo_shards) -> wdsr.SRDataset:
    return wdsr.SRDataset(str(photo_shards), world=World(), **KW)


def _valid(ds: wdsr.SRDataset) -> dict[str, Any]:
    """A state 2 batches into epoch 0 (10 samples x 8 patches / 4 = 20 batches), made without reading a batch."""
    return {**wdsr.make_loader(ds, num_workers=0).state_dict(), "batches": 2}


def _load(ds: wdsr.SRDataset, saved: Any, workers: int = 0) -> wdsr.SRLoader:
    loader = wdsr.make_loader(ds, num_workers=workers)
    loader.load_state_dict(saved)
    return loader


def _child(script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter whose address space may grow by ``CAP`` past its imports
    (``cap()`` sets the limit), reaped by ``subprocess.run`` even when the guard expires."""
    prelude = textwrap.dedent(f"""
        import resource, sys
        def cap():
            with open("/proc/self/status") as f:
                now = int(next(line for line in f if line.startswith("VmSize:")).split()[1]) * 1024
            resource.setrlimit(resource.RLIMIT_AS, (now + {CAP}, now + {CAP}))
    """)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GUARD,
    )


# ---- each hostile field: one LoaderStateError naming it ---------------------------------------------
HOSTILE = [  # (field changes, what the message names); those that took minutes and gigabytes: WORST, in a child
    ({"num_workers": -1}, r"num_workers must be an integer in \[0, 1024\], got -1"),
    ({"num_workers": True}, r"num_workers must be an integer .*got True"),
    ({"num_workers": 2.5}, r"num_workers must be an integer .*got 2\.5"),
    ({"num_workers": "3"}, r"num_workers must be an integer .*got '3'"),
    ({"world_size": 10**9}, r"'s world_size must be an integer in \[1, 65536\]"),
    ({"world_size": 0}, r"'s world_size must be an integer in \[1, 65536\], got 0"),
    ({"elastic": {"world_size": 0, "num_workers": 0, "batches": 0}}, r"elastic\.world_size must be .*got 0"),
    ({"elastic": {"world_size": 1, "num_workers": 0, "batches": 10**30}}, r"elastic\.batches must be an integer"),
    ({"elastic": {"world_size": 1, "num_workers": 0, "batches": 21}}, r"elastic\.batches is 21, past the end of its epoch of 20"),
    ({"elastic": {"world_size": 2, "num_workers": 1}}, r"elastic origin is malformed: it lacks batches"),
    ({"elastic": [1, 2, 3]}, r"elastic origin is malformed: \[1, 2, 3\], not a dict"),
    ({"epoch": 2**70}, r"epoch must be an integer in \[0, 2147483647\], got 1180591620717411303424"),
    ({"epoch": -1}, r"epoch must be an integer"),
    ({"epoch": 1.0}, r"epoch must be an integer"),
    ({"batches": 21}, r"batches is 21, past the end of its epoch of 20"),
    ({"batches": 10**6}, r"batches is 1000000, past the end of its epoch of 20"),
    ({"batches": False}, r"batches must be an integer .*got False"),
    (
        {"elastic": {"world_size": 4097, "num_workers": 0, "batches": 0}},
        r"elastic\.world_size x elastic\.num_workers is 4097 x 0",
    ),
    ({"augment": 1}, r"augment=1, this loader True"),  # 1 == True, but not a bool
    ({"seed": 3.0 + 1e-12}, r"seed=3\.000000000001, this loader 3"),
    ({"format": ["wdsr-loader/1"] * 10**5}, r"format <list of 100000 items>"),
    ({"dataset": "x" * 10**6}, r"another dataset \(manifest sha256 'x{12}\.\.\., "),
]


@pytest.mark.parametrize("change, message", HOSTILE, ids=[m.split(" ")[0][:24] for _, m in HOSTILE])
def test_each_hostile_field_is_a_loader_state_error_naming_it(ds, change, message):
    with pytest.raises(wdsr.LoaderStateError, match=message) as info:
        _load(ds, {**_valid(ds), **change})
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_the_bounds_still_admit_every_real_resume(ds):
    state = _valid(ds)
    assert _load(ds, state).state_dict() == state
    last = _load(ds, {**state, "epoch": 2**31 - 1}).state_dict()
    assert (last["epoch"], last["batches"]) == (2**31 - 1, 2)
    # another world inside the bounds is an elastic resume: re-planned, not refused
    loader = _load(ds, {**state, "world_size": 3, "num_workers": 4, "batches": 1})
    assert loader.elastic_report is not None and loader.state_dict()["elastic"] == {
        "world_size": 3,
        "num_workers": 4,
        "batches": 1,
    }
    loader = _load(ds, {**state, "elastic": {"world_size": 4096, "num_workers": 0, "batches": 1}, "batches": 0})
    assert loader.elastic_report is not None and loader.elastic_report["images"] == 4096  # 4096 slots, one image each
    assert _load(ds, {**state, "world_size": 2, "batches": 10}).state_dict()["epoch"] == 1  # a finished epoch: the next


@pytest.mark.parametrize("workers", [-1, 10**9, 1025, True, 2.5, "3"])
def test_a_loader_with_a_bad_worker_count_is_refused(ds, workers):
    with pytest.raises(ValueError, match="num_workers must be an integer in \\[0, 1024\\]"):
        wdsr.make_loader(ds, num_workers=workers)
    with pytest.raises(ValueError, match="num_workers must be an integer in \\[0, 1024\\]"):
        wdsr.SRLoader(ds, num_workers=workers)


def test_an_epoch_out_of_range_is_refused_before_it_reaches_the_workers(ds):
    loader = wdsr.make_loader(ds, num_workers=0)
    for bad in (2**70, -1, 2.5, True):
        with pytest.raises(ValueError, match="epoch must be an integer in \\[0, 2147483647\\]"):
            loader.set_epoch(bad)  # type: ignore[arg-type]
    loader.set_epoch(2**31 - 1)
    assert loader.state_dict()["epoch"] == 2**31 - 1


HOSTILE_CHILD = """
    import json, sys
    import wdsr
    from wdsr.env import World
    kw = json.loads(sys.argv[2])
    ds = wdsr.SRDataset(sys.argv[1], world=World(), **kw)
    state = {**wdsr.make_loader(ds, num_workers=0).state_dict(), "batches": 2}
    cap()
    wdsr.make_loader(ds, num_workers=0).load_state_dict({**state, "world_size": 2, "batches": 1})  # a real one fits
    for change in json.loads(sys.argv[3]):
        try:
            wdsr.make_loader(ds, num_workers=0).load_state_dict({**state, **change})
        except wdsr.LoaderStateError as exc:
            print(str(exc))
        else:
            print("restored")
"""
WORST = [  # (field changes, what the message names)
    ({"num_workers": 10**9}, "the loader state's num_workers must be an integer in [0, 1024], got 1000000000"),
    ({"world_size": 10**9}, "the loader state's world_size must be an integer in [1, 65536], got 1000000000"),
    ({"elastic": {"world_size": 10**9, "num_workers": 1, "batches": 1}}, "the loader state's elastic.world_size must be"),
    ({"elastic": {"world_size": 1, "num_workers": 10**9, "batches": 1}}, "the loader state's elastic.num_workers must be"),
    ({"elastic": {"world_size": 1, "num_workers": 0, "batches": 10**30}}, "the loader state's elastic.batches must be"),
    ({"world_size": 65536, "num_workers": 1024, "batches": 1}, "world_size x num_workers is 65536 x 1024 = 67108864 slots"),
    ({"elastic": {"world_size": 65536, "num_workers": 1024, "batches": 0}}, "elastic.num_workers is 65536 x 1024 = "),
    ({"elastic": {"world_size": 65536, "num_workers": 1024, "batches": 2048}}, "elastic.num_workers is 65536 x 1024 = "),
]


def test_the_worst_states_are_refused_in_bounded_time_and_memory(photo_shards):
    """Without the bounds the first one re-planned over 10^9 slots: minutes and gigabytes."""
    done = _child(HOSTILE_CHILD, str(photo_shards), json.dumps(KW), json.dumps([c for c, _ in WORST]))
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == len(WORST), lines
    for line, (_, message) in zip(lines, WORST, strict=True):
        assert message in line and len(line) < 300, (line, message)


# ---- the fuzz: any JSON-able value, as the state or as one field of it -----------------------------
EDGES = [0, 1, -1, 2, 3, 4, 20, 21, 1024, 1025, 4096, 65536, 65537, 2**31 - 1, 2**31, 2**53, 2**63, 2**64, 10**30, -(2**63)]
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-64, max_value=64)
    | st.sampled_from(EDGES)
    | st.integers(min_value=-(2**300), max_value=2**300)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSON = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12
)
FIELDS = [
    "format",
    "dataset",
    "samples",
    "scale",
    "patch_size",
    "patches_per_image",
    "batch_size",
    "shuffle_buffer",
    "augment",
    "seed",
    "min_patch_std",
    "max_tries",
    "world_size",
    "num_workers",
    "epoch",
    "batches",
    "patch_draws",
    "elastic",
    "elastic.world_size",
    "elastic.num_workers",
    "elastic.batches",
]
INT_FIELDS = ["world_size", "num_workers", "epoch", "batches", "elastic.world_size", "elastic.num_workers", "elastic.batches"]
FUZZ = settings(deadline=None, max_examples=150, database=None, suppress_health_check=[HealthCheck.too_slow])


def _restores_or_refuses(ds: wdsr.SRDataset, saved: Any) -> None:
    """A normal restore (the position then saves as JSON, inside its pass) or one LoaderStateError."""
    try:
        loader = _load(ds, saved)
    except wdsr.LoaderStateError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400
        return
    out = loader.state_dict()
    assert json.loads(json.dumps(out)) == out
    assert type(out["epoch"]) is int and 0 <= out["epoch"] <= 2**31 and 0 <= out["batches"] < loader.pass_length()


@FUZZ
@given(value=JSON)
def fuzz_any_json_value_as_the_state(ds: wdsr.SRDataset, value: Any) -> None:
    _restores_or_refuses(ds, value)


@FUZZ
@given(
    field=st.sampled_from(INT_FIELDS) | st.sampled_from(FIELDS),  # the counts half the time
    value=st.sampled_from(EDGES) | SCALARS | JSON,
    elastic=st.booleans(),
)
def fuzz_any_json_value_as_one_field(ds: wdsr.SRDataset, field: str, value: Any, elastic: bool) -> None:
    state = _valid(ds)
    if elastic or field.startswith("elastic."):  # a state inside an elastic re-plan: its origin fuzzed too
        state = {**state, "batches": 0, "elastic": {"world_size": 2, "num_workers": 1, "batches": 3}}
    if field.startswith("elastic."):
        state["elastic"] = {**state["elastic"], field.split(".")[1]: value}
    else:
        state[field] = value
    _restores_or_refuses(ds, state)


@FUZZ
@given(
    world=st.integers(min_value=-2, max_value=70000) | st.integers(min_value=1, max_value=64),
    workers=st.integers(min_value=-2, max_value=1100) | st.integers(min_value=0, max_value=8),
    batches=st.integers(min_value=-2, max_value=2**40) | st.integers(min_value=0, max_value=24),
    inside=st.booleans(),
)
def fuzz_worlds_within_and_past_the_bounds(ds: wdsr.SRDataset, world: int, workers: int, batches: int, inside: bool) -> None:
    """The slow corner: integer worlds near the bounds end quickly too (the re-plan is capped)."""
    state = _valid(ds)
    if inside:
        state = {**state, "batches": 0, "elastic": {"world_size": world, "num_workers": workers, "batches": batches}}
    else:
        state = {**state, "world_size": world, "num_workers": workers, "batches": batches}
    _restores_or_refuses(ds, state)


FUZZ_CHILD = """
    import json, sys
    from tests import test_hostile_state as t
    import wdsr
    from wdsr.env import World
    ds = wdsr.SRDataset(sys.argv[1], world=World(), **t.KW)
    cap()
    getattr(t, sys.argv[2])(ds)
    print("fuzzed")
"""


@pytest.mark.parametrize(
    "target", ["fuzz_any_json_value_as_the_state", "fuzz_any_json_value_as_one_field", "fuzz_worlds_within_and_past_the_bounds"]
)
def test_fuzz_loader_states(photo_shards, target):
    """Any JSON-able value as the state, or as one field of a saved one (hypothesis, 150 examples),
    ends in a restore or a LoaderStateError; in a child under the memory cap, so a state that asks
    for unbounded work fails the test (its memory cap or the GUARD timeout) instead of the machine."""
    done = _child(FUZZ_CHILD, str(photo_shards), target)
    assert done.returncode == 0 and done.stdout.splitlines()[-1:] == ["fuzzed"], done.stderr[-3000:]


# ---- brace patterns of shard URLs: counted before they are expanded -------------------------------
BIG = [
    "shard-{0..999999999}.tar",
    "shard-{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}"
    "{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}{a,b}.tar",
    "shard-{{0..9}{0..9},{{0..9}{0..9}{0..9},{x,y}{0..99}}}{0..99}{0..99}.tar",
]
COUNTS = ["1,000,000,000", "1,073,741,824", "13,000,000"]

PATTERN_CHILD = """
    import json, subprocess, sys
    import wdsr
    from shardmaker.cli import main
    folder, patterns = sys.argv[1], json.loads(sys.argv[2])
    cap()
    for p in patterns:
        try:
            wdsr.SRDataset(folder + "/" + p, scale=4, patch_size=48)
        except ValueError as exc:
            print("dataset:", exc)
        rc = main(["-q", "index", folder + "/" + p, "--hr", "hr.png", "--lr", "4:lr_x4.png"])
        print("index rc:", rc)
"""


def test_huge_and_nested_patterns_are_refused_quickly_in_srdataset_and_index(photo_shards):
    """Without the count, braceexpand builds every name first: 10^9 of them ran out of memory."""
    done = _child(PATTERN_CHILD, str(photo_shards), json.dumps(BIG))
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()
    err = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(out) == 2 * len(BIG) and len(err) == len(BIG), (out, err)  # one line each, nothing else
    for i, (p, count) in enumerate(zip(BIG, COUNTS, strict=True)):
        assert out[2 * i].startswith("dataset: URL pattern ") and f"names {count} URLs: at most 1,000,000" in out[2 * i]
        assert out[2 * i + 1] == "index rc: 2"
        assert err[i].startswith("shardmaker index: error: URL pattern ") and f"names {count} URLs" in err[i]
        assert len(err[i]) < 300 and p[-20:] in err[i]  # the end of a long pattern is shown (the braces)


def test_the_index_cli_refuses_a_huge_pattern_in_one_line(photo_shards):
    """The command line as a user runs it (``python -m shardmaker``), under the cap: exit 2, one line."""
    script = """
        import runpy
        import shardmaker.cli
        cap()
        sys.argv = ["shardmaker", "index", sys.argv[1] + "/shard-{0..999999999}.tar", "--hr", "hr.png", "--lr", "4:lr_x4.png"]
        runpy.run_module("shardmaker", run_name="__main__")
    """
    done = _child(script, str(photo_shards))
    assert done.returncode == 2 and done.stdout == "", done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "names 1,000,000,000 URLs: at most 1,000,000 are allowed" in done.stderr


def test_a_list_of_patterns_is_bounded_together(photo_shards):
    half = f"{photo_shards}/a-{{000000..599999}}.tar"
    with pytest.raises(ValueError, match="600,000 URLs, 2 patterns together more: at most 1,000,000"):
        wdsr.SRDataset([half, half.replace("/a-", "/b-")], scale=4, patch_size=48)
