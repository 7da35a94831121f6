"""``shardmaker verify`` and ``shardmaker info``: check shards against the manifest, summarise."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash
from tqdm import tqdm

from shardmaker import storage
from shardmaker.builder.fromindex import check_files, read_file, samples_of
from shardmaker.errors import InputError
from shardmaker.format import (
    JSON_MEMBER,
    DigestAlgorithm,
    SampleHeader,
    SampleHeaderError,
    check_digests,
    clip_ext,
    clip_members,
    headers,
    hr_frame,
    index_problems,
    load,
    load_index,
    locate,
    lr_frame,
    tario,
)
from shardmaker.format import manifest as mf
from shardmaker.format.manifest import Manifest, ShardInfo
from shardmaker.format.schema import TILED, ManifestError
from shardmaker.format.tiles import TileFormatError, parse_header
from shardmaker.imaging import codecs
from shardmaker.imaging.codecs import ImageDataError
from shardmaker.imaging.tiled import TiledImage, read_layout


def _expected_members(m: Manifest) -> list[str]:
    return mf.sample_members(m.codec, m.scales)


def _header(members: dict[str, bytes], shard: str, key: str) -> SampleHeader | str:
    """The sample's checked ``{key}.json``, or the problem with it."""
    try:
        return SampleHeader.parse(members.get(JSON_MEMBER, b""), shard, key)
    except SampleHeaderError as exc:
        return exc.reason


def _digest_problems(header: SampleHeader, members: dict[str, bytes], names: Sequence[str], key: str) -> list[str]:
    """Each of the members ``names`` that does not match its sha256 in ``{key}.json``."""
    problems = []
    for name in names:
        try:
            check_digests(header.digests, members, (name,), DigestAlgorithm.SHA256, "", key)
        except SampleHeaderError as exc:
            problems.append(exc.reason)
    return problems


def _check_pair(
    m: Manifest,
    header: SampleHeader,
    members: dict[str, bytes],
    hr_size: Sequence[int],
    max_pixels: int = headers.DEFAULT_MAX_PIXELS,
) -> list[str]:
    """Deep checks of one sample's images (its digests are checked before); returns problems (empty when fine)."""
    problems = []
    try:  # headers first: a decompression bomb is refused before it is decoded
        hr_head = headers.image_header(members[mf.hr_member(m.codec)], m.codec)
        for s in m.scales:
            name = mf.lr_member(s, m.codec)
            headers.check_pair(hr_head, headers.image_header(members[name], m.codec), s, (hr_size[0], hr_size[1]), max_pixels)
    except headers.HeaderError as exc:
        return [str(exc)]
    try:
        hr = codecs.decode(members[mf.hr_member(m.codec)], m.codec)
    except ImageDataError as exc:
        return [f"{mf.hr_member(m.codec)}: {exc}"]
    h, w = hr.shape[:2]
    if [w, h] != list(hr_size) or (w, h) != header.hr_size:
        problems.append(f"HR is {w}x{h}, manifest says {list(hr_size)}, json says {list(header.hr_size)}")
    depth = 16 if hr.dtype == np.uint16 else 8
    chans = 1 if hr.ndim == 2 else hr.shape[2]
    if (depth, chans) != (header.bit_depth, header.channels):
        problems.append(f"HR is {depth}-bit x{chans}, json says {header.bit_depth}-bit x{header.channels}")
    for s in m.scales:
        name = mf.lr_member(s, m.codec)
        try:
            lr = codecs.decode(members[name], m.codec)
        except ImageDataError as exc:
            problems.append(f"{name}: {exc}")
            continue
        lh, lw = lr.shape[:2]
        if not mf.pair_fits((h, w), (lh, lw), s):
            problems.append(f"{name} is {lw}x{lh}: HR {w}x{h} is not {s} x LR (+ mod-crop)")
        if lr.dtype != hr.dtype or lr.shape[2:] != hr.shape[2:]:
            problems.append(f"{name} has another bit depth or channel count than HR")
    return problems


def _names(names: list[str], shown: int = 6) -> str:
    """A list of member names, bounded: the first few and how many in all."""
    return str(names) if len(names) <= shown else f"{names[:shown]} ... ({len(names)} in all)"


