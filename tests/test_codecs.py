"""Source loading and member codecs on real photos: lossless round trips, clear refusals."""

from __future__ import annotations

import functools
import io
import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from shardmaker.imaging import codecs, png
from shardmaker.imaging.codecs import Codec, ImageDataError
from tests.helpers import photos


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
    grey_alpha = np.dstack([rgba[:, :, 1], rgba[::-1, :, 2]])
    for img in (rgba, grey_alpha):
        data = _bytes(img, "PNG")
        with pytest.raises(ImageDataError, match="alpha"):
            codecs.load_source(data)
        assert np.array_equal(
            codecs.load_source(data, drop_alpha=True), img[:, :, :-1].squeeze(2) if img.shape[2] == 2 else img[:, :, :3]
        )


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
    assert codecs.decode(good, "hr.img").shape == (32, 32, 3)  # a side that mixes formats: read as what its bytes are
    with pytest.raises(ImageDataError, match="not a PNG, JPEG, WebP or QOI file"):
        codecs.decode(b"\x80\x04pickled" + good, "hr.img")


@functools.cache
def _png_variants() -> dict[str, bytes]:
    """PNGs as our writer, Pillow and OpenCV (libpng) write them, in every layout we read."""
    import cv2

    rgb = photos()[0][:203, :157]  # odd sizes: rows that are not a whole number of stored blocks
    grey = rgb[:, :, 1].copy()
    rgb16 = rgb.astype(np.uint16) * 257 + np.arange(157, dtype=np.uint16)[:, None]
    out = {
        "ours rgb8": codecs.encode(rgb, Codec.PNG),
        "ours grey8": codecs.encode(grey, Codec.PNG),
        "ours rgb16": codecs.encode(rgb16, Codec.PNG),
        "ours grey16 level 9": codecs.encode(rgb16[:, :, 0].copy(), Codec.PNG, 9),
        "opencv rgb8": cv2.imencode(".png", rgb)[1].tobytes(),
        "opencv rgba16": cv2.imencode(".png", np.dstack([rgb16, rgb16[:, :, :1]]))[1].tobytes(),
        "pillow palette": _bytes(np.asarray(Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE)), "PNG"),
        "pillow grey+alpha": _bytes(np.dstack([grey, grey[::-1]]), "PNG"),
    }
    big = np.tile(rgb, (6, 6, 1))  # Pillow writes 64 KiB IDAT chunks: several of them here
    out["pillow rgb8, many IDAT"] = _bytes(big, "PNG", compress_level=9)
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "a text chunk before the image data")
    out["pillow with text, gamma"] = _bytes(rgb, "PNG", pnginfo=info, gamma=0.45455)
    return out


@pytest.mark.parametrize("name", list(_png_variants()))
def test_png_inflated_by_libdeflate_decodes_to_the_same_pixels(name):
    """The rebuilt PNG (image data inflated by libdeflate, stored uncompressed) is a valid PNG
    that libspng and Pillow read to exactly the original's pixels; its CRCs are checked here."""
    import pyspng

    data = _png_variants()[name]
    fast = png.inflated(data)
    assert fast is not None  # every one of these takes the fast path
    if name == "pillow rgb8, many IDAT":
        assert data.count(b"IDAT") > 3 and fast.count(b"IDAT") == 1
    layout = "RGBA" if name == "pillow grey+alpha" else None  # libspng's only output for 8-bit grey+alpha
    reference = pyspng.load(data, layout)
    assert np.array_equal(pyspng.load(fast, layout), reference)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(fast))), np.asarray(Image.open(io.BytesIO(data))))
    w, h, depth, ctype = struct.unpack(">IIBB", data[16:26])
    assert len(fast) > h * w * {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype] * depth // 8  # the rows stored, not compressed
    assert np.array_equal(png.decode(memoryview(data)), png.decode(data))
    pos = 8
    while pos < len(fast):  # every chunk's CRC, checked here (libspng and Pillow skip some)
        length, tag = struct.unpack(">I4s", fast[pos : pos + 8])
        assert struct.unpack(">I", fast[pos + 8 + length : pos + 12 + length])[0] == zlib.crc32(fast[pos + 4 : pos + 8 + length])
        pos += 12 + length
    assert pos == len(fast) and tag == b"IEND"


def test_png_outside_the_fast_path_still_decodes_or_fails_clearly():
    data = codecs.encode(photos()[1][:64, :64], Codec.PNG)
    i = data.index(b"IDAT") + 40
    corrupt = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :]
    assert png.inflated(corrupt) is None  # libdeflate refuses the stream or its Adler-32
    with pytest.raises(ImageDataError, match="corrupt or truncated PNG"):
        codecs.decode(corrupt, "png")
    assert png.inflated(data[: len(data) - 30]) is None  # truncated inside IDAT
    interlaced = data[:28] + b"\x01" + data[29:]
    assert png.inflated(interlaced) is None
    after = data[:-12] + _chunk(b"tEXt", b"Comment\0after the image data") + data[-12:]  # IDAT, tEXt, IEND
    assert np.array_equal(codecs.decode(after, "png"), codecs.decode(data, "png"))
    assert png.inflated(after) is not None
    i = data.index(b"IDAT") - 4
    (n,) = struct.unpack(">I", data[i : i + 4])
    idat = data[i + 8 : i + 8 + n]
    broken = data[:i] + _chunk(b"IDAT", idat[:100]) + _chunk(b"tEXt", b"a\0b") + _chunk(b"IDAT", idat[100:]) + data[-12:]
    assert png.inflated(broken) is None  # IDAT chunks not in one run
    w, h = struct.unpack(">II", data[16:24])
    taller = data[:8] + _chunk(b"IHDR", struct.pack(">II", w, h + 1) + data[24:29]) + data[33:]
    assert png.inflated(taller) is None  # the stream ends a row early
    with pytest.raises(ImageDataError, match="corrupt or truncated PNG"):
        codecs.decode(taller, "png")


def _chunk(tag: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_png_bytes_decode_as_libspng_does_or_fail_clearly(data):
    """Flipped, cut or inserted bytes anywhere in a PNG: wdsr's decode is libspng's pixels where
    libspng reads the file, else an ImageDataError; never another exception, never other pixels.
    (wdsr may read a few files libspng refuses, e.g. a wrong IDAT CRC: every CRC is written anew.)"""
    import pyspng

    buf = bytearray(_png_variants()[data.draw(st.sampled_from(["ours rgb8", "ours grey16 level 9", "pillow palette"]))])
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(buf) - 1))
        how = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if how == "flip":
            buf[at] ^= data.draw(st.integers(1, 255))
        elif how == "cut":
            del buf[at : at + data.draw(st.integers(1, 64))]
        else:
            buf[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    blob = bytes(buf)
    try:
        reference = pyspng.load(blob)
    except Exception:
        reference = None
    try:
        ours = png.decode(blob)
    except ImageDataError:
        assert reference is None or png.inflated(blob) is None
        return
    if reference is not None:
        assert np.array_equal(
            ours, reference[..., : ours.shape[2]] if ours.ndim == 3 else reference[..., 0] if reference.ndim == 3 else reference
        )
