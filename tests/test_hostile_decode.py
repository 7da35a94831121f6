"""Hostile and unlucky inputs at decode and in mixes (issue 24): every decode path checks the headers
before any pixel is decoded (bombs measured under a memory cap in a child process), a sample of
another kind than its dataset is a SampleError that ``on_error`` handles, a mix of kinds is refused
up front, and a mix's ``weights``/``epoch_samples`` and folders are checked before anything is laid out."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import wdsr
from shardmaker import imaging
from shardmaker.imaging import Codec
from tests.helpers import ROOT, build_shards, descendants, photos, rewrite, save

pytestmark = pytest.mark.timeout(180)  # every case must end, not hang

BOMB_SIDE = 30000  # a 30000 x 30000 grey PNG: 900 MB decoded (2-3x that inside a PNG decoder), ~5.7 MB on disk
HEADROOM_MB = 400  # what the child may allocate past its imports: well under the bomb's decoded size


# ---- bombs: real images of a huge declared size, made without ever holding their pixels ---------------
class _Bits:
    """Deflate's bit order: values LSB first, Huffman codes MSB first."""

    def __init__(self) -> None:
        self.acc, self.n, self.out = 0, 0, bytearray()

    def put(self, value: int, bits: int) -> None:
        self.acc |= value << self.n
        self.n += bits
        while self.n >= 8:
            self.out.append(self.acc & 0xFF)
            self.acc >>= 8
            self.n -= 8

    def code(self, code: int, bits: int) -> None:
        self.put(int(f"{code:0{bits}b}"[::-1], 2), bits)

    def done(self) -> bytes:
        if self.n:
            self.out.append(self.acc & 0xFF)
        return bytes(self.out)


def zero_zlib(n: int) -> bytes:
    """A zlib stream of ``n`` zero bytes in one fixed-Huffman block: a literal 0, then copies of 258 bytes
    at distance 1. Eight copies are 104 bits, 13 whole bytes, so the middle is one 13-byte pattern repeated."""
    match = (0b11000101, 8), (0, 5)  # length 258 (code 285, no extra bits), distance 1 (code 0)
    w = _Bits()
    w.put(1, 1)  # BFINAL
    w.put(1, 2)  # BTYPE 01: fixed Huffman codes
    w.code(0b00110000, 8)  # literal 0
    copies, rest = divmod(n - 1, 258)
    octets, single = divmod(copies, 8)
    pattern = b""
    for i in range(min(octets, 2)):  # the second octet's bytes are what every later octet writes too
        before = len(w.out)
        for _ in range(8):
            for c, b in match:
                w.code(c, b)
        pattern = bytes(w.out[before:]) if i == 1 else pattern
    if octets > 2:
        w.out += pattern * (octets - 2)
    for _ in range(single):
        for c, b in match:
            w.code(c, b)
    for _ in range(rest):
        w.code(0b00110000, 8)
    w.code(0, 7)  # end of block (256)
    adler = ((n % 65521) << 16) | 1  # of n zero bytes: a stays 1, b adds 1 per byte
    return b"\x78\x01" + w.done() + struct.pack(">I", adler)


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def zero_png(w: int, h: int) -> bytes:
    """A real, valid w x h all-black 8-bit grey PNG (every row filter 0), a few MB at most."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zero_zlib((w + 1) * h)) + _chunk(b"IEND", b"")


def huge_jpeg_header(w: int, h: int) -> bytes:
    """A JPEG's SOI + baseline frame header of w x h x 3 (no image data: only the header matters before decode)."""
    sof = struct.pack(">BHHB", 8, h, w, 3) + b"".join(struct.pack(">BBB", i, 0x11, 0) for i in (1, 2, 3))
    return b"\xff\xd8" + b"\xff\xc0" + struct.pack(">H", 2 + len(sof)) + sof + b"\xff\xd9"