def _check_clip(m: Manifest, shard: str, key: str, members: dict[str, bytes], hr_size: Sequence[int], deep: bool) -> list[str]:
    """A clip segment: its json, every frame's members in the order the build writes them, each
    frame's kind; ``deep``: every member's digest, and each frame checked as an image sample is
    (headers, decodes, HR = s x LR), one frame in memory at a time."""
    header = _header(members, shard, key)
    if isinstance(header, str):
        return [header]
    if header.clip is None:
        return [f"{key}.json describes no clip segment (clip, frames, ...)"]
    frames = header.clip.frames
    ext = clip_ext(members) or m.codec
    want = clip_members(frames, m.scales, ext)
    if list(members) != want:
        return [f"members {_names(list(members))}, expected {_names(want)} (a clip segment of {frames} frames)"]
    problems = _digest_problems(header, members, want[1:], key) if deep else []
    for t in range(frames):
        real = [hr_frame(t, ext)] + [lr_frame(s, t, ext) for s in m.scales]
        plain = [mf.hr_member(ext)] + [mf.lr_member(s, ext) for s in m.scales]
        kind = _kind_problem(m, members[real[0]], ext)
        if kind is not None:
            problems.append(f"frame {t}: {kind}")
            continue
        if not deep:
            continue
        sub = {p: members[r] for p, r in zip(plain, real, strict=True)}
        for p in _check_tiled(m, sub, hr_size) if ext == TILED else _check_pair(m, header, sub, hr_size):
            for a, b in zip(plain, real, strict=True):
                p = p.replace(a, b)
            problems.append(f"frame {t}: {p}")
    return problems


def _check_tiled(m: Manifest, members: dict[str, bytes], hr_size: Sequence[int]) -> list[str]:
    """Deep checks of a sample stored as tiles (its digests are checked before): each member's
    layout, every tile's digest, header and decode, HR the manifest's size, every LR on the HR grid
    at its scale."""
    problems = []
    heads = {}
    for name in [mf.hr_member(TILED)] + [mf.lr_member(s, TILED) for s in m.scales]:
        try:
            layout = read_layout(members[name])
            img = TiledImage(members[name], layout, verify=True)
            for i in range(layout[0].count):
                img.decode_tile(i)  # one tile in memory at a time
        except (TileFormatError, ImageDataError) as exc:
            problems.append(f"{name}: {exc}")
            continue
        heads[name] = layout[0]
    hr = heads.get(mf.hr_member(TILED))
    if hr is None:
        return problems
    if [hr.width, hr.height] != list(hr_size):
        problems.append(f"HR is {hr.width}x{hr.height}, manifest says {list(hr_size)}")
    for s in m.scales:
        lr = heads.get(mf.lr_member(s, TILED))
        if lr is not None and (
            not mf.pair_fits((hr.height, hr.width), (lr.height, lr.width), s)
            or lr.tile * s != hr.tile
            or (lr.channels, lr.bit_depth) != (hr.channels, hr.bit_depth)
        ):
            problems.append(f"{mf.lr_member(s, TILED)} ({lr.width}x{lr.height}, tiles of {lr.tile}) is not the x{s} LR of HR")
    return problems


def _kind_problem(m: Manifest, data: bytes, member: str) -> str | None:
    """The HR member's header against the manifest's recorded ``channels`` and ``bit_depth`` (when recorded)."""
    if m.channels is None and m.bit_depth is None:
        return None
    try:
        if member == TILED:
            t = parse_header(data)
            head = headers.ImageHeader(t.width, t.height, t.channels, t.bit_depth)
        else:
            head = headers.image_header(data[: headers.HEAD_BYTES], member)
    except (headers.HeaderError, TileFormatError) as exc:
        return f"{member}: {exc}"
    if (m.channels or head.channels, m.bit_depth or head.bit_depth) != (head.channels, head.bit_depth):
        return (
            f"{member} is {mf.kind_text(head.channels, head.bit_depth)}, the manifest says every sample is "
            f"{mf.kind_text(m.channels or head.channels, m.bit_depth or head.bit_depth)}"
        )
    return None


