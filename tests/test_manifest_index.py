"""The column index beside a manifest (``manifest.json.idx``): written by every manifest writer,
used by ``load(compact=True)`` only when it names the manifest beside it, checked like the manifest,
shared by DataLoader workers (mapped again, never copied), and invisible downstream: the same
entries, digest and batches as the JSON."""

from __future__ import annotations

import hashlib
import pickle
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardmaker import storage
from shardmaker.format import colindex, colread
from shardmaker.format import manifest as mf
from shardmaker.format.loading import load
from tests.helpers import S3_BUCKET, run_epochs, same_batches, sm

IDX = "manifest.json.idx"


def _manifest(shards: int = 5, members: bool = False, tiles: bool = True) -> mf.Manifest:
    """A valid manifest made in memory: varied shard sizes, a shard without probe, one tiled shard."""
    infos = []
    for s in range(shards):
        n = 3 + s
        offs = [i * 1024 for i in range(n)]
        cols = None
        if members:
            offs = [512 + i * 2048 for i in range(n)]
            cols = {
                "jpg": mf.MemberColumns(np.array(offs), np.full(n, 1024), np.arange(n, dtype=np.uint64) + (1 << 63)),
                "x4.jpg": mf.MemberColumns(np.array(offs) + 1024, np.full(n, 512), np.arange(n, dtype=np.uint64)),
            }
        infos.append(
            mf.ShardInfo(
                f"shard-{s:06d}.tar",
                n,
                offs[-1] + 4096,
                hashlib.sha256(b"%d" % s).hexdigest(),
                [f"a.b/{s}/k{i}" if members else f"a/{s}/k{i}" for i in range(n)],
                offs,
                [[100 + i, 50 + s] for i in range(n)],
                probe=None if s == 1 else hashlib.sha256(b"p%d" % s).hexdigest(),
                members=cols,
                tiles=[0, 256] + [0] * (n - 2) if tiles and s == 2 and not members else None,
            )
        )
    if members:
        names = mf.MemberNames("jpg", {4: "x4.jpg"})
        return mf.Manifest("jpg", [4], "provided", infos, {"tool": "test"}, members=names, channels=3, bit_depth=8)
    return mf.Manifest("png", [2, 4], "matlab", infos, {"fingerprint": "f"}, channels=3, bit_depth=8)


def _write(tmp_path: Path, m: mf.Manifest) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    colindex.write_manifest(fsspec.filesystem("file"), str(tmp_path / "manifest.json"), m)
    return tmp_path


def _same(a: mf.Manifest, b: mf.Manifest) -> None:
    """Entry by entry, index by index: what the reader, the plan and the dataset use."""
    assert (a.samples, a.bytes, a.digest, len(a.shards)) == (b.samples, b.bytes, b.digest, len(b.shards))
    assert (a.codec, a.scales, a.lr_method, a.build, a.members, a.channels, a.bit_depth) == (
        b.codec,
        b.scales,
        b.lr_method,
        b.build,
        b.members,
        b.channels,
        b.bit_depth,
    )
    for x, y in zip(a.shards, b.shards, strict=True):
        assert (x.name, x.samples, x.bytes, x.sha256, x.probe) == (y.name, y.samples, y.bytes, y.sha256, y.probe)
        assert list(x.keys) == list(y.keys) and x.keys[-1] == y.keys[-1] and x.keys[1:3] == y.keys[1:3]
        assert [int(o) for o in x.offsets] == [int(o) for o in y.offsets]
        assert [[int(v) for v in x.hr_sizes[i]] for i in range(x.samples)] == [list(map(int, wh)) for wh in y.hr_sizes]
        assert [x.tiled(i) for i in range(x.samples)] == [y.tiled(i) for i in range(y.samples)]
        assert (x.tiles is None) == (y.tiles is None) and (x.members is None) == (y.members is None)
        for name, cols in (x.members or {}).items():
            assert cols.to_json() == y.members[name].to_json()  # type: ignore[index]
    assert a.dumps() == b.dumps()


