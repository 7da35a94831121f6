"""``python -m bench.inplace --quick`` runs end to end: 4 small frames, one short round, local disk only.

LitData is a bench extra (``make test``'s venv does not install it): its arm runs where ``litdata`` and
``zstd`` import, and the report says it was left out where they do not.
"""

from __future__ import annotations

import json

import pytest

from bench import inplace


@pytest.mark.slow
def test_inplace_bench_quick_runs(tmp_path) -> None:
    assert inplace.main(["--quick", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "inplace.md").read_text()
    runs = json.loads((tmp_path / "inplace.json").read_text())
    ours = [f"local disk: {name}, k=16" for name in ("in place (PNG files)", "PNG shards", "QOI shards")]
    lit = "local disk: LitData StreamingRawDataset, 1 patch/decode"
    assert set(runs) == {*ours, lit} if inplace.litdata_arm is not None else set(ours)
    assert all(len(r) == 1 and r[0]["patches_per_s"] > 0 and r[0]["first_batch_s"] > 0 for r in runs.values())
    assert "in place / PNG shards" in text and "4 pairs" in text
    assert ("LitData left out" in text) == (inplace.litdata_arm is None)
