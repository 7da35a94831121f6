"""A loader's position as a small JSON-able dict: what ``SRLoader.state_dict()`` saves and
``load_state_dict()`` checks before a resume (the dataset, the settings that decide the batches,
the world, the epoch and the batches handed out), and the elastic case where the world changed."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from shardmaker.errors import brief
from wdsr.config import Split
from wdsr.dataset import SRDataset
from wdsr.pipeline.elastic import ElasticPlan, replan_limit
from wdsr.pipeline.plan import whole_batches

log = logging.getLogger("wdsr")

STATE_FORMAT = "wdsr-loader/1"
PATCH_DRAWS = "splitmix64/1"  # how patch positions are drawn (wdsr.pipeline.patches.draws); states before it: numpy PCG64
MATCH = (  # settings that decide which batches an epoch has: a state resumes only where they are equal
    "scale",
    "patch_size",
    "patches_per_image",
    "batch_size",
    "shuffle_buffer",
    "augment",
    "seed",
    "min_patch_std",
    "max_tries",
)
MAX_WORKERS = 1024  # DataLoader workers of one rank
MAX_WORLD = 1 << 16  # ranks
MAX_EPOCH = (1 << 31) - 1  # epochs travel to the workers as int64 and seed numpy: kept far from overflow
MAX_BATCHES = 1 << 53  # a type check only: a position is then held to its pass's length
FIELDS = {  # the integer fields of a state and their ranges (an elastic origin has all but the epoch)
    "world_size": (1, MAX_WORLD),
    "num_workers": (0, MAX_WORKERS),
    "epoch": (0, MAX_EPOCH),
    "batches": (0, MAX_BATCHES),
}
Origin = tuple[int, int, int]  # an elastic resume's old world size, old workers, batches per rank
Position = tuple[int, int, "Origin | None"]  # epoch, batches of it handed out, elastic origin


class LoaderStateError(ValueError):
    """A saved loader state that does not fit this loader (another dataset, settings or format)."""


class WorldChanged(LoaderStateError):
    """A saved state from another world size or worker count (an elastic resume)."""


def pass_length(ds: SRDataset, num_workers: int, epoch: int, origin: Origin | None) -> int:
    """Batches of a pass: ``len(loader)``, or that of the rest of an epoch re-planned by an elastic resume."""
    if origin is None:
        return ds.length(num_workers)
    return max(1, num_workers) * whole_batches(ds.elastic_plan(epoch, origin, num_workers).per_slot, ds.config.batch_size)


def save(ds: SRDataset, num_workers: int, position: Position) -> dict[str, Any]:
    """The state of a loader of ``ds`` with ``num_workers`` workers at ``position``."""
    if ds.config.split is Split.VAL:
        raise ValueError("a val loader has no position to save: every pass reads every image")
    epoch, done, origin = position
    extra = {} if origin is None else {"elastic": {"world_size": origin[0], "num_workers": origin[1], "batches": origin[2]}}
    return {
        **extra,
        "format": STATE_FORMAT,
        "dataset": ds.identity,
        "samples": ds.manifest.samples,
        **{name: getattr(ds.config, name) for name in MATCH},
        "world_size": ds.world.size,
        "num_workers": num_workers,
        "epoch": int(epoch),
        "batches": int(done),
        "patch_draws": PATCH_DRAWS,
    }


def restore(ds: SRDataset, num_workers: int, state: Any) -> Position:
    """Where a loader of ``ds`` with ``num_workers`` workers continues ``state``: checked field by
    field (types and ranges, so a hostile state cannot ask for unbounded work), a change of world
    turned into an elastic origin, a finished epoch into the next one."""
    _check_fields(ds, state)
    epoch, done = state["epoch"], state["batches"]
    origin = _elastic_origin(ds, state)
    same_world = (state["world_size"], state["num_workers"]) == (ds.world.size, num_workers)
    if not same_world and origin is not None:
        raise WorldChanged(
            f"the loader state is inside an epoch already re-planned from {origin[0]} x {origin[1]} to "
            f"{state['world_size']} x {state['num_workers']} slots; a second change of world within one epoch "
            "is not supported"
        )
    if not same_world and done:
        old = (state["world_size"], state["num_workers"], done)
        if done < _old_length(ds, old, "batches"):
            _check_replan(ds, old, "world_size x num_workers")
            origin, done = old, 0
        else:
            epoch, done = epoch + 1, 0
    length = pass_length(ds, num_workers, epoch, origin)
    if done > length:
        raise LoaderStateError(f"the loader state's batches is {done}, past the end of its epoch of {length} batches")
    if done == length:
        return epoch + 1, 0, None
    return epoch, done, origin


def check_int(value: Any, name: str, lo: int, hi: int, error: type[ValueError] = ValueError) -> int:
    """``value`` if it is an ``int`` (not a bool, a float or a string) in ``[lo, hi]``; else ``error``
    naming ``name`` (the one rule for every count a loader is given)."""
    if type(value) is not int or not lo <= value <= hi:
        raise error(f"{name} must be an integer in [{lo}, {hi}], got {brief(value)}")
    return value


def check_workers(num_workers: Any) -> int:
    """A loader's ``num_workers``: 0 (the main process) to ``MAX_WORKERS``."""
    if isinstance(num_workers, np.integer):
        num_workers = int(num_workers)
    return check_int(num_workers, "num_workers", 0, MAX_WORKERS)