def _check_image(m: Manifest, shard: str, key: str, members: dict[str, bytes], hr_size: Sequence[int], deep: bool) -> list[str]:
    """An image sample (whole or tiled): its members, its HR's kind; ``deep``: its json, every
    member's digest, headers, decodes and HR = s x LR."""
    tiled = list(members) == mf.sample_members(TILED, m.scales)  # an image stored as tiles
    want = _expected_members(m)
    if list(members) != want and not tiled:
        return [f"members {_names(list(members))}, expected {_names(want)}"]
    ext = TILED if tiled else m.codec
    kind = _kind_problem(m, members[mf.hr_member(ext)], ext)
    problems = [] if kind is None else [kind]
    if not deep:
        return problems
    header = _header(members, shard, key)
    if isinstance(header, str):
        return problems + [header]
    problems += _digest_problems(header, members, want[1:] if not tiled else list(members)[1:], key)
    return problems + (_check_tiled(m, members, hr_size) if tiled else _check_pair(m, header, members, hr_size))


def verify_shard(m: Manifest, info: ShardInfo, data: bytes, deep: bool) -> list[str]:
    """Problems found in one shard's bytes, each naming the shard (and key where there is one)."""
    where = info.name
    problems = []
    if len(data) != info.bytes:
        got = f"{len(data)} bytes" if len(data) < info.bytes else "more bytes"
        problems.append(f"{where}: {got}, manifest says {info.bytes}")
    if hashlib.sha256(data).hexdigest() != info.sha256:
        problems.append(f"{where}: sha256 does not match the manifest")
    if m.members is not None:
        return problems + _verify_indexed(m, info, data, deep)
    clips = isinstance(m.build.get("clips"), dict)
    seen = 0
    try:
        for i, (key, offset, members) in enumerate(tario.iter_samples(io.BytesIO(data), limit=len(data))):
            seen += 1
            if i >= info.samples:
                problems.append(f"{where}: extra sample {key!r} not in the manifest")
                continue
            if key != info.keys[i]:
                problems.append(f"{where}: sample {i} is {key!r}, manifest says {info.keys[i]!r}")
            if offset != info.offsets[i]:
                problems.append(f"{where} key {key!r}: starts at byte {offset}, manifest says {info.offsets[i]}")
            check = _check_clip if clips else _check_image  # shardmaker build --clips: a sample is a segment of frames
            problems += [f"{where} key {key!r}: {p}" for p in check(m, where, key, members, info.hr_sizes[i], deep)]
    except tario.TarFormatError as exc:
        problems.append(f"{where}: {exc}")
    if seen < info.samples:
        problems.append(f"{where}: {seen} samples found, manifest says {info.samples}")
    return problems


def _verify_indexed(m: Manifest, info: ShardInfo, data: bytes, deep: bool) -> list[str]:
    """An index of foreign shards: each member at its recorded place, under its name, with its
    xxh3_64; ``deep`` also checks headers, decodes and HR = s x LR."""
    assert m.members is not None and info.members is not None
    problems = []
    for i in range(info.samples):
        key = info.keys[i]
        where = f"{info.name} key {key!r}"
        found: dict[str, bytes] = {}
        for name, cols in info.members.items():
            a, n = int(cols.offsets[i]), int(cols.bytes[i])
            try:
                entries = list(tario.iter_entries(io.BytesIO(data[a : a + n]), limit=n))
            except tario.TarFormatError as exc:
                problems.append(f"{where}: {name} at byte {a}: {exc}")
                continue
            if len(entries) != 1 or entries[0].name != f"{key}.{name}" or entries[0].start != 0:
                problems.append(f"{where}: no member {key}.{name} at byte {a}, where the index puts it")
                continue
            if xxhash.xxh3_64_intdigest(entries[0].data) != int(cols.xxh3_64[i]):
                problems.append(f"{where}: {name} does not match its xxh3_64 in the index")
                continue
            found[name] = entries[0].data
        kind = _kind_problem(m, found[m.members.hr], m.members.hr) if m.members.hr in found else None
        if kind is not None:
            problems.append(f"{where}: {kind}")
        if deep and len(found) == len(info.members):
            problems += [f"{where}: {p}" for p in _check_indexed_pair(m, found, info.hr_sizes[i])]
    return problems


