"""``shardmaker build --lr DIR --lr-pattern``: LR files named as datasets ship them (RCAN, Urban100,
``{stem}_LR``) pair like DIV2K-named ones, with real Set5 images and their MATLAB-made x4 LR."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from shardmaker.builder import BuildConfig
from shardmaker.builder.run import fingerprint
from shardmaker.builder.sources import lr_name_pattern, scan_sources
from shardmaker.format import tario
from tests.helpers import needs_refdata, photos, save, sm

NAMES = ("bird", "butterfly", "woman")  # the small ones: 288x288, 256x256, 228x344


def _set5(refdata: Path, tmp_path: Path, lr_name: str, scale: int = 4) -> tuple[Path, Path]:
    """HR and x``scale`` LR copies, the LR files named ``lr_name.format(stem=..., s=...)`` + .png."""
    hr, lr = tmp_path / "hr", tmp_path / f"lr-{lr_name.format(stem='', s='')}"
    hr.mkdir(exist_ok=True)
    lr.mkdir()
    for n in NAMES:
        shutil.copy(refdata / "set5/HR" / f"{n}.png", hr / f"{n}.png")
        shutil.copy(refdata / f"set5/LR_bicubic/X{scale}/{n}x{scale}.png", lr / f"{lr_name.format(stem=n, s=scale)}.png")
    return hr, lr


def _members(ds: Path) -> dict[str, dict[str, bytes]]:
    """Every sample's members by key, in shard order; ``lr_sources`` (the LR file names) left out of the json."""
    out: dict[str, dict[str, bytes]] = {}
    for shard in sorted(ds.glob("shard-*.tar")):
        with open(shard, "rb") as f:
            for key, _, members in tario.iter_samples(f):
                meta = json.loads(members["json"])
                del meta["lr_sources"]
                out[key] = {**members, "json": json.dumps(meta, sort_keys=True).encode()}
    return out


@needs_refdata
def test_rcan_urban100_and_lr_suffix_names_pair_like_div2k_names(capsys, tmp_path, refdata):
    hr, lr = _set5(refdata, tmp_path, "{stem}x{s}")  # what Set5's own folders and DIV2K ship
    rc, _, err = sm(capsys, "build", hr, tmp_path / "default", "--lr", lr, "--workers", "1")
    assert rc == 0, err
    want = _members(tmp_path / "default")
    assert sorted(want) == sorted(NAMES)
    for pattern in ("{stem}_LRBI_x{s}", "{stem}_SRF_{s}_LR", "{stem}_LR"):
        _, lr2 = _set5(refdata, tmp_path, pattern)
        out = tmp_path / pattern.format(stem="ds", s="")
        rc, _, err = sm(capsys, "build", hr, out, "--lr", lr2, "--lr-pattern", pattern, "--workers", "1")
        assert rc == 0, (pattern, err)
        assert _members(out) == want, pattern  # same keys, order, pixels, sizes, hashes
        meta = json.loads(next(iter(_members_raw(out).values())))
        assert meta["lr_sources"]["4"] == f"{pattern.format(stem=meta['key'], s=4)}.png"


def _members_raw(ds: Path) -> dict[str, bytes]:
    with open(sorted(ds.glob("shard-*.tar"))[0], "rb") as f:
        return {key: members["json"] for key, _, members in tario.iter_samples(f)}


