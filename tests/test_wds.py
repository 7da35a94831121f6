"""wdsr's stages inside a real ``webdataset`` pipeline (split_by_node / split_by_worker, DataLoader
workers), over our shards and over foreign shards written with ``wds.ShardWriter``."""

from __future__ import annotations

import hashlib
import io
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

import wdsr
import wdsr.wds as sr
from shardmaker.imaging.resize import ResizeMethod, downscale
from tests.helpers import photos


def _pipeline(urls: str | list[str], *stages) -> wds.DataPipeline:
    return wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_node, wds.split_by_worker, wds.tarfile_to_samples(), *stages)


def _digest(lr: torch.Tensor, hr: torch.Tensor) -> str:
    return hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes()).hexdigest()[:16]


def test_our_shards_in_a_wds_pipeline_give_srdatasets_patches(photo_shards, monkeypatch):
    urls = sorted(str(p) for p in photo_shards.glob("shard-*.tar"))
    stages = [wds.map(sr.decode_pair(scale=4)), sr.patches(k=3, patch_size=48, scale=4, seed=6), sr.batched(1, return_keys=True)]
    got: Counter = Counter()
    for rank in range(2):  # two nodes, each with a DataLoader of 2 workers: every shard once
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = torch.utils.data.DataLoader(_pipeline(urls, *stages), batch_size=None, num_workers=2)
        got.update((keys[0], _digest(lr, hr)) for lr, hr, keys in loader)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    ds = wdsr.SRDataset(
        str(photo_shards), scale=4, patch_size=48, patches_per_image=3, batch_size=1, shuffle_buffer=0, seed=6, return_keys=True
    )
    want = Counter((keys[0], _digest(lr, hr)) for lr, hr, keys in wdsr.make_loader(ds, num_workers=0))
    assert got == want and sum(got.values()) == 30  # the same 3 patches of each of the 10 images


def _foreign_jpeg_shards(tmp_path: Path) -> tuple[str, list[str]]:
    """Shards that another tool wrote: {key}.jpg (HR) and {key}.x4.jpg (LR), one sample without its LR."""
    pattern = str(tmp_path / "foreign-%06d.tar")
    keys = []
    with wds.ShardWriter(pattern, maxcount=3) as sink:
        for i, img in enumerate(photos() * 2):
            hr = np.ascontiguousarray(img[: img.shape[0] // 4 * 4, : img.shape[1] // 4 * 4])
            lr = downscale(hr, 4, ResizeMethod.MATLAB)
            sample = {"__key__": f"frame_{i:03d}", "jpg": _jpeg(hr)}
            if i != 5:
                sample["x4.jpg"] = _jpeg(lr)
            sink.write(sample)
            keys.append(f"frame_{i:03d}")
    return str(tmp_path / "foreign-{000000..000002}.tar"), keys


def _jpeg(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=97)
    return b.getvalue()


def test_foreign_jpeg_shards_give_aligned_patches_and_name_a_bad_sample(tmp_path):
    urls, keys = _foreign_jpeg_shards(tmp_path)
    decode = sr.decode_pair(scale=4, hr="jpg", lr="x4.jpg")
    with pytest.raises(wdsr.SampleError, match=r"frame_005.*has no 'x4.jpg' member"):
        list(_pipeline(urls, wds.map(decode)))
    stages = [
        wds.map(decode, handler=wds.ignore_and_continue),
        sr.patches(k=4, patch_size=64, scale=4, seed=1, augment=False),
        wds.shuffle(16),
        sr.batched(4, return_keys=True),
    ]
    loader = torch.utils.data.DataLoader(_pipeline(urls, *stages), batch_size=None, num_workers=2)
    seen, aligned, shifted = set(), [], []
    for lr, hr, batch_keys in loader:
        assert lr.dtype == hr.dtype == torch.uint8 and lr.shape[1:] == (3, 16, 16) and hr.shape[1:] == (3, 64, 64)
        seen.update(batch_keys)
        for a, b in zip(lr, hr):
            ref = downscale(np.ascontiguousarray(b.permute(1, 2, 0).numpy()), 4, ResizeMethod.MATLAB).astype(int)
            got = a.permute(1, 2, 0).numpy().astype(int)
            aligned.append(np.abs(got[2:-2, 2:-2] - ref[2:-2, 2:-2]).mean())
            shifted.append(np.abs(got[2:-2, 3:-1] - ref[2:-2, 2:-2]).mean())  # one LR pixel off
    assert seen == set(keys) - {"frame_005"}  # the sample without its LR is left out, the others all come
    assert np.mean(aligned) < 3.0 < np.mean(shifted)  # JPEG noise only; a one-pixel shift is far worse


def test_decoders_by_extension_never_unpickle():
    from shardmaker.imaging.codecs import ImageDataError, decode

    img = photos()[1]
    for ext, fmt in (("jpg", "JPEG"), ("x4.jpeg", "JPEG"), ("webp", "WEBP"), ("lr.png", "PNG")):
        b = io.BytesIO()
        Image.fromarray(img).save(b, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
        out = decode(b.getvalue(), ext)
        assert out.shape == img.shape and out.dtype == np.uint8
        if fmt != "JPEG":
            assert np.array_equal(out, img)
    import pickle

    for ext in ("pth", "pickle", "npy", "json"):
        with pytest.raises(ImageDataError, match="unknown member extension"):
            decode(pickle.dumps(img), ext)


def test_decode_pair_checks_our_digests_and_ignores_another_tools_json(photo_shards):
    sample = next(iter(_pipeline(str(photo_shards / "shard-000000.tar"))))
    decode = sr.decode_pair(scale=4)
    assert decode(sample).hr.shape[0] == 4 * decode(sample).lr.shape[0]
    bad = dict(sample, **{"lr_x4.png": sample["lr_x4.png"][:-1] + bytes([sample["lr_x4.png"][-1] ^ 1])})
    with pytest.raises(wdsr.SampleError, match="lr_x4.png does not match its xxh3_64"):
        decode(bad)
    foreign = dict(sample, json=b'{"caption": "a photo"}')  # another tool's json: nothing to check, still decodes
    assert decode(foreign).key == sample["__key__"]


def test_decode_pair_checks_the_kind_from_the_headers_before_decoding(photo_shards):
    from shardmaker import imaging
    from shardmaker.imaging import Codec

    sample = next(iter(_pipeline(str(photo_shards / "shard-000000.tar"))))
    grey = {
        name: imaging.encode(np.asarray(Image.fromarray(imaging.decode(sample[name], "png")).convert("L")), Codec.PNG)
        for name in ("hr.png", "lr_x4.png")
    }
    grey_sample = dict(sample, __key__="grey", **grey)
    decode = sr.decode_pair(scale=4)  # the first sample this process decodes fixes the kind
    assert decode(sample).hr.ndim == 3
    with pytest.raises(wdsr.SampleError, match=r"'grey': hr.png is 8-bit grey, but this pipeline is 8-bit RGB"):
        decode(grey_sample)
    told = sr.decode_pair(scale=4, channels=3, bit_depth=8)  # given: even the first sample is checked
    with pytest.raises(wdsr.SampleError, match="8-bit grey, but this pipeline is 8-bit RGB"):
        told(grey_sample)
    assert sr.decode_pair(scale=4, channels=1, verify=False)(grey_sample).hr.ndim == 2  # its json is the RGB one
    for bad in ({"channels": 4}, {"bit_depth": True}, {"max_pixels": 0}, {"scale": 2.0}):
        with pytest.raises(ValueError, match=f"decode_pair: {next(iter(bad))} must be"):
            sr.decode_pair(**{"scale": 4, **bad})
