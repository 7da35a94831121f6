"""The per-sample header ``{key}.json`` (shardmaker.format.header): every member the build writes
parses and encodes back to the same bytes; each broken rule is refused naming shard and key; one
digest check with one wording, whichever reader finds the mismatch; provided LR held to the
``--no-mod-crop`` rule for images and clips alike."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import wdsr
from shardmaker import format as fmt
from shardmaker.builder.clips import scan_clips
from shardmaker.builder.sample import LrMethod, SampleConfig, encode_or_skip
from shardmaker.builder.sources import scan_sources
from shardmaker.errors import InputError, OnError
from shardmaker.peek import PeekError, cat
from shardmaker.verify import verify
from tests.helpers import build_shards, mosaic, rewrite, save

SHARD = "shard-000007.tar"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Real datasets of every kind of header: generated LR (one image tiled), provided LR, region
    samples of a larger image, clip segments with provided LR."""
    root = tmp_path_factory.mktemp("headers")
    img = mosaic(300, 400)
    for i, (h, w) in enumerate([(66, 70), (64, 64), (130, 97)]):
        save(root / "hr" / f"a.b{i}.png", img[:h, :w])
        save(root / "lr" / f"a.b{i}.png", np.ascontiguousarray(img[: h // 2 : 1, : w // 2]))
    save(root / "big" / "slide.png", mosaic(1100, 600))
    for t in range(5):
        save(root / "clips" / "hr" / "c1" / f"{t:04d}.png", img[t : t + 32, t : t + 36])
        save(root / "clips" / "lr" / "c1" / f"{t:04d}.png", img[t : t + 16, t : t + 18])
    out = {
        "gen": build_shards(root / "hr", root / "gen", "--scale", "2,3"),
        "tiles": build_shards(root / "hr", root / "tiles", "--scale", "2", "--tiles", "256", "--codec", "qoi"),
        "prov": build_shards(root / "hr", root / "prov", "--lr", str(root / "lr")),
        "region": build_shards(root / "big", root / "region", "--scale", "2", "--region", "512"),
        "clips": build_shards(
            root / "clips" / "hr",
            root / "clips_ds",
            "--clips",
            "--segment",
            "3",
            "--max-span",
            "2",
            "--lr",
            str(root / "clips" / "lr"),
        ),
    }
    out["root"] = root
    return out


def _json_members(ds: Path) -> list[tuple[str, str, bytes]]:
    got = []
    for sh in fmt.load(str(ds)).shards:
        with open(ds / sh.name, "rb") as f:
            got += [(sh.name, key, bytes(members["json"])) for key, _, members in fmt.iter_samples(f)]
    return got


@pytest.mark.parametrize("kind", ["gen", "tiles", "prov", "region", "clips"])
def test_every_built_header_parses_and_encodes_to_the_same_bytes(built, kind):
    members = _json_members(built[kind])
    assert members
    for shard, key, data in members:
        header = fmt.SampleHeader.parse(data, shard, key)
        assert header.encode() == data, (kind, key)
        assert sorted(header.digests.sha256) == sorted(header.digests.xxh3_64 or {})
    headers = [fmt.SampleHeader.parse(d, s, k) for s, k, d in members]
    if kind == "tiles":
        assert all(h.tiles == 256 for h in headers)
    if kind == "region":
        assert all(h.region is not None and h.image_size == (600, 1100) for h in headers)
    if kind == "prov":
        assert all(h.lr_method == "provided" and h.lr_sources == {2: f"{h.key.replace('_', '.')}.png"} for h in headers)
    if kind == "clips":
        spans = [h.clip for h in headers]
        assert all(c is not None and c.clip == "c1" and c.clip_frames == 5 for c in spans)
        assert [c.first_frame for c in spans if c] == [0, 2] and [c.owned for c in spans if c] == [(0, 2), (2, 5)]


def _valid() -> dict:
    return {
        "key": "k/a",
        "source": "k/a.png",
        "hr_size": [66, 70],
        "scales": [2, 3],
        "bit_depth": 8,
        "channels": 3,
        "lr_method": "matlab",
        "lr_sizes": {"2": [33, 35], "3": [22, 23]},
        "hr_crop": {"2": [66, 70], "3": [66, 69]},
        "sha256": {"hr.png": "0" * 64, "lr_x2.png": "1" * 64, "lr_x3.png": "2" * 64},
        "xxh3_64": {"hr.png": "0" * 16, "lr_x2.png": "1" * 16, "lr_x3.png": "2" * 16},
    }


def _clip() -> dict:
    d = _valid() | {
        "clip": "c",
        "clip_frames": 10,
        "first_frame": 4,
        "frames": 3,
        "owned": [4, 6],
        "frame_names": ["a", "b", "c"],
    }
    return d


def _edit(base, **kw):
    d = base()
    for k, v in kw.items():
        if v is _DROP:
            del d[k]
        else:
            d[k] = v
    return json.dumps(d).encode()


_DROP = object()

BROKEN = [
    (b"{not json", "is not valid JSON"),
    (b"[1, 2]", "is not a JSON object"),
    (b"\xff\xfe", "is not valid JSON"),
    (b"[" * 100_000, "is not valid JSON"),
    (b" " * (fmt.header.MAX_HEADER_BYTES + 1), "over"),
    (_edit(_valid, sha256=_DROP, xxh3_64=_DROP), "no member digests"),
    (_edit(_valid, channels=_DROP), "channels is missing"),
    (_edit(_valid, key="k/b"), "not this sample's"),
    (_edit(_valid, bit_depth=True), "bit_depth must be 8 or 16"),
    (_edit(_valid, bit_depth=12), "bit_depth must be 8 or 16"),
    (_edit(_valid, channels=4), "channels must be 1 or 3"),
    (_edit(_valid, hr_size=[66]), "hr_size must be a list of 2 items"),
    (_edit(_valid, hr_size=[0, 70]), "hr_size[0] must be an integer in [1, 1048576]"),
    (_edit(_valid, hr_size=[66.0, 70]), "hr_size[0] must be an integer"),
    (_edit(_valid, scales=[3, 2]), "scales must be increasing integers in [2, 16]"),
    (_edit(_valid, scales=[2, 17], lr_sizes={"2": [33, 35], "17": [3, 4]}), "scales must be increasing integers in [2, 16]"),
    (_edit(_valid, lr_method="bilinear"), "lr_method must be one of"),
    (_edit(_valid, lr_method="none"), "scales must be empty exactly when lr_method is none"),
    (_edit(_valid, lr_sizes={"2": [33, 35]}), "lr_sizes must have one size per scale"),
    (_edit(_valid, lr_sizes={"02": [33, 35], "3": [22, 23]}), "not a scale"),
    (_edit(_valid, hr_crop={"2": [66, 70], "3": [66, 70]}), "hr_crop must be s x lr_sizes"),
    (_edit(_valid, sha256={"hr.png": "A" * 64}), "sha256 must map member names to hex digests"),
    (_edit(_valid, xxh3_64=["x"]), "xxh3_64 must be an object of member digests"),
    (_edit(_valid, tiles=7), "tiles must be an integer in"),
    (_edit(_valid, tiles=256), "tiles must be a multiple of every scale [2, 3]"),
    (_edit(_valid, region={"y": 0, "x": 0, "h": 8}, image_size=[100, 100]), "region must be {y, x, h, w}"),
    (_edit(_valid, region={"y": 0, "x": 0, "h": 8, "w": 8}), "region and image_size come together"),
    (_edit(_valid, lr_sources={"2": "a.png"}), "lr_sources must name one LR source per scale"),
    (_edit(_valid, extra=1), "'extra' is not a field of the sample header"),
    (_edit(_clip, owned=_DROP), "owned is missing"),
    (_edit(_clip, frames=1001, clip_frames=5000, frame_names=["a"] * 1001), "frames must be an integer in [1, 1000]"),
    (_edit(_clip, frames=0), "frames must be an integer in [1, 10]"),
    (_edit(_clip, first_frame=8), "first_frame must be an integer in [0, 7]"),
    (_edit(_clip, clip_frames=1 << 23), "clip_frames must be an integer in [1, 4194304]"),
    (_edit(_clip, owned=[3, 6]), "owned starts [3, 6) are not inside its frames [4, 7)"),
    (_edit(_clip, owned=[4, True]), "owned must be [first, stop) window starts"),
    (_edit(_clip, frame_names=["a"]), "frame_names must be 3 names"),
    (_edit(_clip, clip=""), "clip must be the clip's key"),
]


def test_a_valid_header_parses():
    for base in (_valid, _clip):
        data = _edit(base)
        header = fmt.SampleHeader.parse(data, SHARD, "k/a")
        assert json.loads(header.encode()) == json.loads(data)
        assert header.hr_crop == {2: (66, 70), 3: (66, 69)}


@pytest.mark.parametrize("data, reason", BROKEN, ids=range(len(BROKEN)))
def test_a_broken_header_is_refused_naming_shard_and_key(data, reason):
    with pytest.raises(fmt.SampleHeaderError) as exc:
        fmt.SampleHeader.parse(data, SHARD, "k/a")
    msg = str(exc.value)
    assert msg.startswith(f"{SHARD} key 'k/a': ") and reason in msg and len(msg) < 400, msg
    assert exc.value.shard == SHARD and exc.value.key == "k/a"


def test_the_one_digest_check_and_its_wording():
    members = {"hr.png": b"hr bytes", "lr_x2.png": b"lr bytes"}
    digests = fmt.Digests.of(members)
    for algo in ("xxh3_64", "sha256"):
        fmt.check_digests(digests, members, list(members), algo, SHARD, "k")
        with pytest.raises(fmt.SampleHeaderError) as exc:
            fmt.check_digests(digests, {**members, "lr_x2.png": b"lr bytez"}, list(members), algo, SHARD, "k")
        assert str(exc.value) == f"{SHARD} key 'k': lr_x2.png does not match its {algo} in k.json (corrupt shard)"
    old = fmt.Digests(digests.sha256)  # a build before xxh3_64 was recorded: checked by sha256
    with pytest.raises(fmt.SampleHeaderError, match="lr_x2.png does not match its sha256 in k.json"):
        fmt.check_digests(old, {**members, "lr_x2.png": b"lr bytez"}, list(members), "xxh3_64", SHARD, "k")


def test_every_reader_reports_a_corrupt_member_in_the_same_words(built, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(built["prov"], ds)
    key = fmt.load(str(ds)).shards[0].keys[0]

    def flip(name: str, data: bytes):
        if name == f"{key}.lr_x2.png":
            data = data[:-20] + bytes([data[-20] ^ 1]) + data[-19:]  # inside the IEND-free tail: a CRC, not a header
        return name, data

    rewrite(ds, 0, flip)
    words = f"lr_x2.png does not match its sha256 in {key}.json (corrupt shard)"
    assert any(words in p and repr(key) in p for p in verify(str(ds), deep=True, progress=False))
    with pytest.raises(PeekError) as exc:
        cat(str(ds), key, tmp_path / "out")
    assert words in str(exc.value)
    sr = wdsr.SRDataset(str(ds), scale=2, patch_size=16, patches_per_image=1, batch_size=1, shuffle_buffer=0, verify="sha256")
    with pytest.raises(wdsr.SampleError) as err:
        list(sr)
    assert words in str(err.value) and repr(key) in str(err.value)


@pytest.mark.parametrize("clips", [False, True])
def test_provided_lr_needing_a_mod_crop_is_refused_under_no_mod_crop(built, tmp_path, clips):
    """One rule for provided LR, in the worker that reads it: images and clip frames alike. The plan
    (scanned with --mod-crop) lets the pair through; the worker under --no-mod-crop refuses it,
    naming the LR file."""
    img = mosaic(100, 100)
    if clips:
        for t in range(3):
            save(tmp_path / "hr" / "c1" / f"{t:04d}.png", img[t : t + 33, :37])
            save(tmp_path / "lr" / "c1" / f"{t:04d}.png", img[t : t + 16, :18])
        pairs, _, _ = scan_clips(str(tmp_path / "hr"), [str(tmp_path / "lr")], mod_crop=True)
        bad = str(tmp_path / "lr" / "c1" / "0000.png")
    else:
        save(tmp_path / "hr" / "a.png", img[:33, :37])
        save(tmp_path / "lr" / "a.png", img[:16, :18])
        pairs, _, _ = scan_sources([str(tmp_path / "hr")], [str(tmp_path / "lr")], mod_crop=True)
        bad = str(tmp_path / "lr" / "a.png")
    cfg = SampleConfig(scales=(), lr_method=LrMethod.PROVIDED, mod_crop=False)
    with pytest.raises(InputError) as exc:
        encode_or_skip(pairs[0], cfg, OnError.FAIL)
    assert (
        exc.value.path == bad
        and "LR 18x16 does not fit HR 37x33 at scale 2 without a mod-crop (allow with --mod-crop)" in str(exc.value)
    )
    ok = encode_or_skip(pairs[0], SampleConfig(scales=(), lr_method=LrMethod.PROVIDED, mod_crop=True), OnError.FAIL)
    _, _, data = next(fmt.iter_members(io.BytesIO(ok.tar_bytes)))
    assert fmt.SampleHeader.parse(data, "-", pairs[0].key).hr_crop == {2: (36, 32)}
