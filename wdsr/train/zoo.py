"""The SR models people train and share, through spandrel (``pip install 'wdsr[zoo]'``): ``--model spandrel:NAME``.

spandrel builds ~40 architectures and loads ``.pth``/``.safetensors`` files, detecting the architecture and
its options from the weights' names and shapes. Here a bare architecture is built by name at ``--scale``
(:func:`options`), and a run's checkpoint records the architecture and
its options (:func:`record`: ``{"arch", "hyperparameters"}``, plain values only) so a resume or ``wdsr
upscale`` rebuilds it exactly (:func:`rebuild`). Every model is checked the way spandrel will see it: its
own weights detected back as the same architecture, an SR model at the same scale (:func:`describe`: what
``wdsr export`` writes loads back). Files and a run's model: :mod:`wdsr.train.zooload`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from shardmaker.errors import brief, require_extra
from wdsr.train.untrusted import AllocationBudget, BudgetError

PREFIX = "spandrel:"
_SCALE_ARGS = ("upscale", "scale", "upscale_factor", "up_scale", "upscaling_factor")  # how archs name their scale
_IN_ARGS = ("num_in_ch", "in_nc", "in_chans", "in_channels", "in_ch", "inp_channels")  # ... and their input channels
_OUT_ARGS = ("num_out_ch", "out_nc", "out_chans", "out_channels", "out_ch")
_PLAIN = (bool, int, float, str, type(None))
MAX_ARGS_CHARS = 4096
MAX_DEPTH, MAX_ITEMS = 4, 4096  # an option's list value: nesting and length


class ZooError(ValueError):
    """A spandrel model that cannot be built or used as asked (exit 2)."""


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """``--model spandrel:NAME``: spandrel's architecture ``arch`` (its id, e.g. ``SPAN``, ``ESRGAN``)."""

    arch: str

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str) or not re.fullmatch(r"[A-Za-z0-9_]{1,64}", self.arch):
            raise ZooError(f"--model {PREFIX}{brief(self.arch)}: not an architecture name")

    @property
    def value(self) -> str:
        return PREFIX + self.arch

    @property
    def video(self) -> bool:
        return False


def spandrel() -> Any:
    """The spandrel module, or one line naming what to install: ``wdsr[zoo]``, or torchvision (spandrel imports
    it) in the release built for this torch."""
    try:
        return importlib.import_module("spandrel")
    except ModuleNotFoundError as exc:
        if exc.name == "torchvision":
            pin = f"torchvision=={_torchvision_for(torch.__version__)}"
            raise ZooError(
                f"spandrel needs torchvision, which is not installed: pip install {pin} "
                f"(the release for torch {torch.__version__})"
            ) from None
    return require_extra("spandrel", "--model spandrel:NAME, --init and model files")


def _torchvision_for(version: str) -> str:
    """torch 2.m.p pairs with torchvision 0.(m+15).p (2.13.0 -> 0.28.0)."""
    parts = version.split("+")[0].split(".")
    return f"0.{int(parts[1]) + 15}.{parts[2]}" if len(parts) >= 3 and parts[0] == "2" and parts[1].isdigit() else "*"


@functools.cache  # spandrel's registry is walked (every architecture module imported) once a process
def _classes() -> dict[str, tuple[str, type]]:
    """Name -> (arch id, model class): each architecture by its id, and its classes by their names."""
    out: dict[str, tuple[str, type]] = {}
    for support in spandrel().MAIN_REGISTRY:
        arch = support.architecture.id
        module = importlib.import_module(f"spandrel.architectures.{arch}")
        classes = [getattr(module, n) for n in module.__all__ if not n.endswith("Arch")]
        out[arch] = (arch, classes[0])
        for cls in classes:
            out.setdefault(cls.__name__, (arch, cls))
    return out


def _scale_arg(cls: type) -> str | None:
    params = inspect.signature(cls).parameters
    return next((p for p in _SCALE_ARGS if p in params), None)


def lookup(name: str) -> tuple[str, type, str]:
    """``(arch id, model class, its scale argument)`` of a spandrel name; an unknown name lists the SR ones."""
    classes = _classes()
    if name not in classes:
        sr = sorted(n for n, (arch, cls) in classes.items() if n == arch and _scale_arg(cls))
        raise ZooError(f"--model {PREFIX}{brief(name)}: not a spandrel architecture (SR ones: {', '.join(sr)})")
    arch, cls = classes[name]
    scale_arg = _scale_arg(cls)
    if scale_arg is None:
        raise ZooError(
            f"--model {PREFIX}{name}: {cls.__name__} takes no scale (a restoration, face or inpainting model, or one "
            "class per scale): wdsr train trains SR models at --scale >= 2; fine-tune a file of it with --init"
        )
    return arch, cls, scale_arg


