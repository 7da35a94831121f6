"""Large TIFF sources read region by region (issue 26): real photos written by tifffile as tiled,
stripped, BigTIFF, planar, pyramidal and OME-TIFF files with deflate, LZW, zstd and JPEG segments;
every region equals the crop of the whole image as tifffile reads it; crafted files end in
ImageDataError."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tifffile

from shardmaker.builder.regions import BAND_PIXELS, Region, plan_regions, region_lr, valid_share
from shardmaker.errors import ImageDataError
from shardmaker.imaging.regions import TiffRegions, is_tiff
from shardmaker.imaging.resize import ResizeMethod, downscale
from tests.helpers import photos


def _mosaic(h: int = 700, w: int = 1100) -> np.ndarray:
    """An RGB image of real photos side by side (not noise: codecs behave as on real data)."""
    out = np.zeros((h, w, 3), np.uint8)
    x = 0
    for p in photos() * 3:
        if x >= w:
            break
        part = p[: min(h, p.shape[0]), : w - x]
        out[: part.shape[0], x : x + part.shape[1]] = part
        x += part.shape[1]
    return out


def _regions(img: np.ndarray, n: int = 10) -> list[tuple[int, int, int, int]]:
    rng = np.random.default_rng(1)
    h, w = img.shape[:2]
    out = [(0, 0, h, w), (h - 1, w - 1, 1, 1)]
    for _ in range(n):
        rh, rw = int(rng.integers(1, h // 2)), int(rng.integers(1, w // 2))
        out.append((int(rng.integers(0, h - rh + 1)), int(rng.integers(0, w - rw + 1)), rh, rw))
    return out


VARIANTS = {
    "tiled-zlib": dict(tile=(128, 128), compression="zlib"),
    "tiled-lzw-bigtiff": dict(tile=(256, 128), compression="lzw", bigtiff=True),
    "tiled-zstd": dict(tile=(64, 192), compression="zstd"),
    "tiled-jpeg": dict(tile=(128, 128), compression="jpeg", compressionargs={"level": 90}),
    "strips-uneven": dict(rowsperstrip=33, compression="zlib"),
    "strips-one": dict(rowsperstrip=10**6),
    "planar-separate": dict(tile=(128, 128), planarconfig="separate", compression="zlib"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rgb_regions_equal_the_crop(tmp_path: Path, variant: str) -> None:
    img = _mosaic()
    path = tmp_path / "src.tif"
    planes = VARIANTS[variant].get("planarconfig") == "separate"
    tifffile.imwrite(path, np.moveaxis(img, 2, 0) if planes else img, photometric="rgb", **VARIANTS[variant])
    whole = tifffile.imread(path)
    whole = np.moveaxis(whole, 0, 2) if planes else whole  # JPEG is lossy: compare with the same decoder's whole image
    assert is_tiff(path.read_bytes()[:4])
    with TiffRegions(str(path)) as src:
        assert (src.height, src.width, src.channels, src.bit_depth) == (700, 1100, 3, 8)
        for y, x, h, w in _regions(img):
            np.testing.assert_array_equal(src.read(y, x, h, w), whole[y : y + h, x : x + w])
    if variant != "tiled-jpeg":
        np.testing.assert_array_equal(whole, img)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_grey_and_16_bit(tmp_path: Path, dtype: type) -> None:
    grey = _mosaic()[..., 1].astype(dtype) * (257 if dtype is np.uint16 else 1)
    path = tmp_path / "grey.tif"
    tifffile.imwrite(path, grey, tile=(96, 96), compression="zlib", bigtiff=True)
    with TiffRegions(str(path)) as src:
        assert (src.channels, src.bit_depth) == (1, 8 * np.dtype(dtype).itemsize)
        for y, x, h, w in _regions(grey):
            got = src.read(y, x, h, w)
            assert got.dtype == dtype and got.ndim == 2
            np.testing.assert_array_equal(got, grey[y : y + h, x : x + w])


def test_pyramid_and_ome_read_level_0(tmp_path: Path) -> None:
    img = _mosaic()
    pyr = tmp_path / "pyramid.ome.tif"
    with tifffile.TiffWriter(pyr, bigtiff=True, ome=True) as tw:
        tw.write(img, tile=(128, 128), compression="zlib", subifds=2, photometric="rgb")
        tw.write(img[::2, ::2], tile=(128, 128), compression="zlib", subfiletype=1, photometric="rgb")
        tw.write(img[::4, ::4], tile=(128, 128), compression="zlib", subfiletype=1, photometric="rgb")
    with TiffRegions(str(pyr)) as src:
        assert (src.height, src.width) == img.shape[:2]
        np.testing.assert_array_equal(src.read(300, 500, 200, 400), img[300:500, 500:900])


def test_alpha(tmp_path: Path) -> None:
    img = _mosaic()
    rgba = np.concatenate([img, np.full(img.shape[:2] + (1,), 255, np.uint8)], axis=2)
    path = tmp_path / "rgba.tif"
    tifffile.imwrite(path, rgba, tile=(128, 128), photometric="rgb", extrasamples=["unassalpha"])
    with pytest.raises(ImageDataError, match="--drop-alpha"):
        TiffRegions(str(path))
    with TiffRegions(str(path), drop_alpha=True) as src:
        np.testing.assert_array_equal(src.read(10, 20, 300, 400), img[10:310, 20:420])


def test_region_outside_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.tif"
    tifffile.imwrite(path, _mosaic(), tile=(128, 128))
    with TiffRegions(str(path)) as src, pytest.raises(ValueError, match="not inside"):
        src.read(600, 0, 101, 10)


def _crafted(tmp_path: Path, edit) -> Path:
    img = _mosaic(300, 400)
    path = tmp_path / "c.tif"
    tifffile.imwrite(path, img, tile=(128, 128), compression="zlib")
    data = bytearray(path.read_bytes())
    with tifffile.TiffFile(path) as t:
        edit(data, t.pages[0])
    path.write_bytes(bytes(data))
    return path


def _huge_count(data: bytearray, page) -> None:
    """The first TileByteCounts entry set to 2 GB: the bound refuses it before any read."""
    tag = page.tags["TileByteCounts"]
    data[tag.valueoffset : tag.valueoffset + 4] = (0x7FFFFFFF).to_bytes(4, "little")


def test_crafted_files_are_image_data_errors(tmp_path: Path) -> None:
    cases = {
        "garbage": lambda d, p: d.__setitem__(slice(8, 4000), b"\x55" * 3992),
        "segment past the end": lambda d, p: d.__setitem__(slice(len(d) - 2000, len(d)), b""),
        "huge byte count": _huge_count,
        "corrupt segment": lambda d, p: d.__setitem__(slice(p.dataoffsets[0] + 2, p.dataoffsets[0] + 40), b"\x00" * 38),
    }
    for name, edit in cases.items():
        path = _crafted(tmp_path, edit)
        try:
            with TiffRegions(str(path)) as src:
                src.read(0, 0, src.height, src.width)
        except ImageDataError as e:
            assert name != "huge byte count" or "over what a 128x128 segment can take" in str(e)
        else:
            pytest.fail(f"{name}: no ImageDataError")
    assert not is_tiff(b"\x89PNG")


@pytest.mark.slow
def test_a_huge_tiff_is_read_in_bounded_memory(tmp_path: Path) -> None:
    """A 16384 x 16384 RGB tiled TIFF (768 MB of pixels, written tile by tile from real photos):
    a 1024 x 1024 region is read in a child process whose address space is capped far below the
    whole image, and equals the tiles it was written from."""
    path = tmp_path / "big.tif"
    side, t = 16384, 512
    base = _mosaic(t, t)
    tiles = (np.roll(base, i % 7, axis=1) for i in range((side // t) ** 2))
    tifffile.imwrite(path, tiles, shape=(side, side, 3), dtype=np.uint8, tile=(t, t), compression="zlib", bigtiff=True)
    code = textwrap.dedent(
        f"""
        import sys, numpy as np
        from shardmaker.imaging.regions import TiffRegions
        with TiffRegions({str(path)!r}) as src:
            got = src.read(5 * {t} + 100, 9 * {t} + 200, 1024, 1024)
        np.save(sys.argv[1], got)
        # VmHWM, not ru_maxrss: that keeps the forking parent's peak across exec
        print(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")))
        """
    )
    cap = 600 << 20  # well under the 768 MB image, over python + numpy + tifffile
    out = tmp_path / "region.npy"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({cap * 2}, {cap * 2})); exec({code!r})",
            out,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = int(proc.stdout.split()[-1]) * 1024
    assert peak < cap, f"peak RSS {peak >> 20} MB"
    got = np.load(out)
    y0, x0 = 5 * t + 100, 9 * t + 200
    for r in range(y0 // t, (y0 + 1023) // t + 1):
        for c in range(x0 // t, (x0 + 1023) // t + 1):
            tile = np.roll(base, (r * (side // t) + c) % 7, axis=1)
            ty, tx = r * t, c * t
            a, b = max(y0, ty), max(x0, tx)
            e, f = min(y0 + 1024, ty + t), min(x0 + 1024, tx + t)
            np.testing.assert_array_equal(got[a - y0 : e - y0, b - x0 : f - x0], tile[a - ty : e - ty, b - tx : f - tx])


# ---- region samples: where they are, their LR, their valid share ------------------------------


@pytest.mark.parametrize("side,scales", [(256, (2, 4)), (300, (2, 3, 4)), (100, (3,)), (10000, (4,))])
def test_regions_tile_the_image(side: int, scales: tuple[int, ...]) -> None:
    h, w = 701, 1103
    regions = plan_regions(h, w, side, scales)
    cover = np.zeros((h, w), np.int32)
    for r in regions:
        assert all(r.y % s == 0 and r.x % s == 0 for s in scales)
        assert all(r.h >= max(scales) and r.w >= max(scales) for s in scales)  # an LR at every scale
        cover[r.y : r.y + r.h, r.x : r.x + r.w] += 1
    assert np.all(cover == 1)
    assert len({r.key("slide") for r in regions}) == len(regions)
    assert Region(8192, 16384, 10, 10).key("a/slide") == "a/slide_y0008192_x0016384"


@pytest.mark.parametrize("method", [ResizeMethod.MATLAB, ResizeMethod.MATLAB_UINT8])
@pytest.mark.parametrize("scales", [(2, 4), (2, 3, 4)])
def test_region_lr_equals_the_whole_images_lr_crop(method: ResizeMethod, scales: tuple[int, ...]) -> None:
    """At every region border (small regions: many borders, the image's odd edges included)."""
    img = _mosaic(701, 1103)
    read = lambda y, x, h, w: img[y : y + h, x : x + w]  # noqa: E731
    for s in scales:
        whole = downscale(img[: 701 // s * s, : 1103 // s * s], s, method)
        for r in plan_regions(701, 1103, 120, scales):
            want = whole[r.y // s : (r.y + r.h) // s, r.x // s : (r.x + r.w) // s]
            for band in (BAND_PIXELS, 40 * 120):  # one band, and bands of a few LR rows
                got = region_lr(read, (701, 1103), r, s, method, band_pixels=band)
                np.testing.assert_array_equal(got, want, err_msg=f"x{s} {r} bands of {band} px")


def test_region_lr_16_bit_grey_from_a_tiff(tmp_path: Path) -> None:
    grey = _mosaic(517, 643)[..., 0].astype(np.uint16) * 257
    path = tmp_path / "g.tif"
    tifffile.imwrite(path, grey, tile=(64, 64), compression="zlib")
    whole = downscale(grey[:516, :640], 4)
    with TiffRegions(str(path)) as src:
        for r in plan_regions(517, 643, 200, (4,)):
            got = region_lr(src.read, (517, 643), r, 4)
            np.testing.assert_array_equal(got, whole[r.y // 4 : (r.y + r.h) // 4, r.x // 4 : (r.x + r.w) // 4])


def test_valid_share() -> None:
    photo = _mosaic(512, 512)
    assert valid_share(photo) > 0.9
    glass = np.full((512, 1024, 3), 235, np.uint8)
    glass += np.random.default_rng(0).integers(0, 4, glass.shape, dtype=np.uint8)  # sensor noise: still flat
    assert valid_share(glass) == 0.0
    glass[:, :256] = photo[:, :256]
    assert valid_share(glass) == pytest.approx(0.25, abs=0.02)
    assert valid_share(glass[..., 0].astype(np.uint16) * 257) == pytest.approx(0.25, abs=0.05)


def test_without_imagecodecs_a_compressed_tiff_is_one_clear_error(tmp_path: Path) -> None:
    """imagecodecs is the `tiff` extra: a child process where it cannot be imported reads a deflate
    TIFF (zlib alone) and names the extra for an LZW one."""
    for comp in ("zlib", "lzw"):
        tifffile.imwrite(tmp_path / f"{comp}.tif", _mosaic(64, 96), tile=(32, 32), compression=comp)
    code = textwrap.dedent(
        """
        import sys
        sys.modules["imagecodecs"] = None  # as if the extra were not installed
        from shardmaker.errors import ImageDataError
        from shardmaker.imaging.regions import TiffRegions
        for name in sys.argv[1:]:
            try:
                with TiffRegions(name) as src:
                    print(src.read(0, 0, 64, 96).shape)
            except ImageDataError as e:
                print(e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "zlib.tif"), str(tmp_path / "lzw.tif")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines == ["(64, 96, 3)", "TIFF segment 0: LZW segments need imagecodecs (pip install 'wdsr[tiff]')"], lines