def huge_qoi_header(w: int, h: int) -> bytes:
    return b"qoif" + struct.pack(">IIBB", w, h, 3, 0) + bytes([0xC0 | 61]) * 8 + b"\0" * 7 + b"\x01"


def test_the_bomb_makers_make_real_images():
    """The bomb is not a fake header: at a small size the same maker gives a PNG every decoder reads."""
    for n in (1, 2, 258, 259, 2064, 2065, 5000, 12345):
        assert zlib.decompress(zero_zlib(n)) == bytes(n), n
    small = zero_png(301, 203)
    img = np.asarray(Image.open(io.BytesIO(small)))
    assert img.shape == (203, 301) and not img.any()
    assert imaging.decode(small, "png").shape == (203, 301)
    bomb = zero_png(BOMB_SIDE, BOMB_SIDE)
    assert len(bomb) < 8 << 20  # a few MB for 900 MB of pixels
    d = zlib.decompressobj()
    got = d.decompress(bomb[33 + 8 :][: 1 << 16], 1 << 20)  # its stream inflates to zeros (first MB checked)
    assert len(got) == 1 << 20 and not any(got)


# ---- every decode path, under a memory cap ------------------------------------------------------------
CAPPED = """
import json, resource, sys, traceback
import wdsr, wdsr.wds as sr
from shardmaker import imaging
from wdsr.pipeline.checks import Verify
from wdsr.pipeline.decode import decode_pair
from wdsr.pipeline.read import RawSample
from wdsr.tools.upscale import read_image

def vm(field):
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith(field + ":"))) // 1024

folder = sys.argv[1]
bomb, lr = open(folder + "/bomb.png", "rb").read(), open(folder + "/lr.png", "rb").read()
jpg, qoi = open(folder + "/bomb.jpg", "rb").read(), open(folder + "/bomb.qoi", "rb").read()
base = vm("VmRSS")
cap = (vm("VmSize") + int(sys.argv[2])) << 20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
sample = {"__url__": "shard.tar", "__key__": "bomb"}
paths = {
    "wds.decode_pair png": lambda: sr.decode_pair(scale=4)({**sample, "hr.png": bomb, "lr_x4.png": lr}),
    "wds.decode_pair jpg": lambda: sr.decode_pair(scale=4, hr="jpg", lr="x4.jpg")({**sample, "jpg": jpg, "x4.jpg": jpg}),
    "wds.decode_pair qoi": lambda: sr.decode_pair(scale=4)({**sample, "hr.qoi": qoi, "lr_x4.qoi": qoi}),
    "pipeline.decode_pair": lambda: decode_pair(
        RawSample("shard.tar", "bomb", 0, 0, {"hr.png": bomb, "lr_x4.png": lr}, 0, 0, digests={}),
        ("hr.png", "lr_x4.png"), 4, Verify.NONE),
    "imaging.decode png": lambda: imaging.decode(bomb, "png"),
    "imaging.decode qoi": lambda: imaging.decode(qoi, "qoi"),
    "imaging.decode jpg": lambda: imaging.decode(jpg, "x4.jpg"),
    "imaging.load_source": lambda: imaging.load_source(bomb, ext=".png"),
    "upscale.read_image": lambda: read_image(__import__("pathlib").Path(folder, "bomb.png")),
}
for name, call in paths.items():
    try:
        call()
        out = {"path": name, "error": None}
    except BaseException as exc:
        out = {"path": name, "error": type(exc).__name__, "message": str(exc)[:400]}
    out["rss_mb"] = vm("VmHWM") - base
    print(json.dumps(out), flush=True)
"""


