"""``make demo``: shards from scikit-image's bundled photos (``python -m shardmaker.demo``), then
batches streamed from them, a contact sheet of LR|HR patches and a bicubic pass over the held-out val set."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from shardmaker.imaging import ResizeMethod, upscale
from wdsr.config import DatasetConfig
from wdsr.dataset import SRDataset
from wdsr.loader import make_loader
from wdsr.metrics import psnr_y, ssim_y
from wdsr.tools.preview import contact_sheet, write_png


def stream_demo(shards: str, val_shards: str) -> int:
    workers = min(2, os.cpu_count() or 1)
    ds = SRDataset(shards, scale=4, patch_size=96, patches_per_image=16, batch_size=16, shuffle_buffer=128)
    loader = make_loader(ds, num_workers=workers)
    print(f"\n== wdsr: {ds}\n   len(loader) = {len(loader)} batches per epoch on this rank, {workers} workers")
    t0, n = time.perf_counter(), 0
    for epoch in range(2):
        ds.set_epoch(epoch)
        for batch in loader:
            n += 1
            last = batch
    lr, hr = last
    dt = time.perf_counter() - t0
    print(
        f"   2 epochs: {n} batches of lr {tuple(lr.shape)} {lr.dtype} / hr {tuple(hr.shape)}, "
        f"{n * 16 / dt:.0f} patches/s (worker start-up included)"
    )
    sheet = Path(shards).parent / "preview.png"
    write_png(str(sheet), contact_sheet(shards, DatasetConfig(scale=4, patch_size=96), 8))
    print(f"   contact sheet of LR|HR patch pairs, labelled with key and transform: {sheet}")
    val = make_loader(SRDataset(val_shards, scale=4, split="val"), num_workers=0)
    psnrs, ssims = [], []
    for item in val:
        low = np.ascontiguousarray(item.lr[0].permute(1, 2, 0).numpy())
        sr = upscale(low, 4, ResizeMethod.MATLAB)
        psnrs.append(psnr_y(sr, item.hr, crop_border=4))
        ssims.append(ssim_y(sr, item.hr, crop_border=4))
    baseline = f"bicubic x4 baseline PSNR-Y {np.mean(psnrs):.2f} dB, SSIM-Y {np.mean(ssims):.4f}"
    print(f"   val set {val_shards}: {len(psnrs)} held-out images; {baseline}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m wdsr.tools.demo", description=__doc__)
    p.add_argument("--out", default="demo-out", help="work folder (default: demo-out)")
    args = p.parse_args(argv)
    rc = subprocess.run([sys.executable, "-m", "shardmaker.demo", "--out", args.out], check=False).returncode
    if rc:
        return rc
    return stream_demo(str(Path(args.out) / "shards"), str(Path(args.out) / "val"))


if __name__ == "__main__":
    sys.exit(main())
