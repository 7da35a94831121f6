"""``shardmaker ls`` and ``cat``: what a shard set holds, and one sample's members as files.

Everything goes through :mod:`shardmaker.format`: the manifest is checked on load, a shard's
location is :func:`shard_path`, and a sample is one range read (``ShardInfo.offsets``, or the
member places of an index of foreign shards) bounded by the manifest, parsed with the bounded tar
reader and checked against the digests the set records before anything is written. Image samples,
tiled samples (each tiled member assembled from its tiles into one PNG) and clip segments (a file
per frame, HR and each LR) alike.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import xxhash

from shardmaker import format as mf
from shardmaker import imaging, storage
from shardmaker.builder.fromindex import read_file
from shardmaker.errors import InputError, ShardmakerError
from shardmaker.format import Manifest, ShardInfo, tario

__all__ = ["PeekError", "SampleFiles", "cat", "ls_lines", "manifest_of"]


class PeekError(ShardmakerError, ValueError):
    """A key that is not in the set, or a sample whose bytes are not what the manifest says."""


@dataclasses.dataclass(frozen=True)
class SampleFiles:
    """What :func:`cat` wrote: the shard it read and each file, in member order; ``assembled``: the
    files of tiled members, each one image assembled from its tiles (how many, of which side)."""

    shard: str
    files: list[Path]
    assembled: dict[Path, str] = dataclasses.field(default_factory=dict)


def manifest_of(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Manifest, str]:
    """The checked manifest and the dataset folder: ``url`` is the folder, or the URL of a manifest
    in it with another name (``shardmaker index -o``)."""
    folder, name = mf.locate(url)
    return mf.load(folder, storage_options, name=name), folder


def ls_lines(url: str, keys: bool = False, storage_options: dict[str, Any] | None = None) -> Iterator[str]:
    """One line per shard (name, samples, bytes) and a total; with ``keys``, one line per sample
    instead: shard, key, HR size (``W x H``) and, for a tiled sample, its tile side."""
    m, _ = manifest_of(url, storage_options)
    if keys:
        width = max(len(sh.name) for sh in m.shards)
        for sh in m.shards:
            for i, (key, (w, h)) in enumerate(zip(sh.keys, sh.hr_sizes, strict=True)):
                t = sh.tiled(i)
                yield f"{sh.name:<{width}}  {key}  {int(w)}x{int(h)}" + (f"  tiles {t}" if t else "")
        return
    width = max(len("shard"), *(len(sh.name) for sh in m.shards))
    yield f"{'shard':<{width}}  {'samples':>8}  {'bytes':>14}"
    for sh in m.shards:
        yield f"{sh.name:<{width}}  {sh.samples:>8}  {sh.bytes:>14}"
    yield f"{f'{len(m.shards)} shards':<{width}}  {m.samples:>8}  {m.bytes:>14}"


def _find(m: Manifest, key: str, url: str) -> tuple[ShardInfo, int]:
    for sh in m.shards:
        for i, k in enumerate(sh.keys):
            if k == key:
                return sh, i
    near = difflib.get_close_matches(key, [k for sh in m.shards for k in sh.keys], n=3)
    hint = f"; close: {', '.join(near)}" if near else ""
    raise PeekError(f"{url}: no sample with key {key!r}{hint} (list them: shardmaker ls {url} --keys)")


def _read_range(fs: Any, path: str, start: int, n: int) -> bytes:
    data = storage.read_range(fs, path, start, start + n)
    if len(data) != n:
        raise PeekError(f"{path}: {len(data)} bytes at byte {start}, the manifest promises {n} (a shorter shard?)")
    return data


def _own_members(m: Manifest, sh: ShardInfo, i: int, data: bytes) -> dict[str, bytes]:
    """The members of sample ``i`` of one of shardmaker's shards, from its bytes (read from its
    offset), under its key: exactly ``json``, ``hr.ext`` and one ``lr_x{s}.ext`` per scale (``ext``:
    the codec, or ``tiles`` for a tiled sample), or for a clip segment (``shardmaker build --clips``)
    ``json`` and each frame's ``hr_f0003.ext``, ``lr_x4_f0003.ext``, ... as its header counts them."""
    key = sh.keys[i]
    where = f"{sh.name} key {key!r}"
    ext = mf.TILED if sh.tiled(i) else m.codec
    want = [mf.JSON_MEMBER, mf.hr_member(ext), *(mf.lr_member(s, ext) for s in m.scales)]
    try:
        got_key, offset, members = next(tario.iter_samples(io.BytesIO(data), limit=len(data)))
    except StopIteration:
        raise PeekError(f"{where}: no tar member at byte {sh.offsets[i]}") from None
    except tario.TarFormatError as exc:
        raise PeekError(f"{where}: {exc}") from None
    misplaced = PeekError(f"{where}: found {got_key!r} with members {list(members)} where the manifest puts it")
    if got_key != key or offset != 0 or mf.JSON_MEMBER not in members:
        raise misplaced
    try:
        header = mf.SampleHeader.parse(members[mf.JSON_MEMBER], sh.name, key)
        if header.clip is not None and isinstance(m.build.get("clips"), dict):  # a clip segment: its frames
            want = mf.clip_members(header.clip.frames, m.scales, mf.clip_ext(members) or m.codec)
        if list(members) != want:
            raise misplaced
        if sorted(header.digests.sha256) != sorted(want[1:]):
            raise mf.SampleHeaderError(sh.name, key, f"its {key}.json does not describe this sample (digests of other members)")
        mf.check_digests(header.digests, members, want[1:], mf.DigestAlgorithm.SHA256, sh.name, key)
    except mf.SampleHeaderError as exc:
        raise PeekError(str(exc)) from None
    return members


