"""The stateful-loader protocol (torchdata's ``StatefulDataLoader``, which Lightning follows): one table
of scenarios run against torchdata's own loader and against ``wdsr.SRLoader``. Each scenario answers
"did the loader continue with exactly the batches the uninterrupted one gives?"; the outcomes agree
wherever the semantics are meant to, and the rows where they differ say how."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterable
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch

import wdsr

sdl = pytest.importorskip("torchdata.stateful_dataloader")

Make = Callable[..., Any]  # make(batch_size=None) -> a fresh loader; None: the implementation's default


def digests(batches: Iterable[Any]) -> list[str]:
    out = []
    for b in batches:
        parts = b if isinstance(b, (list, tuple)) else [b]
        out.append(hashlib.sha256(b"".join(p.numpy().tobytes() for p in parts)).hexdigest()[:16])
    return out


def resumed(make: Make, state: Any) -> list[str]:
    """One pass of a fresh loader given ``state``."""
    loader = make()
    loader.load_state_dict(state)
    return digests(loader)


def mid_state(make: Make, taken: int = 3) -> Any:
    loader = make()
    list(islice(iter(loader), taken))
    return loader.state_dict()


# ---- the scenarios: each returns True when the loader continued exactly ----------------------------
def before_first_iter(make: Make, ref: list[list[str]]) -> bool:
    return resumed(make, make().state_dict()) == ref[0]


def mid_epoch(make: Make, ref: list[list[str]]) -> bool:
    return resumed(make, mid_state(make)) == ref[0][3:]


def after_last_batch(make: Make, ref: list[list[str]]) -> str:
    """A state saved after the epoch's last batch starts a whole new epoch in both. wdsr's is the
    uninterrupted run's next epoch; torchdata's shuffled sampler draws another order than it would have."""
    loader = make()
    assert digests(loader) == ref[0]
    got = resumed(make, loader.state_dict())
    if got == ref[1]:
        return "the next epoch"
    return "a whole epoch, another order" if len(got) == len(ref[1]) and got != ref[0] else "other"


def empty_state_is_a_no_op(make: Make, ref: list[list[str]]) -> bool:
    return resumed(make, {}) == ref[0]


def load_then_state_dict(make: Make, ref: list[list[str]]) -> bool:
    loader = make()
    loader.load_state_dict(mid_state(make))
    again = loader.state_dict()  # before any iter(): the loaded position, not a fresh one
    return resumed(make, again) == ref[0][3:] and digests(loader) == ref[0][3:]


def torch_save_round_trip(make: Make, ref: list[list[str]]) -> bool:
    buf = io.BytesIO()
    torch.save(mid_state(make), buf)
    buf.seek(0)
    return resumed(make, torch.load(buf, weights_only=True)) == ref[0][3:]


def state_of_another_batch_size(make: Make, ref: list[list[str]]) -> str:
    """A state from a loader with another batch size: torchdata fast-forwards by batches yielded
    (other samples); wdsr refuses it (``LoaderStateError``), since no batch of it would be the same."""
    state = mid_state(lambda: make(batch_size=5))
    try:
        make().load_state_dict(state)
    except wdsr.LoaderStateError:
        return "refused"
    return "accepted"


TABLE = [  # scenario, outcome for torchdata, outcome for SRLoader
    (before_first_iter, True, True),
    (mid_epoch, True, True),
    (after_last_batch, "a whole epoch, another order", "the next epoch"),
    (empty_state_is_a_no_op, True, True),
    (load_then_state_dict, True, True),
    (torch_save_round_trip, True, True),
    (state_of_another_batch_size, "accepted", "refused"),
]


def torchdata_loader(batch_size: int | None = None) -> Any:
    data = torch.utils.data.TensorDataset(torch.arange(20))
    return sdl.StatefulDataLoader(data, batch_size=batch_size or 4, shuffle=True, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def srloader(photo_shards: Path) -> Make:
    """10 images x 2 patches, batch 4: 5 batches per epoch (one process: the table is about the protocol;
    workers and elastic resume are tests/test_loader_state.py's)."""

    def make(batch_size: int | None = None) -> wdsr.SRLoader:
        ds = wdsr.SRDataset(
            str(photo_shards), scale=4, patch_size=32, patches_per_image=2, batch_size=batch_size or 4, shuffle_buffer=8
        )
        return wdsr.make_loader(ds, num_workers=0)

    return make


@pytest.mark.parametrize("scenario, for_torchdata, for_wdsr", TABLE, ids=[row[0].__name__ for row in TABLE])
@pytest.mark.parametrize("impl", ["torchdata", "wdsr"])
def test_protocol(
    impl: str, scenario: Callable[..., Any], for_torchdata: Any, for_wdsr: Any, request: pytest.FixtureRequest
) -> None:
    make: Make = torchdata_loader if impl == "torchdata" else request.getfixturevalue("srloader")
    reference = make()
    ref = [digests(reference), digests(reference)]  # the uninterrupted loader's first two epochs
    assert len(ref[0]) == 5 and ref[0] != ref[1]
    assert scenario(make, ref) == (for_torchdata if impl == "torchdata" else for_wdsr)