@pytest.mark.parametrize("members", [False, True])
def test_the_index_gives_what_the_json_gives(tmp_path, members):
    ds = _write(tmp_path, _manifest(members=members))
    m = load(str(ds), compact=True)
    assert isinstance(m.shards, colread.ShardTable)  # read from the index, not the JSON
    raw = (ds / "manifest.json").read_bytes()
    _same(m, mf.parse(raw, "json", compact=True))
    assert m.digest == hashlib.sha256(raw).hexdigest() and m.dumps() == raw
    assert m.shards[-1].name == m.shards[len(m.shards) - 1].name and len(m.shards[1:3]) == 2
    with pytest.raises(IndexError):
        m.shards[len(m.shards)]
    # lists, for the callers that edit or verify a manifest, still come from the JSON
    assert isinstance(load(str(ds)).shards, list)


def test_every_writer_writes_it(capsys, tmp_path, hr_tree):
    out = tmp_path / "ds"
    assert sm(capsys, "build", hr_tree, out, "--scale", "2", "--max-samples", "2")[0] == 0
    assert isinstance(load(str(out), compact=True).shards, colread.ShardTable)
    parts = tmp_path / "parts"
    for i in range(2):
        assert sm(capsys, "build", hr_tree, parts, "--scale", "2", "--part", f"{i}/2")[0] == 0
    assert not list(parts.glob("*.idx"))  # part manifests are read whole by merge: no index
    assert sm(capsys, "merge", parts)[0] == 0
    m = load(str(parts), compact=True)
    assert isinstance(m.shards, colread.ShardTable) and m.samples == 6
    _same(m, mf.parse((parts / "manifest.json").read_bytes(), "json", compact=True))


def test_shardmaker_index_writes_it(capsys, tmp_path, photo_shards):
    folder = tmp_path / "foreign"
    shutil.copytree(photo_shards, folder)
    for p in folder.glob("manifest.json*"):
        p.unlink()
    shards = str(folder / "shard-{000000..000003}.tar")
    rc, _, err = sm(capsys, "index", shards, "--hr", "hr.png", "--lr", "2:lr_x2.png", "--lr", "4:lr_x4.png")
    assert rc == 0, err
    m = load(str(folder), compact=True)
    assert isinstance(m.shards, colread.ShardTable) and m.members is not None and m.samples == 10
    _same(m, mf.parse((folder / "manifest.json").read_bytes(), "json", compact=True))


def test_a_stale_index_is_never_used(tmp_path, caplog):
    ds = _write(tmp_path, _manifest())
    # another manifest written by a tool that writes no index: another size
    other = _manifest(shards=4)
    storage.write_atomic(fsspec.filesystem("file"), str(ds / "manifest.json"), other.dumps())
    m = load(str(ds), compact=True)
    assert not isinstance(m.shards, colread.ShardTable) and m.samples == other.samples
    assert "made from another" in caplog.text
    # the same size, one digit changed in the first MiB (a shard's sha256): the probe tells them apart
    raw = (ds / "manifest.json").read_bytes()
    (ds / IDX).write_bytes(colindex.encode(other, raw))
    assert isinstance(load(str(ds), compact=True).shards, colread.ShardTable)
    sha = other.shards[0].sha256
    edited = raw.replace(sha.encode(), (("1" if sha[0] != "1" else "2") + sha[1:]).encode())
    assert len(edited) == len(raw) and edited != raw
    (ds / "manifest.json").write_bytes(edited)
    m = load(str(ds), compact=True)
    assert not isinstance(m.shards, colread.ShardTable) and m.shards[0].sha256 != sha


def _tampered(tmp_path: Path, edit, m: mf.Manifest | None = None) -> Path:
    """The index of a valid manifest, with its columns (or top-level fields) edited by ``edit``."""
    m = m or _manifest()
    ds = _write(tmp_path, m)
    cols, top = colindex.columns_of(m), m.top_json()
    edit(cols, top)
    data = (ds / "manifest.json").read_bytes()
    (ds / IDX).write_bytes(colindex.encode_columns(cols, top, m.members.names() if m.members else [], data))
    return ds


def _set(name, i, v):
    def edit(cols, top):
        a = cols[name].copy()
        a[i] = v
        cols[name] = a

    return edit


