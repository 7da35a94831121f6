"""Hostile degradation settings (issue 38, M4/M5): every number finite, every range ordered, every integer an
exact int, the field named, at construction and through BasicSR's YAML; resizes bounded (``MAX_RESIZE``) and
the pipeline at the bound measured in a child under an address-space cap."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from tests.helpers import ROOT
from wdsr import ArbitraryScaleConfig, BSRGANConfig, Degrader, RealESRGANConfig
from wdsr.degrade import collate_params, draw_params
from wdsr.degrade.config import MAX_RESIZE

NAN, INF = math.nan, math.inf

HOSTILE = [
    (RealESRGANConfig, "blur_sigma", (0.2, NAN)),
    (RealESRGANConfig, "blur_sigma2", (INF, INF)),
    (RealESRGANConfig, "blur_sigma", (0.2, 10**400)),
    (RealESRGANConfig, "blur_sigma", (0.2, None)),
    (RealESRGANConfig, "betag_range", (NAN, 4.0)),
    (RealESRGANConfig, "noise_range", (1.0, INF)),
    (RealESRGANConfig, "poisson_scale_range2", (0.05, 1e300)),
    (RealESRGANConfig, "jpeg_range", (NAN, 95.0)),
    (RealESRGANConfig, "resize_range", (0.15, NAN)),
    (RealESRGANConfig, "resize_range", (0.9, 30.0)),  # 3.4 GB for two 256 px patches
    (RealESRGANConfig, "resize_range2", (0.3, 1000.0)),
    (RealESRGANConfig, "resize_range", (0.15,)),
    (RealESRGANConfig, "resize_range", "abc"),
    (RealESRGANConfig, "blur_kernel_size", 21.0),
    (RealESRGANConfig, "blur_kernel_size", True),
    (RealESRGANConfig, "kernel_sizes", (7.0, 9)),
    (RealESRGANConfig, "kernel_sizes", ()),
    (RealESRGANConfig, "kernel_list", ()),
    (RealESRGANConfig, "kernel_prob", (NAN,) * 6),
    (RealESRGANConfig, "resize_prob", (0.5, 0.5, "0")),
    (RealESRGANConfig, "sinc_prob", NAN),
    (RealESRGANConfig, "sinc_prob", "0.5"),
    (RealESRGANConfig, "final_order_prob", True),
    (RealESRGANConfig, "gt_usm", "yes"),
    (RealESRGANConfig, "scale", 4.0),
    (RealESRGANConfig, "scale", True),
    (RealESRGANConfig, "gt_size", 256.0),
    (RealESRGANConfig, "gt_size", 10**30),
    (BSRGANConfig, "scale", 4.0),
    (BSRGANConfig, "scale", True),
    (BSRGANConfig, "blur_sizes", (7, 9.0)),
    (BSRGANConfig, "noise_range", (2.0, 25)),
    (BSRGANConfig, "noise_range", (2, 10**6)),
    (BSRGANConfig, "jpeg_range", (30, True)),
    (BSRGANConfig, "jpeg_prob", INF),
    (ArbitraryScaleConfig, "scale_range", (1.0, NAN)),
    (ArbitraryScaleConfig, "scale_range", (1.0, INF)),
    (ArbitraryScaleConfig, "gt_size", 192.0),
    (ArbitraryScaleConfig, "quantize", 1),
]


@pytest.mark.parametrize(("config", "field", "value"), HOSTILE, ids=[f"{c.__name__}.{f}={v!r}"[:60] for c, f, v in HOSTILE])
def test_a_hostile_setting_is_a_valueerror_naming_its_field(config: type, field: str, value: object) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        config(**{field: value})


def test_settings_are_normalised_so_a_config_stays_hashable() -> None:
    """A YAML list becomes the config's tuple (BasicSR's feed_data keys its Degraders by config)."""
    cfg = RealESRGANConfig(resize_range=[0.5, 2], kernel_sizes=[7, 9], kernel_prob=[0.45, 0.25, 0.12, 0.03, 0.12, 0.03])
    assert cfg.resize_range == (0.5, 2.0) and type(cfg.resize_range[1]) is float and cfg.kernel_sizes == (7, 9)
    assert hash(cfg) == hash(RealESRGANConfig(resize_range=(0.5, 2.0), kernel_sizes=(7, 9)))
    assert BSRGANConfig(noise_range=[2, 25]).noise_range == (2, 25)
    assert BSRGANConfig(noise_range=tuple(np.array([2, 25]))).noise_range == (2, 25)  # numpy ints are exact ints
    assert RealESRGANConfig(resize_range=(0.15, MAX_RESIZE), resize_range2=(0.3, MAX_RESIZE)).resize_range[1] == MAX_RESIZE


def test_the_basicsr_yaml_gives_the_same_errors() -> None:
    from wdsr.integrations.basicsr import dataset_options

    opt = {"type": "WdsrDataset", "scale": 4, "dataroot": "/d", "gt_size": 256}
    for degrade, field in (
        ({"type": "realesrgan", "resize_range": [0.9, 30]}, "resize_range"),
        ({"type": "realesrgan", "blur_sigma": [0.2, float("nan")]}, "blur_sigma"),
        ({"type": "realesrgan", "blur_kernel_size": 21.0}, "blur_kernel_size"),
        ({"type": "bsrgan", "noise_range": [2.5, 9]}, "noise_range"),
    ):
        with pytest.raises(ValueError, match=rf"^datasets\.train\.degrade: {field}"):
            dataset_options(opt | {"degrade": degrade})
    with pytest.raises(ValueError, match=r"^datasets\.train\.degrade: scale must be an integer"):
        dataset_options(opt | {"scale": 4.0, "degrade": "realesrgan"})
    # a list where a name or a mapping goes (a TypeError deep in the dataset before): one line naming it
    with pytest.raises(ValueError, match=r"datasets\.train\.degrade.*\['realesrgan'\] is not one of"):
        dataset_options(opt | {"degrade": ["realesrgan"]})


CHILD = """
import json, resource, sys
import numpy as np, torch
from wdsr import Degrader, RealESRGANConfig
from wdsr.degrade import collate_params, draw_params
from wdsr.degrade.config import MAX_RESIZE