def _check_indexed_pair(m: Manifest, members: dict[str, bytes], hr_size: Sequence[int]) -> list[str]:
    assert m.members is not None
    hr_name = m.members.hr
    try:
        hr_head = headers.image_header(members[hr_name], hr_name)
        for s, name in m.members.lr.items():
            headers.check_pair(hr_head, headers.image_header(members[name], name), s, (hr_size[0], hr_size[1]))
        hr = codecs.decode(members[hr_name], hr_name)
        for s, name in m.members.lr.items():
            lr = codecs.decode(members[name], name)
            if not mf.pair_fits(hr.shape[:2], lr.shape[:2], s) or lr.dtype != hr.dtype or lr.shape[2:] != hr.shape[2:]:
                return [f"{name} ({lr.shape}) does not pair with HR ({hr.shape}) at x{s}"]
    except (headers.HeaderError, ImageDataError) as exc:
        return [str(exc)]
    return []


def _index_problems(url: str, storage_options: dict[str, Any] | None, name: str, m: Manifest) -> list[str]:
    """The column index beside the manifest, if there is one the reader would use: refused as the reader
    refuses it, or differing from the manifest (the reader would stream other shards or samples)."""
    try:
        _, indexed = load_index(url, storage_options, name)
    except ManifestError as exc:
        return [str(exc)]
    return [] if indexed is None else index_problems(m, indexed, f"{name}.idx")


def verify(url: str, deep: bool = False, progress: bool = True, storage_options: dict[str, Any] | None = None) -> list[str]:
    """Every problem found in the shard set at ``url`` (empty list: all good)."""
    url, name = locate(url)
    m = load(url, storage_options, name=name)
    if m.files is not None:
        return _index_problems(url, storage_options, name, m) + verify_files(m, deep, progress, storage_options)
    fs, root = storage.open_dir(url, storage_options)
    problems = _index_problems(url, storage_options, name, m)
    with tqdm(total=m.bytes, unit="B", unit_scale=True, desc="verify", disable=not progress) as bar:
        for info in m.shards:
            try:
                with storage.open_input(fs, mf.shard_path(root, info.name)) as f:
                    data = f.read(info.bytes + 1)  # never more than the manifest promises (+1 to see a longer file)
            except FileNotFoundError:
                problems.append(f"{info.name}: missing")
                continue
            except InputError as exc:  # a FIFO, device or folder at the shard's name
                problems.append(f"{info.name}: {exc.reason}")
                continue
            problems += verify_shard(m, info, data, deep)
            bar.update(info.bytes)
    return problems


def verify_files(m: Manifest, deep: bool, progress: bool, storage_options: dict[str, Any] | None = None) -> list[str]:
    """An index of image files: each file's size and xxh3_64 against the index (``--no-digest``: size);
    ``deep`` also checks headers, decodes and HR = s x LR (each file read once: the read that is decoded
    is the one checked against the index)."""
    if not deep:
        bad = check_files(m, storage_options, progress=progress)
        return [f"{info.name} key {info.keys[i]!r}: {bad[info.keys[i]]}" for info, i in samples_of(m) if info.keys[i] in bad]
    assert m.members is not None
    problems: list[str] = []
    for info, i in tqdm(list(samples_of(m)), unit="img", desc="verify", disable=not progress):
        try:
            found = {n: read_file(m, info, i, n, storage_options) for n in m.members.names()}
        except InputError as exc:  # missing, changed since it was indexed, not a regular file
            problems.append(f"{info.name} key {info.keys[i]!r}: {exc}")
            continue
        except OSError as exc:
            problems.append(f"{info.name} key {info.keys[i]!r}: cannot be read ({exc.strerror or type(exc).__name__})")
            continue
        problems += [f"{info.name} key {info.keys[i]!r}: {p}" for p in _check_indexed_pair(m, found, info.hr_sizes[i])]
    return problems


def _skipped_count(build: dict[str, Any]) -> int:
    listed = build.get("skipped", [])
    count = build.get("skipped_count")
    return count if type(count) is int else len(listed) if type(listed) is list else 0


