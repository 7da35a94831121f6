"""MATLAB imresize bicubic: bit-exact against MATLAB outputs in tests/data/refdata (see SOURCES.md there)."""

from __future__ import annotations

import numpy as np
import pytest

from shardmaker.imaging.resize import ResizeMethod, contributions, downscale, upscale
from tests.helpers import load_rgb, needs_refdata, photos


def _modcrop(img: np.ndarray, s: int) -> np.ndarray:
    return img[: img.shape[0] // s * s, : img.shape[1] // s * s]


@needs_refdata
@pytest.mark.parametrize("s", [2, 3, 4])
def test_double_path_matches_matlab_baboon(refdata, s):
    hr = load_rgb(refdata / "matlab_bicubic/baboon.png")
    ref = load_rgb(refdata / f"matlab_bicubic/baboon_down_x{s}_matlab.png")
    out = downscale(_modcrop(hr, s), s, ResizeMethod.MATLAB)
    assert out.shape == ref.shape
    assert np.array_equal(out, ref), f"{int((out != ref).sum())} pixels differ"


@needs_refdata
@pytest.mark.parametrize("s", [2, 3])
def test_upscale_matches_matlab_baboon(refdata, s):
    hr = load_rgb(refdata / "matlab_bicubic/baboon.png")
    ref = load_rgb(refdata / f"matlab_bicubic/baboon_up_x{s}_matlab.png")
    assert np.array_equal(upscale(hr, s), ref)


@needs_refdata
@pytest.mark.parametrize("name", ["baby", "bird", "butterfly", "head", "woman"])
def test_uint8_path_matches_set5(refdata, name):
    hr = load_rgb(refdata / f"set5/HR/{name}.png")
    for s in (2, 3, 4):
        ref = load_rgb(refdata / f"set5/LR_bicubic/X{s}/{name}x{s}.png")
        out = downscale(_modcrop(hr, s), s, ResizeMethod.MATLAB_UINT8)
        assert np.array_equal(out, ref), f"{name} x{s}: {int((out != ref).sum())} pixels differ"
        # and the two methods really differ: the test could fail if we mixed them up
        assert not np.array_equal(downscale(_modcrop(hr, s), s, ResizeMethod.MATLAB), ref)


def test_weights_are_normalised_and_indices_mirrored():
    w, idx = contributions(10, 3, 1 / 3)
    assert np.allclose(w.sum(axis=1), 1.0)
    assert idx.min() >= 0 and idx.max() <= 9
    # first output pulls mirrored samples: index 0 appears more than once for the left border
    assert (idx[0] == 0).sum() >= 2 or (idx[0] == 1).sum() >= 2


def test_grey_and_16bit_agree_with_rgb_and_8bit():
    img = photos()[0][:120, :160]
    grey = img[:, :, 1].copy()
    assert np.array_equal(downscale(grey, 4), downscale(img, 4)[:, :, 1])
    wide = img.astype(np.uint16) * 257  # same picture in 16 bits
    lr16 = downscale(wide, 4)
    assert lr16.dtype == np.uint16
    assert np.abs(lr16.astype(int) / 257 - downscale(img, 4)).max() <= 0.51


def test_refuses_non_multiple_and_uint8_method_on_16bit():
    img = photos()[1][:50, :50]
    with pytest.raises(ValueError, match="multiple of the scale"):
        downscale(img, 4)
    with pytest.raises(ValueError, match="8-bit"):
        downscale(img.astype(np.uint16)[:48, :48], 4, ResizeMethod.MATLAB_UINT8)