def check_epoch(epoch: Any) -> int:
    """An epoch asked for with ``set_epoch``: 0 to ``MAX_EPOCH`` (it travels to the workers as int64)."""
    if isinstance(epoch, np.integer):
        epoch = int(epoch)
    return check_int(epoch, "epoch", 0, MAX_EPOCH)


def _same(saved: Any, mine: Any) -> bool:
    """A saved setting equals this loader's: a scalar of the same kind (``True`` is not ``1``)."""
    return (
        type(saved) in (bool, int, float, str, type(None)) and isinstance(saved, bool) == isinstance(mine, bool) and saved == mine
    )


def _check_fields(ds: SRDataset, state: Any) -> None:
    if not isinstance(state, dict):
        raise LoaderStateError(f"a loader state is a dict, got {type(state).__name__}")
    need = ("format", "dataset", *MATCH, "world_size", "num_workers", "epoch", "batches")
    missing = [k for k in need if k not in state]
    if missing:
        raise LoaderStateError(f"the loader state lacks {', '.join(missing)} (truncated, or not a wdsr loader state)")
    if state["format"] != STATE_FORMAT:
        raise LoaderStateError(f"loader state format {brief(state['format'])}; this wdsr reads {STATE_FORMAT!r}")
    if state.get("patch_draws") != PATCH_DRAWS:
        log.warning(
            "the loader state was saved by a wdsr that drew patch positions another way (%s); the run "
            "continues at the same batch with the same images, but the rest of this epoch cuts other patches "
            "than that version would have",
            brief(state["patch_draws"]) if "patch_draws" in state else "numpy PCG64",
        )
    if state["dataset"] != ds.identity:
        raise LoaderStateError(
            f"the loader state is from another dataset (manifest sha256 {brief(state['dataset'], 16)}, "
            f"{ds.url} has {ds.identity[:12]}...)"
        )
    for name in MATCH:
        if not _same(state[name], getattr(ds.config, name)):
            raise LoaderStateError(f"the loader state has {name}={brief(state[name])}, this loader {getattr(ds.config, name)!r}")
    for name, (lo, hi) in FIELDS.items():
        check_int(state[name], f"the loader state's {name}", lo, hi, LoaderStateError)


def _elastic_origin(ds: SRDataset, state: dict[str, Any]) -> Origin | None:
    if "elastic" not in state:
        return None
    e = state["elastic"]
    if not isinstance(e, dict):
        raise LoaderStateError(f"the loader state's elastic origin is malformed: {brief(e)}, not a dict")
    for name in ("world_size", "num_workers", "batches"):
        if name not in e:
            raise LoaderStateError(f"the loader state's elastic origin is malformed: it lacks {name}")
        check_int(e[name], f"the loader state's elastic.{name}", *FIELDS[name], LoaderStateError)
    origin = e["world_size"], e["num_workers"], e["batches"]
    _old_length(ds, origin, "elastic.batches")
    _check_replan(ds, origin, "elastic.world_size x elastic.num_workers")  # the pass re-plans from it, finished or not
    return origin


def _old_length(ds: SRDataset, origin: Origin, batches: str) -> int:
    """Batches per rank of an epoch of the old world ``origin``, which it cannot have run past."""
    old_len = max(1, origin[1]) * ds.batches_per_worker(origin[1], origin[0])
    if origin[2] > old_len:
        raise LoaderStateError(f"the loader state's {batches} is {origin[2]}, past the end of its epoch of {old_len} batches")
    return old_len


def _check_replan(ds: SRDataset, origin: Origin, world: str) -> None:
    """An elastic re-plan from ``origin`` replays every old slot: work in proportion to the
    dataset, not to a number in the state (:func:`wdsr.pipeline.elastic.replan_limit`)."""
    slots = origin[0] * max(1, origin[1])
    bound = replan_limit(ds.epoch_samples)
    if slots > bound:
        raise LoaderStateError(
            f"the loader state's {world} is {origin[0]} x {origin[1]} = {slots} slots; an elastic resume of this "
            f"dataset re-plans from at most {bound}"
        )


def report(plan: ElasticPlan, k: int) -> dict[str, int]:
    """Counts of an elastic re-plan: remaining patches and images, images partly consumed, dropped patches."""
    items = plan.items  # every old slot replayed: once
    if not len(items):
        return {"patches": 0, "images": 0, "partial_images": 0, "per_slot": 0, "dropped": 0}
    ids = items[:, 0] * (1 << 40) + items[:, 1] // k
    _, counts = np.unique(ids, return_counts=True)
    return {
        "patches": int(len(items)),
        "images": int(len(counts)),
        "partial_images": int((counts < k).sum()),
        "per_slot": int(plan.per_slot),
        "dropped": int(plan.dropped),
    }