def parse_args(value: Any) -> dict[str, Any]:
    """``--model-args k=v,k2=[1,2]`` (values read as YAML scalars/lists) or a mapping; names checked later."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        items = dict(value)
    elif isinstance(value, str) and len(value) <= MAX_ARGS_CHARS:
        import yaml

        items = {}
        for part in re.split(r",(?=\s*[A-Za-z_]\w*\s*=)", value.strip()) if value.strip() else []:
            key, eq, text = part.partition("=")
            if not eq or not key.strip():
                raise ZooError(f"--model-args: {brief(part)} is not NAME=VALUE")
            try:
                items[key.strip()] = yaml.safe_load(text) if text.strip() else ""
            except (yaml.YAMLError, RecursionError):  # [[[[... 600 deep: PyYAML's parser recurses
                raise ZooError(f"--model-args: {key.strip()}={brief(text)}: not a value") from None
    else:
        raise ZooError(f"--model-args must be NAME=VALUE,... or a mapping, got {brief(value)}")
    for key, v in items.items():
        if not isinstance(key, str) or not _plain(v):
            raise ZooError(f"--model-args: {brief(key)}={brief(v)}: names are strings, values numbers, strings or short lists")
    return items


def _plain(v: Any, depth: int = 0) -> bool:
    """A number, string, None, or a list of them nested at most ``MAX_DEPTH`` deep, ``MAX_ITEMS`` long (an option's
    value: a checkpoint's record is untrusted, and a list 10^5 deep cannot even be printed)."""
    if isinstance(v, _PLAIN):
        return True
    nested = isinstance(v, (list, tuple)) and depth < MAX_DEPTH and len(v) <= MAX_ITEMS
    return nested and all(_plain(x, depth + 1) for x in v)


def options(model: ZooModel, scale: int, channels: int, args: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments that build ``model``: ``args`` (each a known option), the scale, and the
    channels where the architecture names them and ``args`` does not."""
    arch, cls, scale_arg = lookup(model.arch)
    params = inspect.signature(cls).parameters
    known = list(params)
    for key in args:
        if key not in params:
            raise ZooError(f"--model-args: {cls.__name__} has no option {brief(key)} (its options: {', '.join(known)})")
    if scale_arg in args:
        raise ZooError(f"--model-args: {scale_arg} is the scale: give --scale")
    kw = {scale_arg: scale, **args}
    for names in (_IN_ARGS, _OUT_ARGS):
        name = next((n for n in names if n in params), None)
        if name is not None and name not in args:
            kw[name] = channels
    return kw


def construct(cls: type, kw: Mapping[str, Any], what: str) -> nn.Module:
    try:
        return cls(**kw)
    except BudgetError:
        raise
    except Exception as exc:  # noqa: BLE001 - an architecture rejects options in its own words
        raise ZooError(
            f"{what}: {cls.__name__}({_args_text(kw)}) cannot be built ({type(exc).__name__}: {str(exc)[:160]})"
        ) from None


def _args_text(kw: Mapping[str, Any]) -> str:
    return brief(", ".join(f"{k}={brief(v, 60)}" for k, v in kw.items()), 200).strip("'\"")


def _on_meta(build: Any, what: str) -> nn.Module | None:
    """``build()`` laid out on the meta device (shapes only, nothing allocated), or None for an architecture
    whose constructor computes with its tensors (SwinIR's drop-path schedule): it can only be built for real."""
    try:
        with torch.device("meta"), AllocationBudget(None, what):  # counted: never a 10^9-layer loop
            return build()
    except ZooError as exc:
        if "meta" in str(exc):
            return None
        raise


def check_buildable(model: ZooModel, scale: int, channels: int, args: Mapping[str, Any]) -> None:
    """The settings build the architecture (on the meta device where it can be: nothing is allocated)."""
    arch, cls, _ = lookup(model.arch)
    kw = options(model, scale, channels, args)
    _on_meta(lambda: construct(cls, kw, f"--model {model.value}"), f"--model {model.value}")


def layout(rec: Any, where: str) -> dict[str, torch.Tensor] | None:
    """The names and shapes of the weights a checkpoint's record builds (meta tensors), or None where the
    architecture cannot be laid out without building it."""
    net = _on_meta(lambda: rebuild(rec, where), where)
    return None if net is None else net.state_dict()


def describe(net: nn.Module, arch: str, what: str) -> Any:
    """spandrel's descriptor of ``net``'s own weights: detected back as ``arch``, an SR model (what an
    exported file is to spandrel). A ZooError saying why not."""
    state = {k: v.detach() for k, v in net.state_dict().items()}
    try:
        desc = spandrel().MAIN_REGISTRY.load(state)
    except Exception as exc:  # noqa: BLE001 - UnsupportedModelError, or an architecture's own check
        why = f"{type(exc).__name__}: {str(exc)[:120]}" if str(exc) else "no architecture it knows has these names"
        raise ZooError(f"{what}: spandrel does not recognise these weights ({why})") from None
    if desc.architecture.id != arch:
        raise ZooError(f"{what}: spandrel reads these weights as {desc.architecture.id}, not {arch}; choose other options")
    if desc.purpose != "SR" or desc.scale < 2:
        raise ZooError(
            f"{what}: spandrel reads these weights as a {desc.purpose} model x{desc.scale}, not SR; wdsr trains SR "
            "(its upsampler may be off with these options)"
        )
    return desc


def record(net: nn.Module, arch: str) -> dict[str, Any]:
    """What a checkpoint's config holds to rebuild ``net``: its architecture and plain options."""
    hp = getattr(net, "hyperparameters", {}) or {}
    return {"arch": arch, "class": type(net).__name__, "hyperparameters": {k: v for k, v in hp.items() if _plain(v)}}


def rebuild(rec: Any, where: str) -> nn.Module:
    """The architecture a checkpoint's ``spandrel`` record names, freshly initialised (load its weights next)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("arch"), str) or not isinstance(rec.get("hyperparameters"), dict):
        raise ZooError(f"{where}: the checkpoint's 'spandrel' record must hold 'arch' and 'hyperparameters'")
    bad = next((k for k, v in rec["hyperparameters"].items() if not isinstance(k, str) or not _plain(v)), None)
    if bad is not None:
        raise ZooError(f"{where}: the checkpoint's 'spandrel' option {brief(bad)} is not a number, string or short list")
    classes = _classes()
    name = rec.get("class") if isinstance(rec.get("class"), str) else rec["arch"]
    if name not in classes or classes[name][0] != rec["arch"]:
        raise ZooError(f"{where}: spandrel {spandrel().__version__} has no {brief(name)} of {brief(rec['arch'])}")
    return construct(classes[name][1], rec["hyperparameters"], where)
