"""Images larger than a region become region samples (issue 26): `shardmaker build --region N`
reads each region (a TIFF by its segments, any other source whole), makes its LR MATLAB-exactly
from the region and a margin, so region samples are exact crops of the whole image's HR and LR
(at every region border), drops flat regions under `--min-valid`, and the stream reads them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tifffile

import wdsr
from shardmaker import format as fmt
from shardmaker.builder import BuildConfig, build
from shardmaker.builder.sample import SampleConfig
from shardmaker.imaging import TiledImage, codecs
from shardmaker.imaging.resize import downscale
from tests.helpers import build_shards, mosaic, save, sm


def _samples(ds: Path) -> dict[str, tuple[dict, dict[str, np.ndarray]]]:
    """key -> (its json, member -> decoded pixels) for every sample of a dataset."""
    out = {}
    for sh in fmt.load(str(ds)).shards:
        with open(ds / sh.name, "rb") as f:
            for key, _, members in fmt.iter_samples(f):
                meta = json.loads(members.pop("json"))
                pix = {}
                for name, data in members.items():
                    if name.endswith(".tiles"):
                        img = TiledImage(bytes(data))
                        pix[name.split(".")[0]] = np.asarray(img)
                    else:
                        pix[name.split(".")[0]] = codecs.decode(bytes(data), name.split(".")[-1])
                out[key] = (meta, pix)
    return out


def _check_crops(whole: dict, regions: dict, scales: tuple[int, ...]) -> int:
    """Every region sample is the crop of the whole image's HR and LR it names; returns how many."""
    n = 0
    for key, (meta, pix) in regions.items():
        r = meta["region"]
        base = key.rsplit("_y", 1)[0]
        wmeta, wpix = whole[base]
        assert meta["image_size"] == wmeta["hr_size"] and meta["source"] == wmeta["source"]
        assert key == f"{base}_y{r['y']:07d}_x{r['x']:07d}" and meta["hr_size"] == [r["w"], r["h"]]
        np.testing.assert_array_equal(pix["hr"], wpix["hr"][r["y"] : r["y"] + r["h"], r["x"] : r["x"] + r["w"]])
        for s in scales:
            want = wpix[f"lr_x{s}"][r["y"] // s : (r["y"] + r["h"]) // s, r["x"] // s : (r["x"] + r["w"]) // s]
            np.testing.assert_array_equal(pix[f"lr_x{s}"], want, err_msg=f"{key} x{s}")
        n += 1
    return n


@pytest.mark.parametrize("scales,tiles", [((2, 4), "off"), ((2, 3, 4), "96")])
def test_region_samples_are_crops_of_the_whole_image_at_every_border(capsys, tmp_path, scales, tiles):
    src = tmp_path / "src"
    save(src / "scene.png", mosaic(1201, 1555))  # sides that no scale divides
    save(src / "small.png", mosaic(300, 400))  # no larger than a region: one sample, as before
    flags = ("--scale", ",".join(map(str, scales)), "--codec", "qoi")
    whole = build_shards(src, tmp_path / "whole", *flags)
    parts = build_shards(src, tmp_path / "regions", *flags, "--region", "512", "--tiles", tiles)
    got = _samples(parts)
    assert "small" in got and "region" not in got["small"][0]
    regions = {k: v for k, v in got.items() if k != "small"}
    side = 512 // 12 * 12 if 3 in scales else 512  # the region side on the grid of every scale
    assert len(regions) == 12 and all(max(m["hr_size"]) <= side for m, _ in regions.values())
    assert _check_crops(_samples(whole), regions, scales) == 12
    if tiles != "off":
        assert all(m.get("tiles") == 96 for m, _ in regions.values())
        assert [t for sh in fmt.load(str(parts)).shards for t in sh.tiles] == [96] * 13  # the manifest says so too
    m = fmt.load(str(parts))
    assert m.build["regions"] == {"side": 512, "images": 1, "samples": 12} and m.build["sources"] == 2
    ds = wdsr.SRDataset(str(parts), scale=4, patch_size=96, patches_per_image=4, batch_size=4)
    assert sum(b[0].shape[0] for b in ds) == 4 * 13
    rc, so, _ = sm(capsys, "info", str(parts))
    assert rc == 0 and "regions    1 image(s) larger than 512 px split into 12 samples" in so
    assert ("tiles      13 of 13 samples tiled: 13 with 96 px tiles" in so) == (tiles != "off")
    rc, so, _ = sm(capsys, "ls", "--keys", str(parts))
    first = regions["scene_y0000000_x0000000"][0]["hr_size"]
    line = f"scene_y0000000_x0000000  {first[0]}x{first[1]}"
    assert f"{line}  tiles 96\n" in so if tiles != "off" else f"{line}\n" in so, so


TIFFS = {
    "deflate-tiles": dict(tile=(256, 256), compression="zlib"),
    "jpeg-tiles-bigtiff": dict(tile=(128, 128), compression="jpeg", compressionargs={"level": 92}, bigtiff=True),
    "strips": dict(rowsperstrip=64, compression="zlib"),
}


@pytest.mark.parametrize("variant", sorted(TIFFS))
def test_tiled_tiff_sources_are_ingested_region_by_region(tmp_path, variant):
    """A real tiled TIFF (deflate, JPEG in a BigTIFF) written by tifffile from real photos: every region
    sample's HR is the crop of the image as tifffile reads it whole, its LR that of the whole LR."""
    img = mosaic(1100, 1300)
    src = tmp_path / "src"
    src.mkdir()
    tifffile.imwrite(src / "slide.tif", img, **TIFFS[variant])
    ref = tifffile.imread(src / "slide.tif")  # JPEG: what the decoder gives, not the array written
    parts = build_shards(src, tmp_path / "ds", "--scale", "2,4", "--region", "512", "--tiles", "128")
    got = _samples(parts)
    assert len(got) == 9  # 1100 x 1300 in 512 regions: 3 x 3
    whole = {"slide": ({"hr_size": [1300, 1100], "source": "slide.tif"}, {"hr": ref})}
    for s in (2, 4):
        whole["slide"][1][f"lr_x{s}"] = downscale(ref[: 1100 // s * s, : 1300 // s * s], s)
    assert _check_crops(whole, got, (2, 4)) == 9


def test_min_valid_drops_flat_regions_and_lists_them(capsys, tmp_path):
    slide = np.full((1536, 1536, 3), 236, np.uint8)  # glass
    slide += np.random.default_rng(0).integers(0, 3, slide.shape, dtype=np.uint8)  # sensor noise: still flat
    slide[:700, :900] = mosaic(700, 900)  # tissue in the top-left corner
    src = tmp_path / "src"
    src.mkdir()
    tifffile.imwrite(src / "slide.tif", slide, tile=(256, 256), compression="zlib")
    rc, so, se = sm(capsys, "build", str(src), str(tmp_path / "ds"), "--workers", "1", "--region", "512", "--min-valid", "0.25")
    assert rc == 0, se
    assert "dropped 5 sample(s) under --min-valid 0.25" in so
    m = fmt.load(str(tmp_path / "ds"))
    kept = sorted(k for sh in m.shards for k in sh.keys)
    assert kept == ["slide_y0000000_x0000000", "slide_y0000000_x0000512", "slide_y0000512_x0000000", "slide_y0000512_x0000512"]
    assert m.build["dropped_count"] == 5 and m.build["min_valid"] == 0.25 and m.build["skipped_count"] == 0
    dropped = {d["key"]: d for d in m.build["dropped"]}
    assert sorted(dropped) == sorted(
        f"slide_y{y:07d}_x{x:07d}"
        for y in (0, 512, 1024)
        for x in (0, 512, 1024)
        if (y, x) not in {(0, 0), (0, 512), (512, 0), (512, 512)}
    )
    assert all(d["valid"] < 0.25 and d["source"].endswith("slide.tif") for d in dropped.values())
    # the same with parts and a merge: the dropped regions of both parts are listed once each
    for i in (0, 1):
        assert (
            sm(
                capsys, "-q", "build", str(src), str(tmp_path / "p"), "--region", "512", "--min-valid", "0.25", "--part", f"{i}/2"
            )[0]
            == 0
        )
    assert sm(capsys, "-q", "merge", str(tmp_path / "p"))[0] == 0
    mp = fmt.load(str(tmp_path / "p"))
    assert mp.build["dropped_count"] == 5 and sorted(d["key"] for d in mp.build["dropped"]) == sorted(dropped)


def test_dropped_regions_survive_a_resumed_build(capsys, tmp_path):
    """A build that fails after some shards resumes them: the regions dropped before are still listed."""
    import fsspec

    from tests.test_bad_input import FailingFS

    slide = np.full((1024, 2048, 3), 30, np.uint8)  # nodata
    slide[:, 1024:] = mosaic(1024, 1024)
    src = tmp_path / "src"
    src.mkdir()
    tifffile.imwrite(src / "scene.tif", slide, tile=(128, 128), compression="zlib")
    fsspec.register_implementation("failmem", FailingFS, clobber=True)
    FailingFS.store.clear()
    FailingFS.budget = 1_200_000  # a shard or two, not all four kept regions
    args = (
        "build",
        str(src),
        "failmem://out",
        "--workers",
        "1",
        "--region",
        "512",
        "--min-valid",
        "0.5",
        "--max-samples",
        "1",
        "--codec",
        "qoi",
    )
    rc, _, se = sm(capsys, *args)
    assert rc == 2 and "No space left" in se
    FailingFS.budget = 10**9
    rc, so, se = sm(capsys, *args)
    assert rc == 0 and "kept from an earlier run" in so and "(0 shards kept" not in so, so
    m = fmt.load("failmem://out")
    assert m.build["dropped_count"] == 4 and m.samples == 4
    assert sorted(d["key"] for d in m.build["dropped"]) == [f"scene_y{y:07d}_x{x:07d}" for y in (0, 512) for x in (0, 512)]


def test_provided_lr_is_cut_region_by_region(tmp_path):
    img = mosaic(1030, 1290)
    src, lr = tmp_path / "hr", tmp_path / "lr"
    save(src / "a.png", img)
    lr_img = downscale(img[:1028, :1288], 4)
    tifffile.imwrite(lr / "a.tif" if lr.mkdir() is None else None, lr_img, tile=(64, 64), compression="zlib")
    whole = build_shards(src, tmp_path / "w", "--lr", str(lr))
    parts = build_shards(src, tmp_path / "r", "--lr", str(lr), "--region", "512")
    assert _check_crops(_samples(whole), _samples(parts), (4,)) == 9


def test_region_flags_are_checked(capsys, tmp_path):
    save(tmp_path / "src" / "a.png", mosaic(64, 64))
    for flags, msg in (
        (("--region", "100"), "region must be a side in [512, 16384]"),
        (("--min-valid", "1.5"), "min_valid must be a share in [0, 1]"),
    ):
        rc, _, se = sm(capsys, "build", str(tmp_path / "src"), str(tmp_path / "o"), *flags)
        assert rc == 2 and msg in se, se
    with pytest.raises(ValueError, match="region must be"):
        SampleConfig(scales=(4,), region=10**6)
    assert BuildConfig(str(tmp_path / "src"), str(tmp_path / "o")).sample.region == 8192
    res = build(BuildConfig(str(tmp_path / "src"), str(tmp_path / "o"), progress=False))
    assert res.samples == 1 and "regions" not in fmt.load(str(tmp_path / "o")).build


@pytest.mark.slow
def test_a_20480_square_slide_builds_in_bounded_memory(tmp_path):
    """A 20480 x 20480 RGB BigTIFF (1.26 GB of pixels: tissue of real photos in two corners, glass
    elsewhere) builds with the default --region in a child process whose peak RSS stays under 1 GB;
    the kept regions' HR are the source's pixels."""
    side, t = 20480, 1024
    base, glass = mosaic(t, t), np.full((t, t, 3), 236, np.uint8)
    n = side // t

    def tissue(r: int, c: int) -> bool:
        return (r < 7 and c < 7) or (r >= 14 and c >= 14)

    def tile(r: int, c: int) -> np.ndarray:
        return np.roll(base, 13 * (r * n + c), axis=1) if tissue(r, c) else glass

    src = tmp_path / "src"
    src.mkdir()
    tiles = (tile(*divmod(i, n)) for i in range(n * n))
    tifffile.imwrite(src / "slide.tif", tiles, shape=(side, side, 3), dtype=np.uint8, tile=(t, t), bigtiff=True)
    code = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        from shardmaker.cli import main
        rc = main(["-q", "build", {str(src)!r}, {str(tmp_path / "ds")!r}, "--workers", "1", "--scale", "4",
                   "--codec", "qoi", "--tiles", "auto", "--min-valid", "0.3", "--max-pixels", "500000000"])
        # VmHWM, not ru_maxrss: that keeps the forking parent's peak across exec
        print(rc, next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmHWM:")))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rc, peak_kb = map(int, proc.stdout.split()[-2:])
    assert rc == 0 and peak_kb < 1 << 20, f"peak RSS {peak_kb >> 10} MB"
    m = fmt.load(str(tmp_path / "ds"))
    assert m.build["regions"]["samples"] == 9 and m.build["dropped_count"] == 7 and m.samples == 2
    got = _samples(tmp_path / "ds")
    for key, (meta, pix) in got.items():
        r = meta["region"]
        assert meta.get("tiles") == 256 and pix["hr"].shape == (r["h"], r["w"], 3)
        for y, x in ((r["y"], r["x"]), (r["y"] + r["h"] - 1, r["x"] + r["w"] - 1), (r["y"] + 1500, r["x"] + 777)):
            want = tile(y // t, x // t)[y % t, x % t]
            np.testing.assert_array_equal(pix["hr"][y - r["y"], x - r["x"]], want, err_msg=f"{key} at ({x}, {y})")


def _digests(ds, workers: int, state: dict | None = None, stop: int | None = None) -> tuple[list[str], dict]:
    import hashlib

    loader = wdsr.make_loader(ds, num_workers=workers, persistent_workers=False)
    if state is not None:
        loader.load_state_dict(state)
    out: list[str] = []
    it = iter(loader)
    try:
        for lr, hr, keys in it:
            out.append(hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes() + "".join(keys).encode()).hexdigest()[:16])
            if stop is not None and len(out) == stop:
                break
    finally:
        it.close()
    return out, loader.state_dict()


def test_tiled_region_samples_keep_ranks_resume_and_elastic_resume(tmp_path):
    """Region samples stored tiled give the batches the same regions give stored whole, on every rank
    of a world of 2, resumed mid-epoch, and resumed elastically on a world of 1."""
    from wdsr.env import World

    src = tmp_path / "src"
    save(src / "scene.png", mosaic(1100, 1900))
    save(src / "photo.png", mosaic(500, 700))
    whole = build_shards(src, tmp_path / "whole", "--region", "512", "--codec", "qoi", "--max-samples", "3")
    tiled = build_shards(src, tmp_path / "tiled", "--region", "512", "--codec", "qoi", "--max-samples", "3", "--tiles", "128")
    kw = dict(scale=4, patch_size=64, patches_per_image=5, batch_size=3, shuffle_buffer=12, seed=5, return_keys=True)

    def ds(url, rank, world):
        return wdsr.SRDataset(str(url), world=World(rank, world), **kw)

    per_rank = []
    for rank in (0, 1):
        a, _ = _digests(ds(whole, rank, 2), 2)
        b, _ = _digests(ds(tiled, rank, 2), 2)
        assert a == b and len(a) >= 4
        per_rank.append(len(a))
        first, state = _digests(ds(tiled, rank, 2), 2, stop=len(a) // 2)
        rest, _ = _digests(ds(tiled, rank, 2), 2, state=state)
        assert first + rest == a
    assert per_rank[0] == per_rank[1]
    a, b = (_digests(ds(url, 0, 1), 1, state=_digests(ds(url, 0, 2), 1, stop=2)[1])[0] for url in (whole, tiled))
    assert a == b and a