HOSTILE = {
    "an offset off the 512-byte grid": (_set("offsets", 4, 1000), "offsets[1]"),
    "an offset beyond its shard": (_set("offsets", 2, 1 << 30), "offsets[2]"),
    "offsets that do not increase": (_set("offsets", 5, 0), "offsets[2]"),
    "a first offset that is not 0": (_set("offsets", 3, 512), "shards[1] (shard-000001.tar).offsets[0]"),
    "an HR side of 0": (_set("hr_sizes", (7, 1), 0), "hr_sizes[0]"),
    "a tile side out of range": (_set("tiles", 10, 7), "tiles[3]"),
    "a key boundary past the keys": (_set("key_at", -1, 10**6), "key_at"),
    "an empty key": (_set("key_at", 3, 0), "keys"),
    "a shard of 0 bytes": (_set("shard_bytes", 2, 0), "shards[2].bytes"),
    "a shard of no sample": (_set("starts", 2, 3), "starts"),
    "a shard name with a slash": (_set("names", 5, ord("/")), "shards[0].name"),
    "totals that do not add up": (lambda c, t: t.update(samples=t["samples"] + 1), "samples"),
    "a codec the format does not know": (lambda c, t: t.update(codec="bmp"), "codec"),
    "a column of the wrong length": (lambda c, t: c.update(offsets=c["offsets"][:-1]), "columns.offsets"),
    "a column of another dtype": (lambda c, t: c.update(offsets=c["offsets"].astype(np.int16)), "columns.offsets"),
    "an unknown column": (lambda c, t: c.update(extra=np.zeros(3, np.uint8)), "unknown columns"),
    "two shards of one name": (
        lambda c, t: c.update(names=np.frombuffer(bytes(c["names"]).replace(b"shard-000001", b"shard-000000"), np.uint8)),
        "listed twice",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_index_is_refused_naming_the_field(tmp_path, case):
    edit, field = HOSTILE[case]
    ds = _tampered(tmp_path, edit)
    with pytest.raises(mf.ManifestError) as e:
        load(str(ds), compact=True)
    assert field in str(e.value) and IDX in str(e.value), str(e.value)


def test_a_foreign_member_outside_its_shard_is_refused(tmp_path):
    m = _manifest(members=True)
    ds = _tampered(tmp_path, _set("m1.bytes", 0, 1 << 20), m)
    with pytest.raises(mf.ManifestError, match=r"members\.x4\.jpg\[0\].*inside the shard"):
        load(str(ds), compact=True)
    ds = _tampered(tmp_path / "b", _set("m0.offsets", 1, 512 + 2048 + 512), m)
    with pytest.raises(mf.ManifestError, match=r"offset must be that of its first member"):
        load(str(ds), compact=True)


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda b: b"NOTANIDX" + b[8:], "magic"),
        (lambda b: b[:8] + (2).to_bytes(4, "little") + b[12:], "version 2"),
        (lambda b: b[:12] + (len(b)).to_bytes(4, "little") + b[16:], "longer than the file"),
        (lambda b: b[:16] + b"}" + b[17:], "not valid JSON"),
        (lambda b: b[: len(b) // 2], "inside the file"),
        (lambda b: b"", "magic"),
    ],
)
def test_a_damaged_index_file_is_refused(tmp_path, damage, reason):
    ds = _write(tmp_path, _manifest())
    raw = (ds / IDX).read_bytes()
    (ds / IDX).write_bytes(damage(raw))
    with pytest.raises(mf.ManifestError, match=reason):
        load(str(ds), compact=True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), min_size=1, max_size=4), st.integers(0, 1 << 20))
def test_a_fuzzed_index_ends_in_a_manifest_or_a_manifest_error(tmp_path_factory, flips, cut):
    """Byte flips and truncations anywhere (header, counts, columns): every entry and key can then be
    read, or the open or the read is a ManifestError; never another error, never a read outside."""
    ds = tmp_path_factory.mktemp("fuzz")
    _write(ds, _manifest(members=cut % 2 == 1))
    raw = bytearray((ds / IDX).read_bytes())
    for at, x in flips:
        raw[at % len(raw)] ^= x
    (ds / IDX).write_bytes(bytes(raw[: len(raw) - cut % 97]))
    try:
        m = load(str(ds), compact=True)
        for sh in m.shards:
            list(sh.keys), [int(o) for o in sh.offsets], [sh.tiled(i) for i in range(sh.samples)]
            assert all(0 <= int(o) < sh.bytes for o in sh.offsets)
    except mf.ManifestError:
        pass


def test_a_bad_key_is_refused_when_it_is_read(tmp_path):
    def backslash(cols, top):
        keys = bytes(cols["keys"])
        cols["keys"] = np.frombuffer(keys.replace(b"a/3/k2", b"a\\3/k2"), np.uint8)

    m = load(str(_tampered(tmp_path, backslash)), compact=True)
    sh = m.shards[3]
    assert sh.keys[1] == "a/3/k1"
    with pytest.raises(mf.ManifestError, match=r"shards\[3\] \(shard-000003.tar\)\.keys\[2\].*backslash"):
        sh.keys[2]
    with pytest.raises(mf.ManifestError, match="backslash"):
        list(sh.keys)


