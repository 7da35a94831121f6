"""Shared fixtures: real photos (scikit-image's bundled set, ../shared/refdata), tiny trees."""
from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def _refdata() -> Path | None:
    for cand in (os.environ.get("WDSR_REFDATA"), ROOT / "shared" / "refdata", ROOT.parent / "shared" / "refdata"):
        if cand and (Path(cand) / "set5" / "HR").is_dir():
            return Path(cand)
    return None


REFDATA = _refdata()
needs_refdata = pytest.mark.skipif(REFDATA is None, reason="../shared/refdata (Set5, MATLAB references) not found")


@pytest.fixture(scope="session")
def refdata() -> Path:
    if REFDATA is None:
        pytest.skip("../shared/refdata not found")
    return REFDATA


@functools.lru_cache(maxsize=1)
def _photos() -> tuple[np.ndarray, ...]:
    from skimage import data

    return tuple(np.ascontiguousarray(p) for p in (data.astronaut(), data.chelsea(), data.coffee(), data.rocket()))


def photos() -> list[np.ndarray]:
    """Real RGB photos that ship inside scikit-image's wheel (no download); fresh copies."""
    return [p.copy() for p in _photos()]


def load_rgb(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def save(path: Path, arr: np.ndarray, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, **kw)
    return path


@pytest.fixture()
def hr_tree(tmp_path: Path) -> Path:
    """Six real-photo HR crops of varied sizes (some not multiples of 3 or 4) in two folders."""
    root = tmp_path / "hr"
    sizes = [(96, 128), (101, 130), (120, 90), (64, 64), (130, 97), (77, 88)]
    for i, (h, w) in enumerate(sizes):
        img = photos()[i % 4]
        y, x = 7 * i, 11 * i
        sub = "a" if i < 3 else "b/c"
        save(root / sub / f"img{i}.png", np.ascontiguousarray(img[y : y + h, x : x + w]))
    return root


def build_shards(src: Path, out: Path, *flags: str) -> Path:
    """Build real shards with the shardmaker CLI (in-process)."""
    from shardmaker.cli import main

    rc = main(["-q", "build", str(src), str(out), "--workers", "1", *flags])
    assert rc == 0, f"shardmaker build failed for {src}"
    return out


@pytest.fixture(scope="session")
def photo_src(tmp_path_factory) -> Path:
    """Ten real-photo HR images of varied sizes (crops and flips of scikit-image's photos)."""
    root = tmp_path_factory.mktemp("photo_src")
    pics = photos()
    for i in range(10):
        img = pics[i % 4]
        h, w = 200 + 13 * i, 240 + 7 * i
        crop = img[(5 * i) % 40 :][:h, (3 * i) % 50 :][:, :w]
        if i >= 4:
            crop = crop[::-1]
        save(root / f"p{i:02d}.png", np.ascontiguousarray(crop))
    return root


@pytest.fixture(scope="session")
def photo_shards(tmp_path_factory, photo_src) -> Path:
    """10 samples in 4 shards (3+3+3+1), scales 2 and 4, PNG, generated with matlab bicubic."""
    return build_shards(photo_src, tmp_path_factory.mktemp("photo_shards") / "ds", "--scale", "2,4", "--max-samples", "3")


@pytest.fixture(scope="session")
def mcmaster_shards(tmp_path_factory) -> Path:
    if REFDATA is None:
        pytest.skip("../shared/refdata not found")
    return build_shards(REFDATA / "mcmaster", tmp_path_factory.mktemp("mcm") / "ds", "--scale", "2,4",
                        "--max-samples", "4", "--lr-method", "matlab")
