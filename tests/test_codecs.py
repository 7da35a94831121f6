"""Source loading and member codecs on real photos: lossless round trips, clear refusals."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from shardmaker import codecs
from shardmaker.codecs import Codec, ImageDataError
from tests.conftest import photos


def _bytes(arr: np.ndarray, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format=fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("codec", list(Codec))
def test_rgb8_round_trip(codec):
    img = photos()[0][:97, :131]
    back = codecs.decode(codecs.encode(img, codec), codec.value)
    assert back.dtype == np.uint8 and np.array_equal(back, img)


@pytest.mark.parametrize("channels", [1, 3])
def test_png16_round_trip_keeps_16_bits(channels):
    base = photos()[2][:64, :80].astype(np.uint16) * 257 + np.arange(80, dtype=np.uint16)[:, None]
    img = base[:, :, 0].copy() if channels == 1 else base
    data = codecs.encode(img, Codec.PNG)
    back = codecs.decode(data, "png")
    assert back.dtype == np.uint16 and np.array_equal(back, img)
    assert np.array_equal(codecs.load_source(data), img)


def test_grey8_png_and_png_level_changes_size_not_pixels():
    grey = photos()[1][:, :, 0].copy()
    fast, small = codecs.encode(grey, Codec.PNG, 1), codecs.encode(grey, Codec.PNG, 9)
    assert fast != small  # level 1 is run-length deflate, 9 the default strategy: other bytes
    assert np.array_equal(codecs.decode(fast, "png"), codecs.decode(small, "png"))


def test_qoi_refuses_grey_and_16bit():
    img = photos()[0][:16, :16]
    with pytest.raises(ImageDataError, match="8-bit RGB"):
        codecs.encode(img[:, :, 0].copy(), Codec.QOI)
    with pytest.raises(ImageDataError, match="8-bit RGB"):
        codecs.encode(img.astype(np.uint16), Codec.QOI)


@pytest.mark.parametrize("fmt,kw", [("TIFF", {}), ("BMP", {}), ("WEBP", {"lossless": True}), ("PNG", {})])
def test_sources_in_lossless_formats_load_exactly(fmt, kw):
    img = photos()[3][:60, :70]
    assert np.array_equal(codecs.load_source(_bytes(img, fmt, **kw)), img)


def test_jpeg_and_palette_sources_load_as_rgb():
    img = photos()[0][:40, :40]
    assert codecs.load_source(_bytes(img, "JPEG", quality=95)).shape == (40, 40, 3)
    pal = Image.fromarray(img).convert("P", palette=Image.Palette.ADAPTIVE)
    buf = io.BytesIO()
    pal.save(buf, "PNG")
    assert codecs.load_source(buf.getvalue()).shape == (40, 40, 3)


def test_alpha_refused_unless_dropped():
    rgba = np.dstack([photos()[0][:20, :20], np.full((20, 20), 200, np.uint8)])
    data = _bytes(rgba, "PNG")
    with pytest.raises(ImageDataError, match="alpha"):
        codecs.load_source(data)
    assert np.array_equal(codecs.load_source(data, drop_alpha=True), rgba[:, :, :3])


def test_pixel_limit_checked_before_decoding():
    data = _bytes(photos()[0][:100, :100], "PNG")
    with pytest.raises(ImageDataError, match="10000 pixels is over the limit of 9999"):
        codecs.load_source(data, max_pixels=9999)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "TIFF"])
def test_truncated_and_empty_files_are_clear_errors(fmt):
    data = _bytes(photos()[1][:128, :128], fmt)
    with pytest.raises(ImageDataError, match="truncated|corrupt|not a readable"):
        codecs.load_source(data[: len(data) // 2])
    with pytest.raises(ImageDataError, match="empty"):
        codecs.load_source(b"")


def test_corrupt_members_are_clear_errors():
    good = codecs.encode(photos()[0][:32, :32], Codec.QOI)
    with pytest.raises(ImageDataError, match="QOI"):
        codecs.decode(good[:20], "qoi")
    with pytest.raises(ImageDataError, match="unknown member extension"):
        codecs.decode(good, "pickle")
