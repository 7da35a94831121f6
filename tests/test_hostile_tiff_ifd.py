"""Hostile TIFF tags (issue 38, M3): a byte-flipped IFD of a small real TIFF fails wherever tifffile parses
lazily (an unknown photometric, a multi-valued tile tag, fewer byte counts than offsets) in any exception
type. Every such failure is that source's ``InputError`` naming the file, so ``--on-error skip`` skips it
and a plain build stops with exit 2, one line."""

from __future__ import annotations

import struct
from pathlib import Path

import fsspec
import numpy as np
import pytest
import tifffile

from shardmaker.builder.images import SampleConfig, SourceImage
from shardmaker.builder.sources import header_size
from shardmaker.errors import InputError
from shardmaker.format import load as load_manifest
from tests.helpers import photos, sm

LAYOUTS = {  # tifffile writes each; deflate is zlib (no imagecodecs needed)
    "tiled": {"tile": (32, 32)},
    "strips": {"rowsperstrip": 16},
    "deflate": {"tile": (32, 32), "compression": "zlib"},
    "planar": {"rowsperstrip": 32, "planarconfig": "separate"},
}
MUTANTS = 60  # per layout: 240 files, ~1 CPU-second; before the fix ~1 in 6 escaped as a raw exception


def _tiff(path: Path, **kw: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tifffile.imwrite(path, photos()[0][:96, :128], photometric="rgb", **kw)
    return path


def _ifd_bytes(path: Path) -> np.ndarray:
    """Offsets of the first IFD's entries and of its tags' out-of-line values."""
    with tifffile.TiffFile(path) as tif:
        page = tif.pages[0]
        spans = [(page.offset, page.offset + 2 + 12 * len(page.tags) + 4)]
        spans += [(t.valueoffset, t.valueoffset + t.valuebytecount) for t in page.tags if t.valuebytecount > 4]
    return np.concatenate([np.arange(a, b) for a, b in spans])


def _read(path: Path) -> None:
    """What a build does with a source: its header size (the scan), then its pixels (the sample)."""
    header_size(fsspec.filesystem("file"), str(path), path.suffix)
    with SourceImage(str(path), SampleConfig(scales=(2,))) as img:
        img.whole()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_every_byte_flipped_ifd_is_the_files_input_error(tmp_path: Path, layout: str) -> None:
    base = _tiff(tmp_path / "base.tif", **LAYOUTS[layout])
    data, where = base.read_bytes(), _ifd_bytes(base)
    rng = np.random.default_rng([38, 3, sorted(LAYOUTS).index(layout)])
    refused = 0
    for k in range(MUTANTS):
        mutant = bytearray(data)
        for i in rng.choice(where, size=int(rng.integers(1, 4))):
            mutant[i] ^= int(rng.integers(1, 256))
        path = tmp_path / f"m{k}.tif"
        path.write_bytes(bytes(mutant))
        try:
            _read(path)
        except InputError as exc:
            assert path.name in str(exc) and "\n" not in str(exc), exc
            refused += 1
    assert refused >= MUTANTS // 10  # the flips reach the parser (most refused; some flips are harmless)


def _tag(path: Path, code: int, count: int | None = None, value: int | None = None) -> Path:
    """The file with one IFD entry's count or inline SHORT value rewritten (classic little-endian TIFF)."""
    with tifffile.TiffFile(path) as tif:
        entry = tif.pages[0].tags[code].offset
    data = bytearray(path.read_bytes())
    if count is not None:
        data[entry + 4 : entry + 8] = struct.pack("<I", count)
    if value is not None:
        data[entry + 8 : entry + 10] = struct.pack("<H", value)
    path.write_bytes(bytes(data))
    return path


def test_crafted_tags_are_skipped_under_on_error_skip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The issue's kinds: an unknown photometric (AttributeError), a two-valued TileWidth (TypeError)."""
    src = tmp_path / "hr"
    _tiff(src / "good.tif", tile=(32, 32))
    bad = [
        _tag(_tiff(src / "photometric.tif", tile=(32, 32)), 262, value=77),
        _tag(_tiff(src / "tilewidth.tif", tile=(32, 32)), 322, count=2),
    ]
    rc, _, se = sm(capsys, "build", src, tmp_path / "stop", "--workers", "1")
    assert rc == 2 and se.count("\n") == 1 and "Traceback" not in se and any(str(b) in se for b in bad), se
    rc, so, se = sm(capsys, "build", src, tmp_path / "skip", "--workers", "1", "--on-error", "skip")
    assert rc == 0, se
    assert "skipped 2 source file" in so and all(str(b) in so for b in bad), so
    assert load_manifest(str(tmp_path / "skip")).samples == 1


def test_a_palette_tiff_is_sized_by_the_scan_as_the_reader_reads_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A TIFF the region reader leaves to Pillow (palette) is no scan error: the scan sizes it with Pillow too."""
    from PIL import Image

    src = tmp_path / "hr"
    src.mkdir()
    Image.fromarray(photos()[0][:64, :96]).convert("P").save(src / "palette.tif")
    assert header_size(fsspec.filesystem("file"), str(src / "palette.tif"), ".tif") == (96, 64)
    rc, _, se = sm(capsys, "build", src, tmp_path / "out", "--workers", "1")
    assert rc == 0 and load_manifest(str(tmp_path / "out")).samples == 1, se