@needs_refdata
def test_lr_suffix_is_refused_without_a_pattern_and_scale_must_agree(capsys, tmp_path, refdata):
    hr, lr = _set5(refdata, tmp_path, "{stem}_LR")
    rc, _, err = sm(capsys, "build", hr, tmp_path / "a", "--lr", lr)
    assert rc == 2 and "bird_LR.png" in err and "has no HR image" in err and len(err.splitlines()) == 1

    _, lr3 = _set5(refdata, tmp_path, "{stem}_LRBI_x3")  # x4 images named x3
    rc, _, err = sm(capsys, "build", hr, tmp_path / "b", "--lr", lr3, "--lr-pattern", "{stem}_LRBI_x{s}")
    assert rc == 2 and "name says x3 but the size ratio is 4" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "b").exists()

    rc, _, err = sm(capsys, "build", hr, tmp_path / "c", "--lr", lr, "--lr-pattern", "{stem}_LRBI_x{s}")
    assert rc == 2 and "named by --lr-pattern '{stem}_LRBI_x{s}'" in err


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("LRBI_x{s}", "must contain {stem}"),
        ("{stem}_x{scale}", "only the fields {stem} and {s}"),
        ("{stem}_x{s:02d}", "only the fields {stem} and {s}"),
        ("{stem}_x{s!r}", "only the fields {stem} and {s}"),
        ("{stem}_x{", "--lr-pattern '{stem}_x{'"),
        ("{stem}_LR.png", "without its extension"),
    ],
)
def test_bad_patterns_are_one_line_exit_2(capsys, tmp_path, pattern, why):
    (tmp_path / "hr").mkdir()
    rc, _, err = sm(capsys, "build", tmp_path / "hr", tmp_path / "out", "--lr", tmp_path / "hr", "--lr-pattern", pattern)
    assert rc == 2 and why in err and len(err.splitlines()) == 1 and "Traceback" not in err
    with pytest.raises(ValueError, match="--lr-pattern"):
        lr_name_pattern(pattern)


def test_a_pattern_needs_lr_folders(capsys, tmp_path):
    rc, _, err = sm(capsys, "build", tmp_path, tmp_path / "out", "--lr-pattern", "{stem}_LR")
    assert rc == 2 and "give at least one --lr" in err


@needs_refdata
def test_the_pattern_is_part_of_the_fingerprint(capsys, tmp_path, refdata):
    hr, lr = _set5(refdata, tmp_path, "{stem}x{s}")
    opts = BuildConfig(hr_src=str(hr), out=str(tmp_path / "out"), lr_srcs=(str(lr),))
    pairs, _, _ = scan_sources([str(hr)], [str(lr)])
    same, _, _ = scan_sources([str(hr)], [str(lr)], lr_pattern="{stem}x{s}")
    assert same == pairs  # the default rule and this pattern pair alike...
    with_pattern = dataclasses.replace(opts, lr_pattern="{stem}x{s}")
    assert fingerprint(pairs, with_pattern) != fingerprint(pairs, opts)  # ...but a build with it is another build
    assert fingerprint(pairs, with_pattern) == fingerprint(same, dataclasses.replace(opts, lr_pattern="{stem}x{s}"))

    args = ("build", hr, tmp_path / "out", "--lr", lr, "--workers", "1", "--lr-pattern", "{stem}x{s}")
    assert sm(capsys, *args)[0] == 0
    rc, out, _ = sm(capsys, *args)  # the same command again: every shard kept
    assert rc == 0 and "(1 shards kept" in out
    rc, _, err = sm(capsys, *args[:-1], "{stem}x4")  # another pattern, same files: not taken for the same build
    assert rc == 2 and "describes a different dataset" in err


def test_stems_with_underscores_digits_and_folders_pair(capsys, tmp_path):
    """The HR stem is the whole relative name: folders, '_' and digits in it stay its own."""
    pics = photos()
    for i, rel in enumerate(("x_1/img_2", "x_1/img_22", "a/b/c_LR")):
        hr = np.ascontiguousarray(pics[i][:64, :96])
        save(tmp_path / "hr" / f"{rel}.png", hr)
        save(tmp_path / "lr" / f"{rel}_LR_x12_{4}.png", np.ascontiguousarray(hr[::4, ::4]))
    rc, _, err = sm(
        capsys, "build", tmp_path / "hr", tmp_path / "out", "--lr", tmp_path / "lr", "--lr-pattern", "{stem}_LR_x12_{s}"
    )
    assert rc == 0, err
    srcs = {k: json.loads(v)["lr_sources"]["4"] for k, v in _members_raw(tmp_path / "out").items()}
    assert srcs == {
        "x_1/img_2": "x_1/img_2_LR_x12_4.png",
        "x_1/img_22": "x_1/img_22_LR_x12_4.png",
        "a/b/c_LR": "a/b/c_LR_LR_x12_4.png",
    }
