"""A model run on inputs padded to its size requirements (spandrel's ``size_requirements``: a minimum side,
a multiple of a window size, square), the output cropped back to ``scale`` times the input.

Used where a spandrel model meets images of any size: training patches, validation images, ``wdsr upscale``
tiles. The padding is reflection (up to the side minus one), then replication.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Padded(nn.Module):
    """``net`` on inputs padded (reflected, then replicated) to its size requirements, the output cropped
    back: windowed transformers run on any size. The state dict is ``net.``-prefixed: save ``net``'s own."""

    def __init__(self, net: nn.Module, scale: int, multiple: int = 1, minimum: int = 0, square: bool = False) -> None:
        super().__init__()
        self.net, self.scale = net, scale
        self.multiple, self.minimum, self.square = max(1, multiple), minimum, square

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        th, tw = (-(-max(self.minimum, n) // self.multiple) * self.multiple for n in (h, w))
        if self.square:
            th = tw = max(th, tw)
        if (th, tw) == (h, w):
            return self.net(x)
        ph, pw = th - h, tw - w
        rh, rw = min(ph, h - 1), min(pw, w - 1)
        x = nn.functional.pad(x, (0, rw, 0, rh), mode="reflect") if rh or rw else x
        x = nn.functional.pad(x, (0, pw - rw, 0, ph - rh), mode="replicate") if ph > rh or pw > rw else x
        return self.net(x)[..., : h * self.scale, : w * self.scale]


def padded(net: nn.Module, desc: Any) -> nn.Module:
    """``net`` run as its descriptor's size requirements say (itself when it has none)."""
    req = desc.size_requirements
    if req.minimum == 0 and req.multiple_of == 1 and not req.square:
        return net
    return Padded(net, desc.scale, req.multiple_of, req.minimum, req.square)


def bare(net: nn.Module) -> nn.Module:
    """The architecture itself (its native state dict keys), inside a :class:`Padded` or not."""
    return net.net if isinstance(net, Padded) else net
