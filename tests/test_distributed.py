"""Real multi-process runs: torchrun on 127.0.0.1 with gloo, DataLoader workers in every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardmaker.format import load
from tests.helpers import torchrun

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_get_equal_batches_and_every_sample(photo_shards, tmp_path, nproc):
    reports = torchrun(nproc, str(photo_shards), tmp_path / f"w{nproc}")
    m = load(str(photo_shards))
    all_keys = {k for s in m.shards for k in s.keys}
    lens = {r["len"] for r in reports}
    assert len(lens) == 1
    for epoch in range(2):
        steps = [r["epochs"][epoch]["steps"] for r in reports]
        assert steps == [reports[0]["len"]] * nproc  # yielded == promised, on every rank
        seen = {k for r in reports for k in r["epochs"][epoch]["keys"]}
        assert seen == all_keys  # no sample lost
    orders = [[k for r in reports for k in r["epochs"][e]["keys"]] for e in range(2)]
    assert orders[0] != orders[1]


def test_skipped_samples_keep_ranks_in_step(photo_shards, tmp_path):
    import shutil

    ds = Path(shutil.copytree(photo_shards, tmp_path / "ds"))
    m = load(str(ds))
    victim = ds / m.shards[0].name
    victim.write_bytes(victim.read_bytes()[:-5000])  # truncated shard: its samples are skipped
    reports = torchrun(2, str(ds), tmp_path / "out", env={"WDSR_ON_ERROR": "skip"})
    for epoch in range(2):
        assert [r["epochs"][epoch]["steps"] for r in reports] == [reports[0]["len"]] * 2
    assert sum(r["stats"]["skipped"] for r in reports) >= m.shards[0].samples