class _Keys(torch.utils.data.Dataset):
    """What a DataLoader worker reads from the manifest it was given: a key and an offset per sample."""

    def __init__(self, m: mf.Manifest) -> None:
        self.m = m

    def __len__(self) -> int:
        return self.m.samples

    def __getitem__(self, i: int) -> tuple[str, int, bool]:
        for sh in self.m.shards:
            if i < sh.samples:
                return sh.keys[i], int(sh.offsets[i]), isinstance(self.m.shards, colread.ShardTable)
            i -= sh.samples
        raise IndexError(i)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_map_the_index_not_a_copy(tmp_path, context):
    big = _manifest(shards=40)
    ds = _write(tmp_path, big)
    m = load(str(ds), compact=True)
    # a spawned worker gets where the index is, not its columns
    assert len(pickle.dumps(m.shards)) < 1000 < len(pickle.dumps(mf.parse(big.dumps(), "x", compact=True).shards))
    _same(pickle.loads(pickle.dumps(m)), m)
    loader = torch.utils.data.DataLoader(_Keys(m), batch_size=None, num_workers=2, multiprocessing_context=context)
    got = list(loader)
    want = [(k, int(o)) for sh in big.shards for k, o in zip(sh.keys, sh.offsets, strict=True)]
    assert [(k, o) for k, o, _ in got] == want and all(indexed for _, _, indexed in got)


def test_a_worker_refuses_an_index_replaced_since_the_open(tmp_path):
    ds = _write(tmp_path, _manifest())
    m = load(str(ds), compact=True)
    _write(tmp_path, _manifest(shards=3))
    with pytest.raises(mf.ManifestError, match="changed since the dataset was opened"):
        pickle.loads(pickle.dumps(m.shards))


def test_batches_are_the_same_with_and_without_the_index(tmp_path, photo_shards):
    with_idx, without = tmp_path / "with", tmp_path / "without"
    shutil.copytree(photo_shards, with_idx)
    shutil.copytree(photo_shards, without)
    (without / IDX).unlink()
    assert isinstance(load(str(with_idx), compact=True).shards, colread.ShardTable)
    a, _ = run_epochs(str(with_idx), epochs=1, workers=2)
    b, _ = run_epochs(str(without), epochs=1, workers=2)
    assert a and same_batches(a, b)


def test_an_index_on_s3_is_fetched_and_used(s3, tmp_path):
    url = f"s3://{S3_BUCKET}/colindex"
    fs, root = storage.open_dir(url)
    fs.makedirs(root, exist_ok=True)
    big = _manifest(members=True)
    colindex.write_manifest(fs, storage.join(root, "manifest.json"), big)
    m = load(url, compact=True)
    assert isinstance(m.shards, colread.ShardTable)
    _same(m, mf.parse(big.dumps(), "json", compact=True))
    _same(pickle.loads(pickle.dumps(m)), m)  # a spawned worker fetches it again


def test_too_small_and_sizes_from_the_index_equal_the_jsons(tmp_path):
    """SRDataset's checks over every sample (the too-small count, the plan's shard sizes) read the
    index's whole columns; they give what the entries of the JSON give."""
    import numpy as np

    import wdsr
    from shardmaker import format as fmt
    from tests.helpers import build_shards, photos, save
    from wdsr.pipeline.patches import too_small

    src = tmp_path / "src"
    for i, p in enumerate(photos()):
        save(src / f"p{i}.png", np.ascontiguousarray(p[: 200 + 40 * i, : 300]))
    ds = build_shards(src, tmp_path / "ds", "--scale", "4", "--max-samples", "1")
    indexed = fmt.load(str(ds), compact=True)
    plain = fmt.load(str(ds), compact=True, index=False)
    assert hasattr(indexed.shards, "hr_sizes") and not hasattr(plain.shards, "hr_sizes")
    for patch in (48, 216, 256, 400):
        assert too_small(indexed.shards, 4, patch) == too_small(plain.shards, 4, patch), patch
    a = wdsr.SRDataset(str(ds), scale=4, patch_size=48)
    assert a._sizes() == [sh.samples for sh in plain.shards] == [1, 1, 1, 1]
