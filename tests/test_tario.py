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