def _foreign_members(sh: ShardInfo, i: int, fs: Any, path: str) -> dict[str, bytes]:
    """The indexed members of sample ``i`` of a foreign shard: each read at its recorded place,
    under its name, checked against its recorded xxh3_64."""
    assert sh.members is not None
    key = sh.keys[i]
    out = {}
    for name, cols in sh.members.items():
        start, n = int(cols.offsets[i]), int(cols.bytes[i])
        data = _read_range(fs, path, start, n)
        try:
            entries = list(tario.iter_entries(io.BytesIO(data), limit=n))
        except tario.TarFormatError as exc:
            raise PeekError(f"{sh.name} key {key!r}: {name} at byte {start}: {exc}") from None
        if len(entries) != 1 or entries[0].name != f"{key}.{name}":
            raise PeekError(f"{sh.name} key {key!r}: no member {key}.{name} at byte {start}, where the index puts it")
        if xxhash.xxh3_64_intdigest(entries[0].data) != int(cols.xxh3_64[i]):
            raise PeekError(f"{sh.name} key {key!r}: {name} does not match its xxh3_64 in the index")
        out[name] = entries[0].data
    return out


def _target(out_dir: Path, key: str, name: str) -> Path:
    """``DIR/{key}.{name}``, ``/`` in the key made folders; never outside ``DIR``."""
    parts = key.split("/")
    if any(p in ("", ".", "..") or "\\" in p for p in parts):
        raise PeekError(f"key {key!r} is not a relative path")
    path = out_dir.joinpath(*parts[:-1], f"{parts[-1]}.{name}")
    if not path.resolve().is_relative_to(out_dir.resolve()):
        raise PeekError(f"key {key!r} leads out of {out_dir}")
    return path


def cat(url: str, key: str, out_dir: str | Path, storage_options: dict[str, Any] | None = None) -> SampleFiles:
    """Write the members of sample ``key`` as files into ``out_dir`` (``{key}.json``,
    ``{key}.hr.png``, ``{key}.lr_x4.png`` ...; an index's members under their names), once all are
    read and checked."""
    m, folder = manifest_of(url, storage_options)
    sh, i = _find(m, key, url)
    fs, root = storage.open_dir(folder, storage_options)
    path = mf.shard_path(root, sh.name)
    if sh.files is not None:
        try:
            members = {
                _file_member(name, sh.files[name].paths[i]): read_file(m, sh, i, name, storage_options) for name in sh.files
            }
        except InputError as exc:
            raise PeekError(f"{sh.name} key {key!r}: {exc}") from None
    elif sh.members is not None:
        members = _foreign_members(sh, i, fs, path)
    else:
        end = int(sh.offsets[i + 1]) if i + 1 < sh.samples else sh.bytes
        members = _own_members(m, sh, i, _read_range(fs, path, int(sh.offsets[i]), end - int(sh.offsets[i])))
    out = Path(out_dir)
    assembled: dict[Path, str] = {}
    written: dict[str, bytes] = {}
    for name, data in members.items():
        if name.endswith("." + mf.TILED) and sh.members is None:  # one image, assembled from its tiles
            name = name[: -len(mf.TILED)] + "png"
            written[name], assembled[_target(out, key, name)] = _assemble(data, sh.name, key, name)
        else:
            written[name] = data
    files = [_target(out, key, name) for name in written]
    for target, data in zip(files, written.values(), strict=True):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return SampleFiles(sh.name, files, assembled)


def _file_member(name: str, path: str) -> str:
    """A member of an index of files, named by its file's extension where its side mixes formats
    (``hr.img`` -> ``hr.jpg``)."""
    if not name.endswith("." + mf.MIXED):
        return name
    return f"{name.rsplit('.', 1)[0]}.{path.rsplit('.', 1)[-1].lower()}"


def _assemble(data: bytes, shard: str, key: str, name: str) -> tuple[bytes, str]:
    """A tiled member (digests already checked) as one PNG of the whole image, and how it was tiled."""
    try:
        img = imaging.TiledImage(data, verify=True)
        pixels = img.region(0, 0, img.header.height, img.header.width)
    except ValueError as exc:  # TileFormatError, ImageDataError: a tile that is not what its index says
        raise PeekError(f"{shard} key {key!r}: {name}: {exc}") from None
    h = img.header
    return imaging.encode(pixels, imaging.Codec.PNG, 6), f"{h.cols * h.rows} tiles of {h.tile} px"
