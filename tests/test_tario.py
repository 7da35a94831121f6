"""Our tar writer/reader against Python's tarfile and GNU tar."""
from __future__ import annotations

import io
import shutil
import subprocess
import tarfile

import pytest

from shardmaker.format import tario


def _archive(members: list[tuple[str, bytes]]) -> bytes:
    return b"".join(tario.member_bytes(n, d) for n, d in members) + tario.END_OF_ARCHIVE


MEMBERS = [
    ("a.json", b"{}"),
    ("a.hr.png", b"x" * 700),
    ("deep/" + "n" * 120 + ".lr_x4.png", b"y" * 1025),  # needs a GNU long name
    ("b.json", b""),
]


def test_deterministic_and_read_back_with_offsets():
    data = _archive(MEMBERS)
    assert data == _archive(MEMBERS)
    got = list(tario.iter_members(io.BytesIO(data)))
    assert [(n, d) for n, _, d in got] == MEMBERS
    # each offset is where that member's first header starts: reading from there gives it first
    for name, offset, payload in got:
        first = next(tario.iter_members(io.BytesIO(data[offset:])))
        assert first[0] == name and first[2] == payload


def test_tarfile_reads_our_members_with_fixed_metadata():
    with tarfile.open(fileobj=io.BytesIO(_archive(MEMBERS))) as tf:
        infos = tf.getmembers()
        assert [i.name for i in infos] == [n for n, _ in MEMBERS]
        assert {(i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) for i in infos} == {(0, 0, 0, "", "", 0o644)}
        assert tf.extractfile(infos[2]).read() == MEMBERS[2][1]


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar not installed")
def test_gnu_tar_lists_members(tmp_path):
    path = tmp_path / "s.tar"
    path.write_bytes(_archive(MEMBERS))
    out = subprocess.run(["tar", "tf", str(path)], capture_output=True, text=True, check=True).stdout.split()
    assert out == [n for n, _ in MEMBERS]


def test_truncation_and_bad_checksum_are_detected():
    data = _archive(MEMBERS)
    with pytest.raises(tario.TarFormatError, match="truncated"):
        list(tario.iter_members(io.BytesIO(data[:600])))
    bad = bytearray(data)
    bad[10] ^= 0xFF
    with pytest.raises(tario.TarFormatError, match="checksum"):
        list(tario.iter_members(io.BytesIO(bytes(bad))))


def test_split_name_follows_webdataset():
    assert tario.split_name("dir/sub/img_1.lr_x4.png") == ("dir/sub/img_1", "lr_x4.png")
    assert tario.split_name("k.json") == ("k", "json")


class _CountingReader(io.BytesIO):
    """Counts the bytes handed out by read(), to show that unwanted members are seeked over."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.read_bytes = 0

    def read(self, n: int = -1) -> bytes:
        out = super().read(n)
        self.read_bytes += len(out)
        return out


def test_iter_samples_groups_by_key_with_offsets_even_when_the_first_member_is_skipped():
    long = "deep/" + "n" * 120
    members = [("a.json", b"{}"), ("a.hr.png", b"x" * 700), (f"{long}.hr.png", b"h" * 1025),
               (f"{long}.lr_x4.png", b"y" * 3000), ("c.d.hr.png", b"z" * 10)]
    data = _archive(members)
    offsets = {n: off for n, off, _ in tario.iter_members(io.BytesIO(data))}
    full = list(tario.iter_samples(io.BytesIO(data)))
    assert [(k, off, sorted(m)) for k, off, m in full] == [
        ("a", 0, ["hr.png", "json"]), (long, offsets[f"{long}.hr.png"], ["hr.png", "lr_x4.png"]),
        ("c", offsets["c.d.hr.png"], ["d.hr.png"])]  # the key ends at the first dot of the basename
    f = _CountingReader(data)
    only_lr = list(tario.iter_samples(f, want=lambda ext: ext == "lr_x4.png"))
    # every sample and its offset still come out (the first member of each was not read) ...
    assert [(k, off) for k, off, _ in only_lr] == [(k, off) for k, off, _ in full]
    assert [m for _, _, m in only_lr] == [{}, {"lr_x4.png": b"y" * 3000}, {}]
    # ... and of the payloads only the wanted one was read: the others were seeked over
    g = _CountingReader(data)
    list(tario.iter_samples(g))
    assert g.read_bytes - f.read_bytes == sum(len(d) for n, d in members if not n.endswith(".lr_x4.png"))


@pytest.mark.parametrize("want", [None, lambda ext: ext == "json"])
def test_iter_samples_refuses_a_member_twice_in_a_sample_even_unread(want):
    data = _archive([("a.json", b"{}"), ("a.hr.png", b"1"), ("a.hr.png", b"2"), ("b.json", b"{}")])
    with pytest.raises(tario.TarFormatError, match="'a.hr.png' appears twice in sample 'a'"):
        list(tario.iter_samples(io.BytesIO(data), want=want))
    # the same extension in the next sample is fine
    assert len(list(tario.iter_samples(io.BytesIO(_archive([("a.hr.png", b"1"), ("b.hr.png", b"2")]))))) == 2
