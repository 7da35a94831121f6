"""A ``wdsr train`` checkpoint checked before its model is built (``wdsr upscale``). A checkpoint is
untrusted input, and building the model it names allocates what its config claims (``scale: 2000``:
a 13.8 GB upsampler before a single weight is compared). So the claim is checked first (a known model,
an integer scale in the range ``wdsr train`` trains, 1 or 3 channels), then the model is laid out on the
meta device (no memory) and its parameter names and shapes are held to the checkpoint's weights: the
real build only ever allocates what the file itself carried."""

from __future__ import annotations

from typing import Any

import torch

from shardmaker.errors import brief
from wdsr.bounds import check_number
from wdsr.config import LIMITS
from wdsr.train.checkpoint import RunError
from wdsr.train.models import ModelName, build_model
from wdsr.train.untrusted import check_shapes

MIN_SCALE, MAX_SCALE = 2, LIMITS["scale"][1]  # what wdsr train trains (--scale)
CHANNELS = (1, 3)  # grey or RGB


def check_checkpoint(state: dict[str, Any], where: str) -> tuple[str, int, int]:
    """``(model name, scale, channels)`` of a checkpoint's config and weights, each checked, and the
    weights' names and shapes equal to the model's (laid out on the meta device); a RunError naming
    ``where`` and the first thing wrong otherwise."""
    config = state.get("config") or {}
    if not isinstance(config, dict) or "model" not in config or "scale" not in config:
        raise RunError(f"{where}: the checkpoint's config lacks 'model' or 'scale'")
    names = [m.value for m in ModelName]
    name = config["model"]
    if not isinstance(name, str) or name not in names:
        raise RunError(f"{where}: the checkpoint's model {brief(name)} is not one of {', '.join(names)}")
    try:
        scale = int(check_number("scale", config["scale"], MIN_SCALE, MAX_SCALE, integer=True))
    except ValueError as exc:
        raise RunError(f"{where}: the checkpoint's {exc}") from None
    weights = state["model"]
    for key, value in weights.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise RunError(f"{where}: the checkpoint's weights hold {brief(key)}: {type(value).__name__}, not a tensor")
    convs = [v for v in weights.values() if v.ndim == 4]
    if not convs:
        raise RunError(f"{where}: the checkpoint holds no convolution weights")
    channels = int(convs[0].shape[1])  # the first conv's input channels: 3 (RGB) or 1 (grey)
    if channels not in CHANNELS:
        raise RunError(f"{where}: the checkpoint's first convolution takes {channels} channels, not 1 (grey) or 3 (RGB)")
    with torch.device("meta"):  # shapes only: nothing is allocated
        expected = build_model(name, scale, channels).state_dict()
    check_shapes(expected, weights, f"{where}: weights do not fit {name} x{scale}")
    return name, scale, channels