def run_capped(code: str, *args: str, headroom_mb: int = HEADROOM_MB) -> subprocess.CompletedProcess:
    """``code`` in a child whose address space may grow ``headroom_mb`` past what its imports took
    (RLIMIT_AS); the timeout only stops a hang. Reaped by ``subprocess.run``."""
    return subprocess.run(
        [sys.executable, "-c", code, *args, str(headroom_mb)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow
def test_a_bomb_is_refused_from_its_header_on_every_decode_path(tmp_path):
    (tmp_path / "bomb.png").write_bytes(zero_png(BOMB_SIDE, BOMB_SIDE))
    (tmp_path / "lr.png").write_bytes(zero_png(BOMB_SIDE // 4, BOMB_SIDE // 4))
    (tmp_path / "bomb.jpg").write_bytes(huge_jpeg_header(60000, 60000))
    (tmp_path / "bomb.qoi").write_bytes(huge_qoi_header(BOMB_SIDE, BOMB_SIDE))
    proc = run_capped(CAPPED, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["path"]: r for r in map(json.loads, proc.stdout.splitlines())}
    assert len(results) == 9, results
    want = {"wds": "SampleError", "pipeline": "SampleError", "imaging": "ImageDataError", "upscale": "ValueError"}
    for name, r in results.items():
        assert r["error"] == want[name.split(".")[0]], r
        # refused for its size, from the header: not a decoder that ran out of memory under the cap
        assert "max_pixels" in r["message"] or "over the limit" in r["message"], r
        assert r["rss_mb"] < 100, r  # nothing the size of the image was ever allocated
    assert "'bomb'" in results["wds.decode_pair png"]["message"] and "shard.tar" in results["wds.decode_pair png"]["message"]
    assert str(tmp_path / "bomb.png") in results["upscale.read_image"]["message"]


def test_a_member_that_decodes_to_other_than_its_header_is_refused():
    """The decoder's result must be what the header declared (a header check is worth nothing otherwise)."""
    rgb = photos()[0][:40, :48]
    good = imaging.encode(rgb, Codec.QOI)
    lying = good[:4] + struct.pack(">II", 48, 40) + bytes([3]) + good[13:]
    assert imaging.decode(lying, "qoi").shape == (40, 48, 3)
    with pytest.raises(imaging.ImageDataError, match="over the limit"):
        imaging.decode(good, "qoi", max_pixels=40 * 48 - 1)
    with pytest.raises(imaging.ImageDataError, match="unknown member extension"):
        imaging.decode(good, "npy")


# ---- mixed kinds ----------------------------------------------------------------------------------------
def _src(root: Path, n: int, grey: bool = False, deep: bool = False, at: int = 0) -> Path:
    for i in range(n):
        y, x = 9 * i + at, 7 * i + 2 * at
        img = np.ascontiguousarray(photos()[i % 4][y : y + 64, x : x + 64])
        if grey:
            img = np.asarray(Image.fromarray(img).convert("L"))
        if deep:
            (root / f"p{i}.png").parent.mkdir(parents=True, exist_ok=True)
            (root / f"p{i}.png").write_bytes(imaging.encode(img.astype(np.uint16) * 257, Codec.PNG))
        else:
            save(root / f"p{i}.png", img)
    return root


def _record_kind(ds: Path, channels: int | None, bit_depth: int | None) -> None:
    """Write the kind into the manifest (or take it out: an old manifest), whatever the build recorded."""
    doc = json.loads((ds / "manifest.json").read_text())
    for field, value in (("channels", channels), ("bit_depth", bit_depth)):
        doc.pop(field, None)
        if value is not None:
            doc[field] = value
    (ds / "manifest.json").write_text(json.dumps(doc))


def _build(root: Path, name: str, **kind) -> Path:
    src = _src(root / f"src_{name}", 4, **kind)
    return Path(build_shards(src, root / name, "--scale", "2", "--max-samples", "2"))


def _grey_sample(ds: Path, key: str) -> None:
    """Make sample ``key``'s HR and LR grey, its digests and the manifest consistent: a well-formed
    sample of another kind, as a dataset assembled from mixed sources would hold."""
    import hashlib

    import xxhash

    doc = json.loads((ds / "manifest.json").read_text())
    shard = next(i for i, s in enumerate(doc["shards"]) if key in s["keys"])
    grey: dict[str, bytes] = {}

    def edit(name: str, data: bytes):
        if name.startswith(f"{key}.") and name.endswith(".png"):
            arr = imaging.decode(data, "png")
            grey[name] = imaging.encode(np.asarray(Image.fromarray(arr).convert("L")), Codec.PNG)
            return name, grey[name]
        return name, data

    rewrite(ds, shard, edit)  # the image members (the manifest's sizes and digests fixed)

    def edit_json(name: str, data: bytes):
        if name == f"{key}.json":
            meta = json.loads(data)
            for member, body in grey.items():
                short = member.split(".", 1)[1]
                for field, digest in (("sha256", hashlib.sha256(body).hexdigest()), ("xxh3_64", xxhash.xxh3_64_hexdigest(body))):
                    if field in meta:
                        meta[field][short if short in meta[field] else member] = digest
            meta["channels"] = 1
            return name, json.dumps(meta).encode()
        return name, data

    rewrite(ds, shard, edit_json)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    out = {
        "rgb": _build(root, "rgb"),
        "grey": _build(root, "grey", grey=True),
        "rgb16": _build(root, "rgb16", deep=True),
        "rgb2": _build(root, "rgb2", at=40),
    }
    mixed = root / "mixed"
    shutil.copytree(out["rgb2"], mixed)
    _grey_sample(mixed, "p1")
    out["mixed"] = mixed
    return out


KW = dict(scale=2, patch_size=32, patches_per_image=1, batch_size=2, shuffle_buffer=0, seed=3, return_keys=True)


def _keys(loader) -> list[str]:
    return [k for _, _, keys in loader for k in keys]


@pytest.mark.parametrize("recorded", [True, False])
def test_a_grey_sample_in_an_rgb_dataset_fails_or_is_skipped(kinds, tmp_path, recorded):
    ds = tmp_path / "ds"
    shutil.copytree(kinds["mixed"], ds)
    _record_kind(ds, 3 if recorded else None, 8 if recorded else None)
    if recorded:  # the manifest says RGB: the grey sample's header is refused before it is decoded
        loader = wdsr.make_loader(wdsr.SRDataset(str(ds), on_error="fail", **KW), num_workers=2)
        with pytest.raises(wdsr.SampleError) as exc:  # re-raised by torch from the worker's message, type kept
            _keys(loader)
        text = str(exc.value)
        assert (
            "SampleError" in repr(exc.value) + text
            and "shard-00000" in text
            and "'p1'" in text
            and "8-bit grey" in text
            and "8-bit RGB" in text
        ), text
    skip = wdsr.SRDataset(str(ds), on_error="skip", **KW)
    loader = wdsr.make_loader(skip, num_workers=2 if recorded else 0)
    batches = list(loader)  # stacks: a batch never mixes kinds
    assert all(lr.shape[1] == hr.shape[1] for lr, hr, _ in batches)
    channels = {lr.shape[1] for lr, _, _ in batches}
    keys = [k for _, _, ks in batches for k in ks]
    assert skip.stats.totals()["skipped"] >= 1 and len(channels) == 1
    if recorded:
        assert channels == {3} and "p1" not in keys and skip.stats.totals()["skipped"] == 1
    else:  # an old manifest: the first sample decoded fixes the kind (here, in the one process)
        assert ("p1" in keys) == (channels == {1})


def test_a_failed_pass_ends_its_persistent_workers_at_once_and_the_next_pass_starts_fresh(kinds, tmp_path):
    """Left to garbage collection with the traceback that held them, the workers of a failed pass
    each waited out torch's 5 s join timeout (their queues finalized first): 20 s of a test run."""
    ds = tmp_path / "ds"
    shutil.copytree(kinds["mixed"], ds)
    _record_kind(ds, 3, 8)
    loader = wdsr.make_loader(wdsr.SRDataset(str(ds), on_error="fail", **KW), num_workers=2)
    assert loader.persistent_workers
    before = set(descendants(os.getpid()))  # what earlier tests left (resource trackers, ...)
    for _ in range(2):  # the second pass has workers of its own, and fails the same way
        with pytest.raises(wdsr.SampleError, match="'p1'"):
            _keys(loader)
        assert not set(descendants(os.getpid())) - before  # joined: no worker left to collect


CYCLE_CHILD = """
import gc, sys
import torch.utils.data._utils
import wdsr

# torch's join timeout, 5 s, raised: collected the old way, this child hangs instead of ending late
torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL = 3600.0
KW = dict(scale=2, patch_size=32, patches_per_image=1, batch_size=2, shuffle_buffer=0, seed=3)


def cycle():
    loader = wdsr.make_loader(wdsr.SRDataset(sys.argv[1], **KW), num_workers=2)
    assert len(list(loader)) > 0
    workers = list(loader._iterator._workers)
    try:
        raise ValueError("held")
    except ValueError as exc:
        held = exc  # this frame -> held -> its traceback -> this frame, which names the loader
    return workers


gc.disable()
workers = cycle()
assert all(w.exitcode is None for w in workers)  # persistent, and the loader not collected yet
gc.collect()
print([w.exitcode for w in workers])
"""


def test_a_loader_collected_in_a_reference_cycle_ends_its_workers_cleanly(kinds):
    """A loader that a traceback's frame holds is collected by the cycle collector, which could
    finalize the workers' queues before torch's ``__del__`` used them: each worker then waited out
    the join timeout (5 s: a pause at a random point of the trainer). The timeout stops the hang."""
    done = subprocess.run(
        [sys.executable, "-c", CYCLE_CHILD, str(kinds["rgb"])],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "[0, 0]"


def test_a_mix_of_recorded_kinds_is_refused_up_front(kinds):
    rgb, grey, rgb16 = kinds["rgb"], kinds["grey"], kinds["rgb16"]
    _record_kind(rgb, 3, 8)
    _record_kind(grey, 1, 8)
    _record_kind(rgb16, 3, 16)
    for other, kind in ((grey, "8-bit grey"), (rgb16, "16-bit RGB")):
        with pytest.raises(ValueError, match="different kinds") as exc:
            wdsr.SRDataset([str(rgb), str(other)], **KW)
        assert str(rgb) in str(exc.value) and str(other) in str(exc.value)
        assert "8-bit RGB" in str(exc.value) and kind in str(exc.value)
    ok = wdsr.SRDataset([str(rgb), str(kinds["rgb2"])], **KW)  # same kind (one of them unrecorded): fine
    assert len(list(wdsr.make_loader(ok, num_workers=0))) == len(ok)


def test_an_old_grey_dataset_in_a_recorded_rgb_mix_is_checked_against_the_mix(kinds, tmp_path):
    grey = tmp_path / "grey"
    shutil.copytree(kinds["grey"], grey)
    _record_kind(grey, None, None)
    _record_kind(kinds["rgb"], 3, 8)
    with pytest.raises(wdsr.SampleError, match="8-bit grey, but the mix of 2 datasets is 8-bit RGB"):
        list(wdsr.make_loader(wdsr.SRDataset([str(kinds["rgb"]), str(grey)], on_error="fail", **KW), num_workers=0))
    mix = wdsr.SRDataset([str(kinds["rgb"]), str(grey)], on_error="skip", **{**KW, "batch_size": 1})
    got = list(wdsr.make_loader(mix, num_workers=0))
    assert {lr.shape[1] for lr, _, _ in got} == {3} and mix.stats.totals()["skipped"] == 4


# ---- a mix's arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "arg, value, words",
    [
        ("epoch_samples", 2.5, "must be an int"),
        ("epoch_samples", True, "must be an int"),
        ("epoch_samples", "10", "must be an int"),
        ("epoch_samples", 0, "must be in [1,"),
        ("epoch_samples", -5, "must be in [1,"),
        ("epoch_samples", 10**30, "must be in [1,"),
        ("weights", ["1", 2], "finite non-negative numbers"),
        ("weights", [float("inf"), 1], "finite non-negative numbers"),
        ("weights", [float("nan"), 1], "finite non-negative numbers"),
        ("weights", [10**400, 1], "finite non-negative numbers"),
        ("weights", [True, 1], "finite non-negative numbers"),
        ("weights", [-1, 2], "finite non-negative numbers"),
        ("weights", [1e308, 1e308], "finite sum above 0"),
        ("weights", [0, 0.0], "finite sum above 0"),
        ("weights", [1, 2, 3], "one number per dataset"),
        ("weights", "12", "a list of numbers"),
        ("weights", 5, "a list of numbers"),
        ("weights", {1: 2, 3: 4}, "a list of numbers"),
    ],
)
def test_bad_mix_arguments_are_one_clear_value_error(kinds, arg, value, words):
    from shardmaker.errors import brief

    with pytest.raises(ValueError) as exc:
        wdsr.SRDataset([str(kinds["rgb"]), str(kinds["rgb2"])], **{arg: value}, **KW)
    text = str(exc.value)
    assert text.startswith(arg) and words in text and brief(value) in text and len(text) < 300, text


HUGE = """
import resource, sys
import wdsr
cap = (int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmSize:"))) // 1024 + int(sys.argv[3])) << 20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
for n in (10**12, 2**40, 10**30, 2**40 + 1):
    try:
        wdsr.SRDataset(sys.argv[1:3], weights=[1, 1], epoch_samples=n, scale=2, patch_size=32)
        print(n, "accepted")
    except ValueError as exc:
        print(n, "ValueError", str(exc)[:300])
"""


def test_a_huge_epoch_is_refused_before_it_is_laid_out(kinds):
    """``epoch_samples`` up to 2**40 passes the type check; what the epoch's layout would hold in
    memory (rows per shard per pass) is counted first and refused, within a memory cap."""
    proc = run_capped(HUGE, str(kinds["rgb"]), str(kinds["rgb2"]), headroom_mb=256)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and all(" ValueError epoch_samples" in line for line in lines), lines
    assert "shard segments per epoch, over the limit" in lines[0] and "must be in [1," in lines[2]


def test_a_weighted_mix_keeps_its_counts_exact_and_epoch_samples_needs_no_weights(kinds):
    a, b = str(kinds["rgb"]), str(kinds["rgb2"])
    assert wdsr.SRDataset([a, b], epoch_samples=7, **KW).mix.counts == (4, 3)  # by size without weights (was ignored)
    ds = wdsr.SRDataset([a, b], weights=[0.1, 0.2], epoch_samples=3000, **KW)  # 0.1 and 0.2 as written
    assert ds.mix.counts == (1000, 2000)
    assert len(ds.train_plan(0, 1, 1).slot(0)) > 0


# ---- the same dataset twice ----------------------------------------------------------------------------
def test_the_same_dataset_under_two_names_is_refused(kinds, tmp_path):
    a, b = str(kinds["rgb"]), str(kinds["rgb2"])
    assert wdsr.SRDataset([f"file://{a}", b], **KW).mix.counts == (4, 4)  # a file:// URL is a folder like any
    link = tmp_path / "link"
    link.symlink_to(a, target_is_directory=True)
    for twice in ([f"file://{a}", b, a], [a, f"{a}//"], [str(link), a], [f"{tmp_path}/../{tmp_path.name}/link", a]):
        with pytest.raises(ValueError, match="given twice"):
            wdsr.SRDataset(twice, **KW)
    with pytest.raises(ValueError, match=r"datasets 0 \('file://.*'\) and 2 \('/.*'\) are the same folder"):
        wdsr.SRDataset([f"file://{a}", b, a], **KW)
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    with pytest.raises(ValueError, match=r"the same dataset \(identical manifests\)"):
        wdsr.SRDataset([a, b, str(copy)], **KW)