def vm(field):
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith(field + ":"))) // 1024

torch.set_num_threads(1)
up = {"resize_prob": (1.0, 0.0, 0.0), "resize_prob2": (1.0, 0.0, 0.0)}
cfg = RealESRGANConfig(gt_size=128, resize_range=(0.9, MAX_RESIZE), resize_range2=(0.3, MAX_RESIZE), **up)
params = collate_params([draw_params(cfg, np.random.default_rng(i), 128) for i in range(2)])
params["resize_scale"][:] = MAX_RESIZE  # both rounds at the largest factor the config allows
hr = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (2, 3, 128, 128), dtype=np.uint8))
degrader = Degrader(cfg)
base = vm("VmRSS")
cap = (vm("VmSize") + int(sys.argv[1])) << 20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
lr, _ = degrader(hr, params)
print(json.dumps({"lr": list(lr.shape), "rss_mb": vm("VmHWM") - base}))
"""


def test_the_pipeline_at_the_resize_bound_stays_within_a_bounded_multiple_of_the_patch() -> None:
    """Two 128 px patches, every resize at ``MAX_RESIZE``: each intermediate is at most 4x the patch side
    (0.8 MB a float image here), so 256 MB of address space past the imports is plenty (``(0.9, 30)``
    asked 56x that per side)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), "256"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["lr"] == [2, 3, 32, 32] and out["rss_mb"] < 256, out


def test_a_hand_made_batch_cannot_ask_for_a_larger_intermediate() -> None:
    """``Degrader(hr, params)`` takes parameters from anyone: the ones that size an image are checked as the
    configs bound their draws (Real-ESRGAN's resize factors, BSRGAN's down-sampling factor, the float scale)."""
    hr = torch.zeros(1, 3, 128, 128, dtype=torch.uint8)
    for cfg, key, value in (
        (RealESRGANConfig(gt_size=128), "resize_scale", 30.0),
        (RealESRGANConfig(gt_size=128), "resize_scale", NAN),
        (BSRGANConfig(gt_size=128), "down2_scale", 0.01),
        (ArbitraryScaleConfig(gt_size=128), "scale", 0.01),
    ):
        params = collate_params([draw_params(cfg, np.random.default_rng(0), 128)])
        params[key] = torch.full_like(params[key], value)
        with pytest.raises(ValueError, match=rf"params\['{key}'\] must be finite and in"):
            Degrader(cfg)(hr, params)
