"""Real-world degradations made on the device from uint8 HR patches (DESIGN.md section 7).

The API a loader needs (see docs/degrade.md):

    cfg = wdsr.RealESRGANConfig()                        # or BSRGANConfig(), ArbitraryScaleConfig(); checked
    p = draw_params(cfg, rng, patch_size)                # worker: one sample, rng = numpy Generator
    params = collate_params([p0, p1, ...])               # the batch: one tensor per key, rows = samples
    lr, hr = wdsr.Degrader(cfg)(hr_uint8.cuda(), params)  # device: float32 (lr, hr)

``draw_params`` takes every random number from ``rng`` (the pipeline seeds it from (seed, epoch, key, j)),
builds the blur kernels there and returns a dict of small CPU tensors; the Degrader's noise comes from
torch generators seeded by those parameters, so a sample's LR depends on its parameters alone.
``Degrader(cfg, granularity="batch")`` is Real-ESRGAN's per-batch variant (row 0's per-batch draws);
``ArbitraryScaleConfig`` is per batch alone (row 0's float scale: one LR size per batch).
The models and their names (``realesrgan``, ``bsrgan``, ``arbitrary``) are listed once, in
:data:`wdsr.degrade.registry.DEGRADATIONS`."""

from wdsr.degrade.config import ArbitraryScaleConfig, BSRGANConfig, RealESRGANConfig
from wdsr.degrade.degrader import Degrader, collate_params, draw_arrays, draw_params
from wdsr.degrade.registry import DEGRADATIONS, Degradation

__all__ = [
    "DEGRADATIONS",
    "ArbitraryScaleConfig",
    "BSRGANConfig",
    "Degradation",
    "Degrader",
    "RealESRGANConfig",
    "collate_params",
    "draw_arrays",
    "draw_params",
]