def _tiles_rows(m: mf.Manifest) -> list[tuple[str, str]]:
    """``tiles`` (how many samples are tiled, with which tile sides), ``regions`` (images split into
    region samples) and ``dropped`` (``--min-valid``) rows, where the dataset has them."""
    rows = []
    sides: dict[int, int] = {}
    for sh in m.shards:
        if sh.tiles is not None:
            for t, n in zip(*np.unique(np.asarray(sh.tiles), return_counts=True), strict=True):
                sides[int(t)] = sides.get(int(t), 0) + int(n)
    tiled = sum(n for t, n in sides.items() if t)
    if tiled:
        each = ", ".join(f"{n} with {t} px tiles" for t, n in sorted(sides.items()) if t)
        rest = "" if tiled == m.samples else f"; {m.samples - tiled} whole"
        rows.append(("tiles", f"{tiled} of {m.samples} samples tiled: {each} (LR tiles: T/s){rest}"))
    reg = m.build.get("regions")
    if isinstance(reg, dict):
        rows.append(
            ("regions", f"{reg.get('images')} image(s) larger than {reg.get('side')} px split into {reg.get('samples')} samples")
        )
    clips = m.build.get("clips")
    if isinstance(clips, dict):
        rows.append(
            (
                "clips",
                f"{clips.get('clips')} clip(s), {clips.get('frames')} frames, in {m.samples} segment sample(s) of at most "
                f"{clips.get('segment')} frames (windows of up to {clips.get('max_span')} frames)",
            )
        )
    if m.lr_method == "none":
        rows.append(("LR", "none (HR-only): stream with lr='bicubic' at any integer scale"))
    if m.build.get("dropped_count"):
        rows.append(("dropped", f"{m.build['dropped_count']} under --min-valid {m.build.get('min_valid')} (build.dropped)"))
    return rows


def _members_text(members: mf.MemberNames) -> str:
    """``hr.png + x4: lr_x4.png``; an HR-only index: ``hr.png``."""
    lr = ", ".join(f"x{s}: {n}" for s, n in sorted(members.lr.items()))
    return f"{members.hr} + {lr}" if lr else members.hr


def _index_of(m: Manifest) -> str:
    if m.files is None:
        return "foreign shards (shardmaker index): read in place, members by offset"
    lr = "".join(f", x{s} LR under {r}" for s, r in sorted(m.files.lr.items()))
    digest = m.files.checked_by
    return f"image files in place (groups of files, not shards): HR under {m.files.hr}{lr}; each file checked by {digest}"


def _index_text(url: str, storage_options: dict[str, Any] | None, name: str) -> str:
    """Whether the streaming reader maps a column index (``NAME.idx``) or parses the JSON."""
    present, indexed = load_index(url, storage_options, name)
    if indexed is not None:
        return f"{name}.idx (the reader maps it; shardmaker verify checks it against {name})"
    if present:
        return f"{name}.idx made from another {name}: not used (the reader parses the JSON)"
    return f"none (the reader parses {name})"


def info_text(url: str, storage_options: dict[str, Any] | None = None) -> str:
    """A short human-readable summary of a shard set."""
    url, name = locate(url)
    m = load(url, storage_options, name=name)
    sizes = [tuple(s) for sh in m.shards for s in sh.hr_sizes]
    pixels = [w * h for w, h in sizes]
    lo, hi = sizes[int(np.argmin(pixels))], sizes[int(np.argmax(pixels))]
    per = [sh.bytes for sh in m.shards]
    rows = [
        ("dataset", url),
        ("format", mf.FORMAT),
        ("samples", f"{m.samples}"),
        ("shards", f"{len(m.shards)} ({min(per) / 1e6:.1f}-{max(per) / 1e6:.1f} MB each)"),
        ("bytes", f"{m.bytes} ({m.bytes / 1e9:.3f} GB)"),
        ("scales", ", ".join(f"x{s}" for s in m.scales) or "none (HR-only)"),
        ("codec", m.codec),
        *([("members", _members_text(m.members))] if m.members else []),
        *([("index of", _index_of(m))] if m.members else []),
        ("lr method", m.lr_method),
        ("HR size", f"{lo[0]}x{lo[1]} .. {hi[0]}x{hi[1]}"),
        ("kind", mf.kind_text(m.channels, m.bit_depth) if m.channels and m.bit_depth else "not recorded"),
        *_tiles_rows(m),
        ("skipped", f"{_skipped_count(m.build)} {'samples or shards' if m.members else 'source files'}"),
        ("index", _index_text(url, storage_options, name)),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
