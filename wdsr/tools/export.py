"""``wdsr export RUN -o FILE``: a run's spandrel model as a plain state dict that spandrel (and chaiNNer,
ComfyUI) loads back, detecting the architecture and scale from its keys.

The keys are the architecture's own (no ``net.`` or ``module.`` prefix, nothing but the weights), each tensor
contiguous and unshared (safetensors stores no aliases). Before anything is written the state dict is loaded
back through spandrel's detection: it must come back as the same architecture and scale. The file is written
beside its name and moved onto it; an existing file is replaced only with ``overwrite``.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from shardmaker.errors import require_extra
from wdsr.tools.upscale import load_model, write_output
from wdsr.train.checkpoint import RunError
from wdsr.train.padding import bare
from wdsr.train.zoo import PREFIX

SUFFIXES = (".safetensors", ".pth")


def state_bytes(state: dict[str, torch.Tensor], suffix: str) -> bytes:
    """``state`` as a ``.safetensors`` or ``.pth`` file's bytes."""
    if suffix == ".safetensors":
        st = require_extra("safetensors.torch", "wdsr export FILE.safetensors", "safetensors")
        return bytes(st.save(state))
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def export(source: str, output: str, overwrite: bool = False) -> str:
    """Write ``source``'s (a run folder or checkpoint) spandrel model to ``output``; returns a line saying what."""
    target = Path(output)
    suffix = target.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"-o {output}: a model file is .safetensors or .pth")
    if target.exists() and not overwrite:
        raise ValueError(f"{target}: exists; give --overwrite to replace it")
    if not target.parent.is_dir():
        raise ValueError(f"-o {output}: no such folder {target.parent}")
    m = load_model(source)
    if not m.name.startswith(PREFIX):
        raise RunError(
            f"{m.source}: {m.name} is wdsr's own model, used from its checkpoints (wdsr upscale RUN); wdsr export "
            "writes spandrel models (runs of --model spandrel:NAME or --init)"
        )
    arch = m.name[len(PREFIX) :]
    net = bare(m.model)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in net.state_dict().items()}
    # load_model held these very keys to spandrel's detection (describe, or detect for a file)
    write_output(target, state_bytes(state, suffix), overwrite)
    return f"wrote {target}: spandrel {arch} x{m.scale} ({len(state)} tensors) from {m.source}, step {m.step}"
