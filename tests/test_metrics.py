"""PSNR/SSIM on Y reproduce the published Set5 bicubic baselines from the MATLAB LR files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import wdsr
from shardmaker.imaging.resize import ResizeMethod, upscale
from tests.helpers import build_shards, needs_refdata, photos
from wdsr.metrics import psnr_y, ssim_y, to_y

PUBLISHED = {2: (33.66, 0.9299), 3: (30.39, 0.8682), 4: (28.42, 0.8104)}


@needs_refdata
def test_set5_bicubic_baselines_through_the_val_split(tmp_path, refdata):
    lr = refdata / "set5/LR_bicubic"
    ds_path = build_shards(
        refdata / "set5/HR", tmp_path / "set5", "--lr", str(lr / "X2"), "--lr", str(lr / "X3"), "--lr", str(lr / "X4")
    )
    for s, (psnr_ref, ssim_ref) in PUBLISHED.items():
        val = wdsr.make_loader(wdsr.SRDataset(str(ds_path), scale=s, split="val"), num_workers=0)
        psnrs, ssims = [], []
        for item in val:
            low = item.lr[0].permute(1, 2, 0).numpy()
            sr = upscale(np.ascontiguousarray(low), s, ResizeMethod.MATLAB_UINT8)  # MATLAB imresize on uint8
            psnrs.append(psnr_y(sr, item.hr, crop_border=s))
            ssims.append(ssim_y(sr, item.hr, crop_border=s))
        assert len(psnrs) == 5
        assert abs(np.mean(psnrs) - psnr_ref) < 0.05, (s, np.mean(psnrs))
        assert abs(np.mean(ssims) - ssim_ref) < 0.002, (s, np.mean(ssims))


def test_metric_basics():
    img = photos()[0][:64, :64]
    assert psnr_y(img, img) == float("inf") and ssim_y(img, img) == pytest.approx(1.0)
    y = to_y(img)
    assert 16 <= y.min() and y.max() <= 235
    noisy = np.clip(img.astype(int) + 4, 0, 255).astype(np.uint8)
    # a +4 shift in RGB is a shift of 4 * (65.481+128.553+24.966)/255 = 3.435 in Y, away from clipping
    mse = np.mean((to_y(noisy) - y) ** 2)
    assert psnr_y(noisy, img) == pytest.approx(10 * np.log10(255**2 / mse))
    # tensors in CHW, [0,1] floats and uint8 arrays give the same number
    t = torch.from_numpy(img).permute(2, 0, 1)
    assert psnr_y(t, noisy) == pytest.approx(psnr_y(img, noisy))
    assert psnr_y(t.float() / 255, noisy) == pytest.approx(psnr_y(img, noisy))
    assert ssim_y(noisy, img, crop_border=4) < 1.0
