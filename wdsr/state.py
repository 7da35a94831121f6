"""A loader's position as a small JSON-able dict: what ``SRLoader.state_dict()`` saves and
``load_state_dict()`` checks before a resume (the dataset, the settings that decide the batches,
the world, the epoch and the batches handed out), and the elastic case where the world changed."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from wdsr.config import Split
from wdsr.pipeline.plan import whole_batches

if TYPE_CHECKING:
    from wdsr.dataset import SRDataset
    from wdsr.pipeline.elastic import ElasticPlan

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
    field, a change of world turned into an elastic origin, a finished epoch into the next one."""
    _check_fields(ds, state)
    epoch, done = state["epoch"], state["batches"]
    origin = _elastic_origin(state)
    same_world = (state["world_size"], state["num_workers"]) == (ds.world.size, num_workers)
    if not same_world and origin is not None:
        raise WorldChanged(
            f"the loader state is inside an epoch already re-planned from {origin[0]} x {origin[1]} to "
            f"{state['world_size']} x {state['num_workers']} slots; a second change of world within one epoch "
            "is not supported"
        )
    if not same_world and done:
        if type(state["world_size"]) is not int or type(state["num_workers"]) is not int or state["world_size"] < 1:
            raise LoaderStateError("the loader state's world_size/num_workers must be integers")
        old_len = max(1, state["num_workers"]) * ds.batches_per_worker(state["num_workers"], state["world_size"])
        if done > old_len:
            raise LoaderStateError(f"the loader state is {done} batches into an epoch of {old_len}")
        if done < old_len:
            origin, done = (state["world_size"], state["num_workers"], done), 0
        else:
            epoch, done = epoch + 1, 0
    length = pass_length(ds, num_workers, epoch, origin)
    if done > length:
        raise LoaderStateError(f"the loader state is {done} batches into an epoch of {length}")
    if done == length:
        return epoch + 1, 0, None
    return epoch, done, origin


def _check_fields(ds: SRDataset, state: Any) -> None:
    if not isinstance(state, dict):
        raise LoaderStateError(f"a loader state is a dict, got {type(state).__name__}")
    need = ("format", "dataset", *MATCH, "world_size", "num_workers", "epoch", "batches")
    missing = [k for k in need if k not in state]
    if missing:
        raise LoaderStateError(f"the loader state lacks {', '.join(missing)} (truncated, or not a wdsr loader state)")
    if state["format"] != STATE_FORMAT:
        raise LoaderStateError(f"loader state format {state['format']!r}; this wdsr reads {STATE_FORMAT!r}")
    if state.get("patch_draws") != PATCH_DRAWS:
        log.warning(
            "the loader state was saved by a wdsr that drew patch positions another way (%s); the run "
            "continues at the same batch with the same images, but the rest of this epoch cuts other patches "
            "than that version would have",
            state.get("patch_draws", "numpy PCG64"),
        )
    if state["dataset"] != ds.identity:
        raise LoaderStateError(
            f"the loader state is from another dataset (manifest sha256 {str(state['dataset'])[:12]}..., "
            f"{ds.url} has {ds.identity[:12]}...)"
        )
    for name in MATCH:
        if state[name] != getattr(ds.config, name):
            raise LoaderStateError(f"the loader state has {name}={state[name]!r}, this loader {getattr(ds.config, name)!r}")
    epoch, done = state["epoch"], state["batches"]
    if type(epoch) is not int or type(done) is not int or epoch < 0 or done < 0:
        raise LoaderStateError(f"the loader state's epoch/batches must be integers >= 0, got {epoch!r}/{done!r}")


def _elastic_origin(state: dict[str, Any]) -> Origin | None:
    if "elastic" not in state:
        return None
    e = state["elastic"]
    if not isinstance(e, dict) or any(type(e.get(n)) is not int or e[n] < 0 for n in ("world_size", "num_workers", "batches")):
        raise LoaderStateError(f"the loader state's elastic origin is malformed: {e!r}")
    return e["world_size"], e["num_workers"], e["batches"]


def report(plan: ElasticPlan, k: int) -> dict[str, int]:
    """Counts of an elastic re-plan: remaining patches and images, images partly consumed, dropped patches."""
    if not len(plan.items):
        return {"patches": 0, "images": 0, "partial_images": 0, "per_slot": 0, "dropped": 0}
    ids = plan.items[:, 0] * (1 << 40) + plan.items[:, 1] // k
    _, counts = np.unique(ids, return_counts=True)
    return {
        "patches": int(len(plan.items)),
        "images": int(len(counts)),
        "partial_images": int((counts < k).sum()),
        "per_slot": int(plan.per_slot),
        "dropped": int(plan.dropped),
    }
