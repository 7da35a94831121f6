"""Issue 38, the low items and M1/M2: `--check` stats every shard, video frames under --max-pixels and
with alpha, a sparse huge TIFF, checkpoints whose fields or weights are bad, a full disk named."""

from __future__ import annotations

import errno
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch

from shardmaker import format as fmt
from shardmaker import storage
from shardmaker.builder import video
from shardmaker.builder.clips import scan_clips
from shardmaker.builder.images import SampleConfig
from shardmaker.builder.sample import encode_sample
from shardmaker.builder.sources import Skipped, scan_sources, split_regions
from shardmaker.errors import InputError
from shardmaker.imaging.regions import TiffRegions
from tests.helpers import ROOT, S3_BUCKET, mosaic, save, sm
from tests.s3server import s3fs_for
from wdsr.tools.cli import main
from wdsr.train.checkpoint import FORMAT
from wdsr.train.models import build_model

SMALL = ["--model", "espcn", "--patch-size", "48", "-k", "4", "--batch-size", "4", "--shuffle-buffer", "16", "--val-every", "0"]


def check(data: str, out: Path) -> list[str]:
    return ["train", "--data", data, "--out", str(out), *SMALL, "--workers", "1", "--check"]


# ---- --check: every shard there, with the manifest's size ------------------------------------------
def test_check_refuses_missing_and_truncated_shards_local(photo_shards, tmp_path, capsys):
    ds = tmp_path / "ds"
    shutil.copytree(photo_shards, ds)
    shards = sorted(ds.glob("*.tar"))
    assert main(check(str(ds), tmp_path / "ok")) == 0  # all there: OK
    capsys.readouterr()
    shards[1].unlink()
    with shards[2].open("r+b") as f:  # truncated to a tar block: still a file, the wrong size
        f.truncate(512)
    assert main(check(str(ds), tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2 of 4 shards missing or truncated" in err, err
    assert f"{shards[1].name} is missing" in err and f"{shards[2].name} has 512 bytes" in err, err
    for s in shards:  # none left: every one named (the first SHOWN) or counted
        s.unlink(missing_ok=True)
    assert main(check(str(ds), tmp_path / "run")) == 2
    assert "4 of 4 shards" in capsys.readouterr().err


def test_check_refuses_missing_and_truncated_shards_on_s3(s3, s3_photo_shards, tmp_path, capsys):
    fs = s3fs_for(s3.endpoint)
    src, dst = s3_photo_shards.removeprefix("s3://"), f"{S3_BUCKET}/check-missing"
    fs.copy(src, dst, recursive=True)
    names = sorted(p for p in fs.ls(dst) if p.endswith(".tar"))
    fs.rm(names[0])
    fs.pipe(names[3], fs.cat(names[3])[:1024])
    assert main(check(f"s3://{dst}", tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "2 of 4 shards missing or truncated" in err, err
    assert "is missing" in err and "has 1024 bytes" in err, err


# ---- videos: --max-pixels from the stream's declared size, frames of another size, alpha ------------
def _video(path: Path, sizes: list[tuple[int, int]], codec: str = "mjpeg", pix: str = "yuvj420p") -> Path:
    """A tiny video written by PyAV; a frame whose size differs from the first is encoded by a codec
    context of its own and muxed into the stream (which declares the first frame's size)."""
    av = pytest.importorskip("av")
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as c:
        st = c.add_stream(codec, rate=30)
        st.width, st.height = sizes[0]
        st.pix_fmt = pix
        for i, (w, h) in enumerate(sizes):
            rgba = "a" in pix.replace("yuvj", "")
            f = av.VideoFrame.from_ndarray(
                np.full((h, w, 4 if rgba else 3), 90 + i, np.uint8), format="rgba" if rgba else "rgb24"
            )
            if (w, h) == sizes[0]:
                packets = list(st.encode(f))
            else:
                cc = av.CodecContext.create(codec, "w")
                cc.width, cc.height, cc.pix_fmt, cc.time_base = w, h, pix, st.codec_context.time_base
                f.pts = i
                packets = [*cc.encode(f), *cc.encode()]
                for p in packets:
                    p.stream, p.pts, p.dts = st, i, i
            for p in packets:
                c.mux(p)
        for p in st.encode():
            c.mux(p)
    return path


def test_video_streams_over_max_pixels_are_refused_at_scan_time(tmp_path, capsys):
    root = tmp_path / "vids"
    _video(root / "big.mkv", [(64, 48)] * 2)
    with pytest.raises(InputError, match=r"big\.mkv.*64x48 = 3072 pixels is over the limit of 3000"):
        scan_clips(str(root), max_pixels=3000)  # a scan decodes nothing: refused from the container's size
    assert len(scan_clips(str(root), max_pixels=3072)[0]) == 1
    rc, _, err = sm(capsys, "build", root, tmp_path / "out", "--clips", "--workers", "1", "--max-pixels", "3000")
    assert rc == 2 and "big.mkv" in err and "raise --max-pixels" in err, err


def test_a_frame_larger_than_the_stream_declares_is_refused_before_conversion(tmp_path):
    path = _video(tmp_path / "grow.mkv", [(32, 32), (32, 32), (64, 64)])
    (w, h), pts = video.video_info(str(path))
    assert (w, h) == (32, 32) and len(pts) == 3
    with pytest.raises(InputError, match=r"frame 2 is 64x64, the stream declares 32x32"):
        list(video.video_frames(str(path), 0, 3, pts=tuple(pts)))


def test_videos_with_alpha_need_drop_alpha(tmp_path, capsys):
    root = tmp_path / "vids"
    _video(root / "alpha.mkv", [(32, 32)] * 2, codec="ffv1", pix="yuva420p")
    with pytest.raises(InputError, match=r"alpha\.mkv.*yuva420p has an alpha channel; pass --drop-alpha"):
        scan_clips(str(root))
    rc, _, err = sm(capsys, "build", root, tmp_path / "a", "--clips", "--workers", "1", "--scale", "2")
    assert rc == 2 and "--drop-alpha" in err, err
    rc, _, err = sm(capsys, "build", root, tmp_path / "b", "--clips", "--workers", "1", "--scale", "2", "--drop-alpha")
    assert rc == 0, err


# ---- a sparse TIFF of 2^20 x 2^20 pixels: over --max-pixels, refused before any region is planned ----
def _sparse_tiff(path: Path, side: int, tile: int) -> Path:
    """A classic little-endian tiled RGB TIFF whose every tile is sparse (offset and byte count 0):
    (side / tile)^2 tiles, 8 bytes each in the file, no pixel data at all."""
    n = (side // tile) ** 2
    tags = [(256, 4, 1, side), (257, 4, 1, side), (258, 3, 3, None), (259, 3, 1, 1), (262, 3, 1, 2)]
    tags += [(277, 3, 1, 3), (284, 3, 1, 1), (322, 4, 1, tile), (323, 4, 1, tile), (324, 4, n, None), (325, 4, n, None)]
    ifd = 8
    extra = ifd + 2 + 12 * len(tags) + 4  # out-of-line values follow the IFD
    bits, offsets, counts = extra, extra + 6, extra + 6 + 4 * n
    body = bytearray(b"II*\x00" + struct.pack("<I", ifd) + struct.pack("<H", len(tags)))
    for code, typ, count, value in tags:
        where = {258: bits, 324: offsets, 325: counts}.get(code)
        packed = (
            struct.pack("<I", where)
            if where is not None
            else struct.pack("<H", value) + b"\0\0"
            if typ == 3
            else struct.pack("<I", value)
        )
        body += struct.pack("<HHI", code, typ, count) + packed
    body += struct.pack("<I", 0) + struct.pack("<3H", 8, 8, 8) + bytes(8 * n)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(body))
    return path


def test_a_sparse_huge_tiff_is_refused_with_its_region_count(tmp_path, photo_src, capsys):
    src = tmp_path / "src"
    tif = _sparse_tiff(src / "slide.tif", 1 << 20, 8192)
    assert tif.stat().st_size < 140_000
    rc, _, err = sm(capsys, "build", src, tmp_path / "a", "--workers", "1", "--scale", "2")
    assert rc == 2 and "slide.tif" in err and "1048576x1048576" in err and "16384 regions of up to 8192x8192" in err, err
    assert "raise --max-pixels" in err and len(err.strip().splitlines()) == 1, err
    shutil.copy(photo_src / "p00.png", src / "p00.png")  # with a good image beside it, --on-error skip leaves it out
    rc, out, err = sm(capsys, "build", src, tmp_path / "b", "--workers", "1", "--scale", "2", "--on-error", "skip")
    assert rc == 0 and "skipped 1 source file(s)" in out, out + err


# ---- wdsr upscale: a checkpoint's step and weights, the model's output ------------------------------
def _checkpoint(path: Path, step: object = 3, weights: float | None = None) -> Path:
    """An ESPCN x2 checkpoint as wdsr train writes its fields (no training: the weights are its init,
    or all ``weights``)."""
    torch.manual_seed(0)
    sd = build_model("espcn", 2, 3).state_dict()
    if weights is not None:
        sd = {k: torch.full_like(v, weights) if v.is_floating_point() else v for k, v in sd.items()}
    torch.save({"format": FORMAT, "model": sd, "config": {"model": "espcn", "scale": 2}, "step": step}, path)
    return path


@pytest.mark.parametrize(
    "step, weights, says",
    [
        ("x", None, "'step' must be an integer in [0, 999999999999999999], got 'x'"),
        (True, None, "'step' must be an integer"),
        (3, float("nan"), "the weights hold inf or NaN"),
        (3, 3e38, "the model's output holds inf or NaN"),  # finite weights whose output overflows
    ],
)
def test_upscale_refuses_bad_steps_and_non_finite_weights_or_output(tmp_path, capsys, step, weights, says):
    ckpt = _checkpoint(tmp_path / "c.pt", step, weights)
    img = tmp_path / "img.png"
    save(img, np.random.default_rng(0).integers(0, 255, (20, 24, 3), dtype=np.uint8))
    rc = main(["upscale", str(ckpt), str(img), "-o", str(tmp_path / "out"), "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and str(ckpt) in err and says in err, err
    assert not list((tmp_path / "out").glob("*.png")), "an image was written"


# ---- a full disk names the file being written --------------------------------------------------------
def test_a_full_disk_names_the_file_written_atomically(tmp_path):
    """The kernel's own ENOSPC: the temp name is a link to /dev/full (every write to it: No space left)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    fs = fsspec.filesystem("file")
    path = str(tmp_path / "step-00000001.pt")
    os.symlink("/dev/full", storage.temp_name(fs, path))
    with pytest.raises(OSError) as got:
        storage.write_atomic(fs, path, b"x" * 100_000)  # what checkpoints, manifests and plots are written with
    assert got.value.errno == errno.ENOSPC and path in str(got.value), str(got.value)
    assert not os.path.lexists(storage.temp_name(fs, path)) and not os.path.exists(path)


_FSIZE = """
import resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as a full quota would
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
from wdsr.tools.upscale import write_output
try:
    write_output(Path(sys.argv[1]), b"x" * 100_000)
except OSError as exc:
    print(exc)
"""


def test_a_write_past_the_file_size_limit_names_upscales_output(tmp_path):
    target = tmp_path / "img.png"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FSIZE), str(target)], capture_output=True, text=True, env=env, timeout=120
    )
    assert "File too large" in proc.stdout and str(target) in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert not target.exists() and not list(tmp_path.iterdir())


def _half_sparse_tiff(path: Path) -> Path:
    """A 1024 x 2048 tiled RGB TIFF of real photos whose right half's tiles are then marked sparse (byte count 0)."""
    tifffile = pytest.importorskip("tifffile")
    path.parent.mkdir(parents=True, exist_ok=True)
    tifffile.imwrite(path, mosaic(1024, 2048), tile=(256, 256), photometric="rgb")
    with tifffile.TiffFile(path, mode="r+b") as t:
        tag = t.pages[0].tags["TileByteCounts"]
        counts = list(tag.value)
        counts = [0 if i % 8 >= 4 else n for i, n in enumerate(counts)]  # 8 tiles a row: columns 4..7
        tag.overwrite(counts)
    return path


def test_sparse_regions_are_dropped_without_decoding_under_min_valid(tmp_path, capsys):
    src = tmp_path / "src"
    tif = _half_sparse_tiff(src / "slide.tif")
    with TiffRegions(str(tif)) as t:
        assert t.sparse(0, 1024, 512, 512) and t.sparse(512, 1536, 512, 512) and not t.sparse(0, 768, 512, 512)
        assert not t.read(0, 1024, 512, 512).any()  # a sparse tile reads as zeros
    cfg = SampleConfig(scales=(2,), region=512, min_valid=0.05)
    pairs = split_regions(scan_sources([str(src)])[0], 512, (2,))
    got = {p.key: encode_sample(p, cfg) for p in pairs}
    sparse = {k for k, v in got.items() if isinstance(v, Skipped) and v.reason.startswith("region is sparse")}
    assert sparse == {k for k in got if int(k.split("_x")[1]) >= 1024} and len(sparse) == 4, got
    args = ["build", src, tmp_path / "ds", "--workers", "1", "--scale", "2", "--region", "512", "--min-valid", "0.05"]
    rc, _, err = sm(capsys, *args)
    assert rc == 0, err
    m = fmt.load(str(tmp_path / "ds"))
    assert m.samples == 4 and m.build["dropped_count"] == 4, m.build
