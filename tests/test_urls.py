"""What WebDataset users write: brace patterns and lists of shard URLs, the manifest found beside
them or given; local, memory:// and S3 (the test SeaweedFS)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import fsspec
import pytest
from braceexpand import braceexpand
from hypothesis import given, settings
from hypothesis import strategies as st

import wdsr
from shardmaker import format as fmt

KW = dict(scale=4, patch_size=48, patches_per_image=3, batch_size=2, shuffle_buffer=8, seed=4, return_keys=True)


def _batches(ds: wdsr.SRDataset, workers: int = 0) -> list[tuple[str, tuple]]:
    out = []
    for lr, hr, keys in wdsr.make_loader(ds, num_workers=workers):
        out.append((hashlib.sha256(lr.numpy().tobytes() + hr.numpy().tobytes()).hexdigest(), tuple(keys)))
    return out


def _keys(ds_dir: str | Path, shards: list[int]) -> set[str]:
    doc = json.loads(Path(ds_dir, "manifest.json").read_text())
    return {k for i in shards for k in doc["shards"][i]["keys"]}


def test_a_brace_pattern_or_a_list_streams_those_shards(photo_shards):
    folder = str(photo_shards)
    whole = _batches(wdsr.SRDataset(folder, **KW))
    every = wdsr.SRDataset(f"{folder}/shard-{{000000..000003}}.tar", **KW)
    assert every.url == folder and _batches(every) == whole  # all four shards: the same stream
    part = wdsr.SRDataset(f"{folder}/shard-{{000001..000002}}.tar", **KW)
    assert part.manifest.samples == 6 and [s.name for s in part.manifest.shards] == ["shard-000001.tar", "shard-000002.tar"]
    got = {k for _, keys in _batches(part, 2) for k in keys}
    assert got == _keys(folder, [1, 2])
    listed = wdsr.SRDataset([f"{folder}/shard-000002.tar", f"{folder}/shard-00000{{1..1}}.tar"], **KW)
    assert _batches(listed) == _batches(part)  # a list, in any order, is the same selection
    assert part.identity != every.identity != wdsr.SRDataset(folder, **KW).identity
    # a loader state of the whole dataset does not fit a selection of it
    state = wdsr.make_loader(wdsr.SRDataset(folder, **KW), num_workers=0).state_dict()
    with pytest.raises(wdsr.LoaderStateError, match="another dataset"):
        wdsr.make_loader(part, num_workers=0).load_state_dict(state)


def test_urls_the_manifest_does_not_have_are_named(photo_shards, tmp_path):
    folder = str(photo_shards)
    with pytest.raises(ValueError, match=r"shard-000004\.tar: not listed in .*manifest\.json"):
        wdsr.SRDataset(f"{folder}/shard-{{000000..000005}}.tar", **KW)
    copy = Path(shutil.copytree(photo_shards, tmp_path / "copy"))
    (copy / "shard-000002.tar").unlink()
    with pytest.raises(FileNotFoundError, match=r"shard-000002\.tar: no such shard"):
        wdsr.SRDataset(f"{copy}/shard-{{000000..000003}}.tar", **KW)
    other = tmp_path / "elsewhere"
    other.mkdir()
    shutil.copy(photo_shards / "shard-000000.tar", other)
    with pytest.raises(ValueError, match="shards live beside its manifest"):
        wdsr.SRDataset([f"{folder}/shard-000001.tar", f"{other}/shard-000000.tar"], **KW)
    with pytest.raises(ValueError, match="given twice"):
        wdsr.SRDataset([f"{folder}/shard-000001.tar", f"{folder}/shard-00000{{1,1}}.tar"], **KW)


def test_manifest_given_by_url(photo_shards, tmp_path):
    copy = Path(shutil.copytree(photo_shards, tmp_path / "copy"))
    (copy / "manifest.json").rename(copy / "train-index.json")
    ds = wdsr.SRDataset(f"{copy}/shard-{{000000..000003}}.tar", manifest=f"{copy}/train-index.json", **KW)
    assert _batches(ds) == _batches(wdsr.SRDataset(str(photo_shards), **KW))
    assert wdsr.SRDataset(str(copy), manifest=f"{copy}/train-index.json", **KW).manifest.samples == 10
    with pytest.raises(ValueError, match="not in the dataset folder"):
        wdsr.SRDataset(str(photo_shards), manifest=f"{copy}/train-index.json", **KW)


def test_memory_filesystem_pattern(photo_shards):
    fs = fsspec.filesystem("memory")
    root = "/wdsr-urls/photos"
    for p in photo_shards.iterdir():
        fs.pipe(f"{root}/{p.name}", p.read_bytes())
    try:
        ds = wdsr.SRDataset(f"memory://{root}/shard-{{000000..000003}}.tar", **KW)
        assert _batches(ds) == _batches(wdsr.SRDataset(str(photo_shards), **KW))
        with pytest.raises(ValueError, match=r"shard-000008\.tar: not listed"):
            wdsr.SRDataset(f"memory://{root}/shard-{{000008..000009}}.tar", **KW)
    finally:
        fs.rm(root, recursive=True)


def test_s3_pattern(s3_photo_shards, photo_shards):
    part = wdsr.SRDataset(f"{s3_photo_shards}/shard-{{000001..000002}}.tar", **KW)
    local = wdsr.SRDataset(f"{photo_shards}/shard-{{000001..000002}}.tar", **KW)
    assert _batches(part, 2) == _batches(local, 2)
    with pytest.raises(ValueError, match=r"s3://.*shard-000006\.tar: not listed"):
        wdsr.SRDataset(f"{s3_photo_shards}/shard-{{000006..000007}}.tar", **KW)


# ---- brace patterns: counted first (shardmaker.format.expand_braces), expanded as braceexpand does ----
PATTERNS = [
    "shard-{000000..000127}.tar",
    "s3://bucket/ds/shard-{000000..000003}.tar",
    "a",
    "",
    "{}",
    "{a}",
    "{a,b}",
    "{,}",
    "{,,}",
    "{a,}{,b}",
    "x{1..3}y",
    "{07..10}",
    "{-05..5..3}",
    "{4..1}",
    "{2..-1}",
    "{0..10..0}",
    "{10..0..3}",
    "{1..5..-2}",
    "{a..g..2}",
    "{Z..a}",
    "{z..A}",
    "{a..A}",
    "{A..A}",
    "{a..z..-2}",
    "python{2.{5..7},3.{2,3}}",
    "{a,b}{c,d}{1..3..2}",
    "{{1..2},{a..c}}x{,y}",
    "{a,{b,{c,d}}}",
    "{x{1..2}}",
    "{{a,b}}",
    "a}b{c",
    "}{{x}",
    r"{1\{2,3}",
    r"{a,b\,c}",
    r"\\{a,b}",
    "{1..3}\n",
    "shard-{{0..9}{0..9},{{0..9}{0..9}{0..9},{x,y}{0..99}}}.tar",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_pattern_expands_exactly_as_braceexpand_does(pattern):
    ref = list(braceexpand(pattern))
    assert fmt.expand_braces(pattern) == ref
    size = fmt.count_braces(pattern)
    assert size.names == len(ref) and size.chars >= sum(map(len, ref))


@settings(max_examples=400, deadline=None, database=None)
@given(st.text(alphabet="{},.\\-0123ab", max_size=14))
def test_any_small_pattern_counts_and_expands_as_braceexpand_does(pattern):
    """Random strings of the grammar's characters: the same names, or refused where braceexpand refuses."""
    try:
        ref: list[str] | None = list(braceexpand(pattern))
    except ValueError:  # unbalanced braces
        ref = None
    if ref is None:
        with pytest.raises(fmt.PatternError, match="unbalanced braces"):
            fmt.count_braces(pattern)
        return
    assert fmt.count_braces(pattern).names == len(ref) and fmt.expand_braces(pattern) == ref


def test_patterns_above_the_limits_are_refused_in_one_line():
    with pytest.raises(fmt.PatternError, match=r"names 1,001 URLs: at most 1,000 are allowed"):
        fmt.expand_braces("s-{0..1000}.tar", limit=1000)
    assert len(fmt.expand_braces("s-{1..1000}.tar", limit=1000)) == 1000
    with pytest.raises(fmt.PatternError, match="nests braces 17 deep; at most 16"):
        fmt.expand_braces("{" * 17 + "a,b" + "}" * 17)
    with pytest.raises(fmt.PatternError, match="has 8193 characters; at most 8192"):
        fmt.expand_braces("x" * 8193)
    with pytest.raises(fmt.PatternError, match="a range with a number too long to read"):
        fmt.expand_braces("{0.." + "9" * 5000 + "}")
    with pytest.raises(fmt.PatternError, match=r"names 100,000 URLs: over 268,435,456 characters"):
        fmt.expand_braces("x" * 8000 + "{00000..99999}")  # few names, but each 8 KB long
    with pytest.raises(fmt.PatternError, match="unbalanced braces") as info:
        fmt.expand_braces("shard-{0..3.tar" + "x" * 5000)
    assert len(str(info.value)) < 200  # the pattern quoted with brief()
