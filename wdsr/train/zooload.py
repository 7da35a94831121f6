"""spandrel models loaded: a model file (``--init``, ``wdsr upscale FILE``) and the model of a run (:func:`for_run`).

A file is read through the one regular-file opener: ``.safetensors`` with safetensors, ``.pth``/``.ckpt`` with
``torch.load(weights_only=True)`` (tensors only, never pickled code), then canonicalised and detected by
spandrel (architecture, options and scale from the weights' names and shapes).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from shardmaker import storage
from wdsr.train.checkpoint import load_torch
from wdsr.train.padding import padded
from wdsr.train.untrusted import BudgetError, bounded, check_shapes
from wdsr.train.zoo import PREFIX, ZooError, ZooModel, construct, describe, layout, lookup, options, rebuild, record, spandrel

log = logging.getLogger("wdsr")
FILE_SUFFIXES = (".safetensors", ".pth", ".ckpt")  # model files (wdsr train's checkpoints are .pt)
MAX_FILE_BYTES = 4 << 30  # the largest model file read (community SR models are KBs to a few hundred MB)
MAX_HEADER_BYTES = 16 << 20  # a safetensors header's JSON (~100 bytes a tensor; safetensors itself allows 100 MB)


def _read_bounded(path: str) -> bytes:
    """The bytes of the regular file at ``path`` (never a FIFO or device), its size checked before reading."""
    try:
        with storage.open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise ZooError(f"{path}: {size} bytes, more than a model file holds (at most {MAX_FILE_BYTES})")
            return f.read(size + 1)
    except OSError as exc:
        raise ZooError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    """A model file's tensors (``.safetensors``, or ``.pth``/``.ckpt`` read with ``weights_only``), as spandrel
    canonicalises them (``params_ema``, ``module.`` prefixes)."""
    data = _read_bounded(path)
    safetensors = path.lower().endswith(".safetensors")
    if safetensors:
        _check_header(data, path)
    try:
        if safetensors:
            from safetensors.torch import load as load_safetensors

            state: Any = load_safetensors(data)
        else:
            state = load_torch(data)
    except Exception as exc:  # noqa: BLE001 - many types for a file that is not a model
        first = (str(exc).splitlines() or [""])[0][:120]
        raise ZooError(f"{path}: not a readable model file ({type(exc).__name__}: {first})") from None
    if isinstance(state, dict) and "format" in state and "model" in state:  # wdsr train's own checkpoint
        raise ZooError(f"{path}: a wdsr train checkpoint, not a model file: --resume its run, or `wdsr export` it first")
    return tensors_of(state, path)


def _check_header(data: bytes, path: str) -> None:
    """A safetensors file's 8-byte header length: within the file and at most ``MAX_HEADER_BYTES``."""
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if not 0 < n <= min(MAX_HEADER_BYTES, len(data) - 8):
        raise ZooError(f"{path}: a safetensors header of {n} bytes in a {len(data)}-byte file (at most {MAX_HEADER_BYTES})")


def tensors_of(state: Any, path: str) -> dict[str, torch.Tensor]:
    """A loaded file's state dict as spandrel canonicalises it, checked to hold finite tensors only."""
    if not isinstance(state, dict):
        raise ZooError(f"{path}: holds {type(state).__name__}, not a state dict")
    state = spandrel().canonicalize_state_dict(state)
    if not state or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ZooError(f"{path}: not a state dict of tensors")
    if not all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point()):
        raise ZooError(f"{path}: the weights hold inf or NaN")
    return state


def load_file(path: str) -> Any:
    """A spandrel descriptor of a model file (architecture and scale from its weights), checked to be SR; a
    ``.pt`` is one too when it is not a wdsr train checkpoint (community files use that suffix as well)."""
    if not path.lower().endswith((*FILE_SUFFIXES, ".pt")):
        raise ZooError(f"{path}: a model file is {', '.join((*FILE_SUFFIXES, '.pt'))}")
    return detect(read_state_dict(path), path)


def detect(state: dict[str, torch.Tensor], path: str) -> Any:
    """spandrel's descriptor of ``path``'s tensors (:func:`tensors_of`), built within the allocation budget, SR."""
    try:
        with bounded(state, path):  # the architecture's options come from the shapes: nothing giant is built
            desc = spandrel().MAIN_REGISTRY.load(state)
    except BudgetError:
        raise
    except Exception as exc:  # noqa: BLE001 - UnsupportedModelError, or an architecture's own check
        why = f"{type(exc).__name__}: {str(exc)[:120]}" if str(exc) else "no architecture it knows has these weights' names"
        raise ZooError(f"{path}: spandrel does not recognise this model ({why})") from None
    if desc.purpose != "SR" or desc.scale < 2:
        raise ZooError(f"{path}: a {desc.purpose} model x{desc.scale} ({desc.architecture.id}); wdsr trains and runs SR models")
    return desc


def rebuilt(rec: Any, weights: Mapping[str, Any], where: str) -> nn.Module:
    """The architecture a checkpoint's ``spandrel`` record names, for its ``weights``: the record is untrusted, so
    its layout (on the meta device, where it can be) is held to the weights' names and shapes first, and the real
    build may allocate only what such weights justify."""
    expected = layout(rec, where)
    if expected is not None:
        check_shapes(expected, weights, f"{where}: weights do not fit spandrel {rec['arch']}")  # layout checked the record
    with bounded(weights, where):
        return rebuild(rec, where)


def for_run(
    model: ZooModel,
    args: Mapping[str, Any],
    init: str | None,
    scale: int,
    channels: int,
    saved: Any,
    where: str,
    weights: Mapping[str, Any] | None = None,
) -> tuple[nn.Module, nn.Module, dict[str, Any]]:
    """``(the architecture, it as run: padded, its record)`` for ``wdsr train``: rebuilt from a checkpoint's
    ``saved`` record and held to its ``weights`` (a resume: never from the --init file), else loaded from
    ``init``, else built fresh."""
    what = f"--model {model.value}"
    if saved is not None:
        net, arch = rebuilt(saved, weights or {}, where), str(saved["arch"])
    elif init:
        found = load_file(init)
        net, arch, what = found.model, found.architecture.id, f"--init {init}"
    else:
        arch, cls, _ = lookup(model.arch)  # an id, or a class name (RRDBNet: ESRGAN)
        net = construct(cls, options(model, scale, channels, args), what)
    desc = describe(net, arch, what)
    if desc.scale != scale:
        raise ZooError(f"{what}: a x{desc.scale} model, not --scale {scale}")
    if desc.input_channels != channels or desc.output_channels != channels:
        raise ZooError(
            f"{what}: takes {desc.input_channels} and gives {desc.output_channels} channels; the data has {channels} "
            "(set its channels in --model-args)"
        )
    net.train()
    params = sum(p.numel() for p in net.parameters())
    log.info("%s: spandrel %s x%d, %.2fM parameters%s", what, arch, desc.scale, params / 1e6, " (resumed)" * (saved is not None))
    return net, padded(net, desc), record(net, arch)


def build(name: str, scale: int, channels: int = 3, args: Mapping[str, Any] | None = None) -> nn.Module:
    """``spandrel:NAME`` (or ``NAME``) x``scale``, freshly initialised, checked and padded to its size
    requirements: what ``wdsr train --model spandrel:NAME --model-args ...`` trains (``bench/gpu_check.py``)."""
    model = ZooModel(name[len(PREFIX) :] if name.startswith(PREFIX) else name)
    return for_run(model, args or {}, None, scale, channels, None, f"--model {model.value}")[1]
