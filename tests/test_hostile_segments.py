"""Hostile TIFF segments (issue 38, High 1): a tile or strip compressed with an image codec declares
its own size in that codec's header, and the decoder allocates what it says. A 5 KB tiled TIFF whose
JPEG tile says 30000x30000 must be refused from the header, naming the file and the segment, with
memory that stays small: measured in a child under ``RLIMIT_AS``, by region read and by a real build."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import imagecodecs
import numpy as np
import pytest
import tifffile

from shardmaker.format.frames import FrameCodec, declared_frame
from tests.helpers import photos

CAP = 1536 << 20  # address space of the child: the unchecked decodes ask for 1-3 GB
PEAK = 400 << 20  # what a refused 5 KB file may cost, imports included


def _tiff(path: Path, compression: str) -> None:
    tifffile.imwrite(path, photos()[0][:128, :192], tile=(64, 64), compression=compression, photometric="rgb")


def _patch_jpeg(seg: bytearray) -> None:
    i = seg.index(b"\xff\xc0", 2)  # baseline SOF0 of the first tile (its tables live in JPEGTables)
    assert struct.unpack(">HH", seg[i + 5 : i + 9]) == (64, 64)
    seg[i + 5 : i + 9] = struct.pack(">HH", 30000, 30000)


def _patch_png(seg: bytearray) -> None:
    assert struct.unpack(">II", seg[16:24]) == (64, 64)
    seg[16:24] = struct.pack(">II", 18000, 18000)
    seg[29:33] = struct.pack(">I", zlib.crc32(bytes(seg[12:29])))  # a valid IHDR: its CRC matches


def _patch_webp(seg: bytearray) -> None:
    assert bytes(seg[12:16]) == b"VP8L"
    bits = struct.unpack("<I", seg[21:25])[0]
    assert (bits & 0x3FFF, (bits >> 14) & 0x3FFF) == (63, 63)
    seg[21:25] = struct.pack("<I", (bits & ~0xFFFFFFF) | 16383 | (16383 << 14))


def _patch_j2k(seg: bytearray) -> None:
    i = seg.index(b"\xff\x4f\xff\x51")
    assert struct.unpack(">II", seg[i + 8 : i + 16]) == (64, 64)
    seg[i + 8 : i + 16] = struct.pack(">II", 30000, 30000)


PATCHES = {"jpeg": _patch_jpeg, "png": _patch_png, "webp": _patch_webp, "jpeg2000": _patch_j2k}


def _hostile(tmp_path: Path, compression: str) -> Path:
    """A tiny tiled TIFF of a real photo whose first tile's own header declares a huge image."""
    path = tmp_path / "hr" / f"bomb_{compression}.tif"
    path.parent.mkdir()
    _tiff(path, compression)
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        offset, count = int(page.dataoffsets[0]), int(page.databytecounts[0])
    data = bytearray(path.read_bytes())
    seg = data[offset : offset + count]
    PATCHES[compression](seg)
    data[offset : offset + count] = seg
    path.write_bytes(bytes(data))
    assert path.stat().st_size < 64 << 10
    return path


# the child's own peak (ru_maxrss would count the pages of the parent it was forked from, torch and all)
_HWM = "def HWM():\n    return next(int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmHWM:'))\n"


def _capped(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    prelude = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({CAP}, {CAP}))\n{_HWM}"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code), *args], capture_output=True, text=True, timeout=300
    )


def _peak(proc: subprocess.CompletedProcess[str]) -> int:
    return int(proc.stdout.split()[-1]) * 1024


@pytest.mark.parametrize("compression", sorted(PATCHES))
def test_a_region_read_refuses_the_declared_size_before_decoding(tmp_path: Path, compression: str) -> None:
    path = _hostile(tmp_path, compression)
    proc = _capped(
        """
        import sys
        from shardmaker.errors import ImageDataError
        from shardmaker.imaging.regions import TiffRegions
        with TiffRegions(sys.argv[1]) as tif:
            try:
                tif.read(0, 0, 32, 32)
                print("DECODED")
            except ImageDataError as e:
                print("REFUSED", e)
        print(HWM())
        """,
        str(path),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "REFUSED" in out and "refused before decoding" in out, out
    assert f"{path}: TIFF segment 0:" in out and "declares" in out, out
    assert _peak(proc) < PEAK, f"peak RSS {_peak(proc) >> 20} MB"


@pytest.mark.parametrize("compression", ["jpeg", "png"])
def test_a_build_stops_with_the_file_and_segment_in_bounded_memory(tmp_path: Path, compression: str) -> None:
    path = _hostile(tmp_path, compression)
    proc = _capped(
        """
        import sys
        from shardmaker.cli import main
        rc = main(["build", sys.argv[1], sys.argv[2], "--scale", "2"])
        print("RC", rc)
        print(HWM())
        """,
        str(path.parent),
        str(tmp_path / "out"),
    )
    assert "RC 2" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    err = proc.stderr
    assert path.name in err and "TIFF segment 0" in err and "refused before decoding" in err, err
    assert _peak(proc) < PEAK, f"peak RSS {_peak(proc) >> 20} MB"
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_honest_codecs_declare_their_box() -> None:
    """Every codec's header reader on real encoded tiles: the declared size is the encoded one."""
    tile = photos()[1][:48, :80]
    encoded = {
        FrameCodec.JPEG: imagecodecs.jpeg8_encode(tile),
        FrameCodec.PNG: imagecodecs.png_encode(tile),
        FrameCodec.WEBP: imagecodecs.webp_encode(tile, lossless=True),
        FrameCodec.JPEG2000: imagecodecs.jpeg2k_encode(tile),
        FrameCodec.JPEGXL: imagecodecs.jpegxl_encode(tile),
    }
    encoded_lossy = imagecodecs.webp_encode(tile, level=80)
    for codec, data in [*encoded.items(), (FrameCodec.WEBP, encoded_lossy)]:
        frame = declared_frame(data, codec)
        assert (frame.width, frame.height) == (80, 48), codec
    for side in (8, 2000, 70001):  # JPEG XL's small and large size fields
        img = np.zeros((side if side < 70001 else 1, 8 if side < 70001 else side, 3), np.uint8)
        frame = declared_frame(imagecodecs.jpegxl_encode(img), FrameCodec.JPEGXL)
        assert (frame.width, frame.height) == (img.shape[1], img.shape[0])
