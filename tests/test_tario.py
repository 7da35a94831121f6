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
    members = [
        ("a.json", b"{}"),
        ("a.hr.png", b"x" * 700),
        (f"{long}.hr.png", b"h" * 1025),
        (f"{long}.lr_x4.png", b"y" * 3000),
        ("c.d.hr.png", b"z" * 10),
    ]
    data = _archive(members)
    offsets = {n: off for n, off, _ in tario.iter_members(io.BytesIO(data))}
    full = list(tario.iter_samples(io.BytesIO(data)))
    assert [(k, off, sorted(m)) for k, off, m in full] == [
        ("a", 0, ["hr.png", "json"]),
        (long, offsets[f"{long}.hr.png"], ["hr.png", "lr_x4.png"]),
        ("c", offsets["c.d.hr.png"], ["d.hr.png"]),
    ]  # the key ends at the first dot of the basename
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


def _pax_tar(records: bytes, data: bytes = b"x" * 700) -> bytes:
    """A PAX extended header with ``records`` (raw bytes), then a member "short.png" of ``data``."""
    ext = tarfile.TarInfo("././@PaxHeader")
    ext.type = tarfile.XHDTYPE
    ext.size = len(records)
    head = ext.tobuf(format=tarfile.USTAR_FORMAT)
    pad = b"\0" * ((-len(records)) % 512)
    member = tarfile.TarInfo("short.png")
    member.size = len(data)
    return head + records + pad + member.tobuf(format=tarfile.USTAR_FORMAT) + data + b"\0" * ((-len(data)) % 512) + b"\0" * 1024


def test_pax_path_and_size_records_apply_to_the_next_member():
    name = "dir/" + "é" * 120 + ".hr.png"
    body = f" path={name}\n".encode()
    total = len(body) + len(str(len(body)))
    total = len(body) + len(str(total))  # the length counts its own digits
    rec = str(total).encode() + body
    (e,) = list(tario.iter_entries(io.BytesIO(_pax_tar(rec)), want=lambda n: True))
    assert e.name == name and e.data == b"x" * 700 and e.start == 0
    # Python's tarfile (and so wds.ShardWriter) writes such headers: the same names come back
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.PAX_FORMAT) as t:
        for n in (name, "plain.txt"):
            ti = tarfile.TarInfo(n)
            ti.size = 3
            t.addfile(ti, io.BytesIO(b"abc"))
    assert [(e.name, e.data) for e in tario.iter_entries(io.BytesIO(b.getvalue()))] == [(name, b"abc"), ("plain.txt", b"abc")]


@pytest.mark.parametrize(
    "records",
    [
        b"99 path=a\n",  # longer than the header
        b"x path=a\n",  # not a length
        b"3 path=a\n",  # shorter than its own text
        b"11 path=a\n\n\n",  # no "\n" where the length ends
        b"9 pathab\n",  # no "="
        b"12 path=\xff\xfe\n",  # not UTF-8
        b"11 size=-5\n",  # negative: would read the rest of the stream
        b"14 size=1e300\n",  # not a number of bytes
        b"15 size=999999\n",  # more than is left
    ],
)
def test_bad_pax_records_are_tar_format_errors(records):
    with pytest.raises(tario.TarFormatError):
        list(tario.iter_entries(io.BytesIO(_pax_tar(records))))
