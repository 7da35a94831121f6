"""``crop_lr`` (the LR of part of an image, what ``SRDataset(lr="bicubic")`` makes per patch) against the
crop of ``downscale`` of the whole mod-cropped image, bit for bit: random boxes touching every border,
x2/x3/x4, both MATLAB methods, grey/RGB/RGBA, 8 and 16 bits; the chunked and threaded paths too."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardmaker.imaging import croplr, resize
from shardmaker.imaging.croplr import crop_lr, downscale_part
from shardmaker.imaging.resize import ResizeMethod, downscale


def _image(rng: np.random.Generator, h: int, w: int, channels: int, dtype: type) -> np.ndarray:
    """Noise with flat black and white blocks: the kernel's overshoot is clipped at both ends."""
    peak = np.iinfo(dtype).max
    img = rng.integers(0, peak + 1, (h, w, channels) if channels else (h, w), dtype=dtype)
    img[: h // 3, : w // 3] = peak
    img[h // 2 :, w // 2 : w // 2 + max(1, w // 5)] = 0
    return img


def _want(img: np.ndarray, box: tuple[int, int, int, int], s: int, method: ResizeMethod) -> np.ndarray:
    hc, wc = img.shape[0] // s * s, img.shape[1] // s * s
    y, x, h, w = box
    y1, x1 = min(y + h, hc), min(x + w, wc)
    return downscale(img[:hc, :wc], s, method)[y // s : y1 // s, x // s : x1 // s]


def _read(img: np.ndarray):
    return lambda y, x, h, w: img[y : y + h, x : x + w]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_crops_equal_the_whole_images_lr(data: st.DataObject) -> None:
    s = data.draw(st.sampled_from([2, 3, 4]), "scale")
    method = data.draw(st.sampled_from(list(ResizeMethod)), "method")
    dtype = np.uint8 if method is ResizeMethod.MATLAB_UINT8 else data.draw(st.sampled_from([np.uint8, np.uint16]))
    channels = data.draw(st.sampled_from([0, 1, 3, 4]), "channels")
    h, w = data.draw(st.integers(s, 90), "h"), data.draw(st.integers(s, 90), "w")  # mod-crop: sides s need not divide
    img = _image(np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), "seed")), h, w, channels, dtype)
    lh, lw = h // s, w // s
    y = s * data.draw(st.sampled_from([0, lh - 1, data.draw(st.integers(0, lh - 1))]))  # the top, bottom or anywhere
    x = s * data.draw(st.sampled_from([0, lw - 1, data.draw(st.integers(0, lw - 1))]))
    bh = data.draw(st.sampled_from([h - y, s * data.draw(st.integers(1, lh - y // s)), h + 7]))  # to the bottom (and past)
    bw = data.draw(st.sampled_from([w - x, s * data.draw(st.integers(1, lw - x // s)), w + 7]))
    band = data.draw(st.sampled_from([croplr.BAND_PIXELS, 4 * s * s * bw]), "band_pixels")  # one band, or bands of 4 LR rows
    got = crop_lr(_read(img), (h, w), (y, x, bh, bw), s, method, band)
    want = _want(img, (y, x, bh, bw), s, method)
    assert got.dtype == img.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("method", list(ResizeMethod))
@pytest.mark.parametrize("s", [2, 3, 4])
def test_patches_at_every_border_and_corner(method: ResizeMethod, s: int) -> None:
    """LR patches of 12 pixels at the corners, along each edge and inside, as ``BicubicPair.cut`` cuts them."""
    img = _image(np.random.default_rng(s), 301, 437, 3, np.uint8)
    lh, lw, p = 301 // s, 437 // s, 12
    for ly in (0, 1, 2, lh // 2, lh - p - 1, lh - p):
        for lx in (0, 1, 3, lw // 2, lw - p - 2, lw - p):
            box = (s * ly, s * lx, s * p, s * p)
            np.testing.assert_array_equal(crop_lr(_read(img), (301, 437), box, s, method), _want(img, box, s, method), f"{box}")
    whole = (0, 0, 301, 437)
    np.testing.assert_array_equal(crop_lr(_read(img), (301, 437), whole, s, method), _want(img, whole, s, method))


def test_chunked_rows_and_16_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work arrays capped small: ``downscale_part`` goes a few LR rows at a time, mirrored rows included."""
    img = _image(np.random.default_rng(7), 120, 96, 3, np.uint16)
    want = downscale(img, 4)
    monkeypatch.setattr(croplr, "_SCRATCH_BYTES", 1 << 14)
    for rows, cols in [((0, 30), (0, 24)), ((1, 28), (2, 20)), ((29, 1), (23, 1))]:
        got = downscale_part(img, 4, rows, cols)
        np.testing.assert_array_equal(got, want[rows[0] : sum(rows), cols[0] : sum(cols)])


def test_results_own_their_memory_across_calls_and_threads() -> None:
    """Work arrays are reused per thread: what a call returns is its own, in any thread."""
    img = _image(np.random.default_rng(3), 200, 240, 3, np.uint8)
    want = downscale(img, 4)
    boxes = [(4 * y, 4 * x, 48, 48) for y in range(0, 38, 5) for x in range(0, 48, 6)]
    first = crop_lr(_read(img), (200, 240), boxes[0], 4)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda b: crop_lr(_read(img), (200, 240), b, 4), boxes * 3))
    for b, g in zip(boxes * 3, got, strict=True):
        np.testing.assert_array_equal(g, want[b[0] // 4 : b[0] // 4 + 12, b[1] // 4 : b[1] // 4 + 12])
    np.testing.assert_array_equal(first, want[:12, :12])


def test_bad_parts() -> None:
    img = np.zeros((16, 16, 3), np.uint8)
    with pytest.raises(ValueError, match="not in the 4x4 LR"):
        downscale_part(img, 4, (3, 2), (0, 1))
    with pytest.raises(ValueError, match="multiple of the scale"):
        downscale_part(img[:15], 4, (0, 1), (0, 1))
    with pytest.raises(ValueError, match="8-bit"):
        downscale_part(img.astype(np.uint16), 4, (0, 1), (0, 1), ResizeMethod.MATLAB_UINT8)


@pytest.mark.parametrize("s", [2, 3, 4, 5])
def test_tap_pass_sums_in_matlabs_order(s: int) -> None:
    """Before any rounding: the strided tap pass gives ``_resize_axis0``'s float64 sums to the last bit
    (random floats: any other order or weight shows; rounded to 8 bits it almost never would)."""
    rng = np.random.default_rng(s)
    length = 40 * s
    a = rng.standard_normal((length, 7))
    want = resize._resize_axis0(a, *resize.contributions(length, length // s, 1 / s), to_uint8=False)
    for o0, n in [(0, 40), (0, 3), (1, 5), (18, 4), (36, 4), (39, 1)]:
        t = croplr._taps(length, s, o0, n)
        x = np.ascontiguousarray(a[t.lo : t.hi].reshape(-1, s, 7).swapaxes(0, 1))
        got = np.empty((n, 7))
        croplr._tap_pass(x, t, got)
        assert t.first < t.last or n < 3
        np.testing.assert_array_equal(got, want[o0 : o0 + n], f"outputs {o0}..{o0 + n}")
