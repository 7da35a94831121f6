"""``shardmaker index``: a manifest for tar shards that another tool wrote, without rewriting them.

Each shard is read once, front to back (a streaming read of local files or remote objects, several
shards at a time). Members are matched to samples by the member names the user gives (``--hr jpg
--lr 4:x4.jpg``): a member ``a.b.x4.jpg`` is the ``x4.jpg`` of sample ``a.b``, the longest name
first, so keys may hold dots. Every member's place (its entry's first byte and length), the xxh3_64
of its data and the HR size (from the image header, no decode) go into the manifest, so the reader
finds members wherever they are in the shard and in any order. The whole shard's sha256 and probe
are computed in the same pass (``shardmaker verify`` and the reader check them).

Members are streamed: a member's digest is computed chunk by chunk and only its first
``headers.HEAD_BYTES`` (its header) are held, so memory does not grow with a member's size; a member
larger than any image ``max_pixels`` allows (or than the image its own header describes) is refused
without being read.

A sample without one of the members, with an unreadable header, an HR not ``s`` x LR, a key the
format refuses, or of another kind (channels, bit depth) than the dataset's, is refused
(``--on-error fail``, naming shard and key) or left out and counted in the manifest's
``build.skipped`` (``--on-error skip``; bounded: the first few listed, all counted by reason).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import posixpath
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import xxhash
from tqdm import tqdm

from shardmaker import storage
from shardmaker.errors import OnError, ShardmakerError, brief
from shardmaker.format import colindex, headers, patterns, tario
from shardmaker.format import manifest as mf
from shardmaker.version import __version__

log = logging.getLogger("shardmaker")
_CHUNK = 8 << 20  # bytes per read of a shard


class IndexingError(ShardmakerError, ValueError):
    """A shard or sample that cannot be indexed (with ``on_error=fail``), or an unusable request."""


@dataclasses.dataclass(frozen=True)
class IndexConfig:
    hr: str  # HR member name: "hr.png", "jpg", ...
    lr: dict[int, str]  # scale -> LR member name: {4: "x4.jpg"}
    on_error: OnError = OnError.FAIL
    workers: int = 4  # shards read at a time
    max_pixels: int = headers.DEFAULT_MAX_PIXELS
    overwrite: bool = False
    wids: bool = False  # also write a wids shard list beside the manifest
    progress: bool = True
    storage_options: dict[str, Any] | None = None
    channels: int | None = None  # every sample's channels (1 or 3); None: the first good sample's
    bit_depth: int | None = None  # every sample's bit depth (8 or 16); None: the first good sample's

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_error", OnError(self.on_error))
        for field, allowed in mf.KINDS.items():
            if getattr(self, field) not in (None, *allowed):
                raise ValueError(f"{field} must be one of {', '.join(map(str, allowed))}, got {brief(getattr(self, field))}")
        mf.MemberNames.from_json({"hr": self.hr, "lr": {str(s): n for s, n in self.lr.items()}}, "--hr/--lr")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")


@dataclasses.dataclass
class _Sample:
    key: str
    members: dict[str, tuple[int, int, int, headers.ImageHeader]]  # name -> (start, length, xxh3_64, header)
    problem: str | None = None


@dataclasses.dataclass
class _Shard:
    name: str
    size: int
    sha256: str
    probe: str
    samples: list[_Sample]
    wds_samples: int  # samples as WebDataset groups them (first dot of the name): what wids counts
    problem: str | None = None
    extended_names: bool = False  # a member name needs a PAX or GNU long-name header (> 100 bytes or not ASCII)
    unmatched: tuple[str, ...] = ()  # a few names (after the key's first dot) of members no --hr/--lr name matched


@dataclasses.dataclass(frozen=True)
class IndexResult:
    manifest: mf.Manifest
    path: str  # where it was written
    skipped: list[dict[str, str]]  # the first mf.SKIP_EXAMPLES of what was left out
    seconds: float
    skipped_count: int = 0  # all that was left out


class _Hashing:
    """A forward-only reader over a shard that hashes every byte it passes (sha256 and the probe's
    first and last MiB), seeks included: one pass gives the members and the shard's digests."""

    def __init__(self, f: Any, size: int, bar: Any) -> None:
        self.f, self.size, self.bar = f, size, bar
        self.pos = 0
        self.sha = hashlib.sha256()
        self.head = bytearray()
        self.tail = bytearray()

    def _take(self, n: int) -> bytes:
        data = self.f.read(n)
        self.sha.update(data)
        if len(self.head) < mf.PROBE_BYTES:
            self.head += data[: mf.PROBE_BYTES - len(self.head)]
        self.tail += data
        if len(self.tail) > 2 * mf.PROBE_BYTES:
            del self.tail[: len(self.tail) - mf.PROBE_BYTES]
        self.pos += len(data)
        if self.bar is not None:
            self.bar.update(len(data))
        return data

    def read(self, n: int) -> bytes:
        return self._take(n)

    def seek(self, n: int, whence: int = io.SEEK_CUR) -> int:
        if whence != io.SEEK_CUR or n < 0:
            raise ValueError("a shard is indexed front to back")
        while n > 0:
            got = len(self._take(min(n, _CHUNK)))
            if not got:
                break
            n -= got
        return self.pos

    def finish(self) -> tuple[str, str]:
        """Hash what is left (the end-of-archive blocks, padding) -> (sha256, probe)."""
        while self._take(_CHUNK):
            pass
        return self.sha.hexdigest(), mf.probe_of(self.head, self.tail[-mf.PROBE_BYTES :])


def _matcher(cfg: IndexConfig) -> Any:
    """name -> (key, member name) or None; the longest member name wins (``x4.png`` before ``png``)."""
    names = sorted([cfg.hr, *cfg.lr.values()], key=len, reverse=True)

    def match(name: str) -> tuple[str, str] | None:
        for m in names:
            if name.endswith("." + m) and len(name) > len(m) + 1:
                key = name[: -len(m) - 1]
                if not key.endswith("/"):
                    return key, m
        return None

    return match


def index_shard(fs: Any, path: str, name: str, cfg: IndexConfig, bar: Any = None) -> _Shard:
    """One shard, read once: its samples (with problems noted, not raised) and digests."""
    match = _matcher(cfg)
    samples: dict[str, _Sample] = {}
    wds_keys = 0
    last_wds: str | None = None
    extended = False
    unmatched: dict[str, None] = {}
    size = fs.size(path)
    with storage.open_input(fs, path, block_size=_CHUNK) as raw:
        f = _Hashing(raw, size, bar)
        try:
            wanted = tario.iter_entries(f, limit=size, want=lambda n: match(n) is not None, skipped=True, stream=True)  # type: ignore[arg-type]
            for e in wanted:
                extended = extended or len(e.name.encode()) > 100 or not e.name.isascii()
                dot = e.name.find(".", e.name.rfind("/") + 1)  # WebDataset's key: up to the first dot of the basename
                if dot > 0 and e.name[:dot] != last_wds:
                    wds_keys, last_wds = wds_keys + 1, e.name[:dot]
                if e.data is None:
                    if len(unmatched) < 8 and dot > 0:
                        unmatched.setdefault(e.name[dot + 1 :][:40], None)
                    continue
                key, member = match(e.name)  # type: ignore[misc]
                s = samples.setdefault(key, _Sample(key, {}))
                if member in s.members:
                    s.problem = s.problem or f"member {brief(e.name)} appears twice"
                    continue
                digest, head, problem = _read_member(e.data, member, cfg.max_pixels)
                if problem is not None:
                    s.problem = s.problem or f"{member}: {problem}"
                s.members[member] = (e.start, e.end - e.start, digest, head)
        except tario.TarFormatError as exc:
            f.finish()
            return _Shard(name, size, "", "", [], 0, f"bad tar data ({exc})")
        sha, probe = f.finish()
    for s in samples.values():
        if s.problem is None:
            s.problem = _check(s, cfg)
    return _Shard(name, size, sha, probe, list(samples.values()), wds_keys, extended_names=extended, unmatched=tuple(unmatched))


_NO_HEADER = headers.ImageHeader(1, 1, 0, 0)


def _read_member(data: tario.MemberStream, member: str, max_pixels: int) -> tuple[int, headers.ImageHeader, str | None]:
    """``(xxh3_64, header, problem)`` of a member, streamed: only its first ``HEAD_BYTES`` are held. A
    member larger than any image ``max_pixels`` allows, or than its own header's image, is not read."""
    codec = mf.codec_of(member)
    limit = headers.member_limit(member, max_pixels)
    if data.size > limit:
        return (
            0,
            _NO_HEADER,
            (f"{data.size} bytes: larger than any {codec} image within max_pixels={max_pixels} can be ({limit} bytes)"),
        )
    first = data.read(headers.HEAD_BYTES)
    try:
        head = headers.image_header(first, member)
    except headers.HeaderError as exc:
        return 0, _NO_HEADER, str(exc)
    limit = headers.member_limit(member, max_pixels, head)
    if data.size > limit:
        kind = mf.kind_text(head.channels, head.bit_depth)
        return 0, head, f"{data.size} bytes: larger than a {head.width}x{head.height} {kind} {codec} can be ({limit} bytes)"
    digest = xxhash.xxh3_64(first)
    for chunk in data.chunks(_CHUNK):
        digest.update(chunk)
    return digest.intdigest(), head, None


def _check(s: _Sample, cfg: IndexConfig) -> str | None:
    why = mf.key_problem(s.key, dots=True)
    if why is not None:
        return f"key {why}"
    if cfg.hr not in s.members:
        return f"has no {cfg.hr} member"
    hr = s.members[cfg.hr][3]
    for scale in sorted(cfg.lr):
        name = cfg.lr[scale]
        if name not in s.members:
            return f"has no {name} member (x{scale} LR)"
        try:
            headers.check_pair(hr, s.members[name][3], scale, None, cfg.max_pixels)
        except headers.HeaderError as exc:
            return str(exc)
    return None


def shard_urls(spec: str | Sequence[str], storage_options: dict[str, Any] | None = None) -> tuple[str, list[str]]:
    """``(folder, shard names)``: a folder (every ``*.tar`` in it), a brace pattern or a list of
    shard URLs, all in one folder (the manifest is written beside them)."""
    items = [spec] if isinstance(spec, str) else list(spec)
    if len(items) == 1 and "{" not in items[0] and not items[0].rstrip("/").endswith(".tar"):
        folder = items[0].rstrip("/")
        fs, root = storage.open_dir(folder, storage_options)
        names = sorted(posixpath.basename(p) for p in fs.glob(storage.join(root, "*.tar")))
        if not names:
            raise IndexingError(f"{folder}: no .tar shards in this folder")
    else:
        try:
            urls = patterns.expand_braces(items)  # counted first: refused above MAX_NAMES
        except patterns.PatternError as exc:
            raise IndexingError(str(exc)) from None
        if not urls:
            raise IndexingError("no shard URLs given")
        pairs = [u.rstrip("/").rpartition("/") for u in urls]
        folder = pairs[0][0]
        for u, (f, _, _) in zip(urls, pairs, strict=True):
            if f != folder:
                raise IndexingError(f"{u}: not in {folder}; the shards of one index live in one folder, beside its manifest")
        names = [n for _, _, n in pairs]
        if len(set(names)) != len(names):
            raise IndexingError(f"shard {next(n for n in names if names.count(n) > 1)} is given twice")
        fs, root = storage.open_dir(folder, storage_options)
        for n in names:
            if not fs.exists(storage.join(root, n)):
                raise IndexingError(f"{folder}/{n}: no such shard")
    for n in names:
        try:
            mf.check_shard_name(n, folder, "shard")
        except mf.ManifestError as exc:
            raise IndexingError(f"{folder}/{n}: {exc.reason}") from None
    return folder, names


def index(spec: str | Sequence[str], out: str | None, cfg: IndexConfig) -> IndexResult:
    """Index the shards ``spec`` names and write the manifest to ``out`` (default: ``manifest.json``
    beside them). Returns the manifest and what was skipped."""
    t0 = time.perf_counter()
    folder, names = shard_urls(spec, cfg.storage_options)
    out = out or f"{folder}/{mf.MANIFEST}"
    out_folder, _, out_name = out.rstrip("/").rpartition("/")
    if out_folder.rstrip("/") != folder.rstrip("/") or not out_name:
        raise IndexingError(
            f"-o {out}: the manifest must be in the shards' folder {folder} (a shard's place is the manifest's folder + its name)"
        )
    fs, root = storage.open_dir(folder, cfg.storage_options)
    target = storage.join(root, out_name)
    if fs.exists(target) and not cfg.overwrite:
        raise IndexingError(f"{out} exists; give --overwrite to replace it")
    total = sum(fs.size(storage.join(root, n)) for n in names)
    lock = threading.Lock()
    with tqdm(total=total, unit="B", unit_scale=True, desc="index", disable=not cfg.progress) as bar:

        class _Bar:
            def update(self, n: int) -> None:
                with lock:
                    bar.update(n)

        def one(n: str) -> _Shard:
            return index_shard(fs, storage.join(root, n), n, cfg, _Bar())

        with ThreadPoolExecutor(min(cfg.workers, len(names))) as pool:
            shards = list(pool.map(one, names))
    infos, skips, kind = _assemble(shards, cfg)
    skips.summarise()
    if not infos:
        raise IndexingError(f"{folder}: no usable sample in {len(names)} shard(s)" + _first(skips.first))
    members = mf.MemberNames(cfg.hr, dict(cfg.lr))
    build = {
        "tool": "shardmaker index",
        "version": __version__,
        **skips.to_build(),
        "wds_samples": {s.name: s.wds_samples for s in shards if not s.problem},
    }
    m = mf.Manifest(
        mf.codec_of(cfg.hr), sorted(cfg.lr), "provided", infos, build, members=members, channels=kind[0], bit_depth=kind[1]
    )
    data = m.dumps()
    m = mf.parse(data, out)  # the file as readers will see it: checked against the schema before it is written
    storage.write_atomic(fs, colindex.index_path(target), colindex.encode(m, data))  # first: the manifest commits
    storage.write_atomic(fs, target, data)
    if cfg.wids:
        write_wids(fs, root, out_name, shards)
    return IndexResult(m, out, skips.first, time.perf_counter() - t0, skips.count)


def _first(skipped: list[dict[str, Any]]) -> str:
    return f" (first: {skipped[0]['shard']} {brief(skipped[0].get('key', ''))}: {skipped[0]['reason']})" if skipped else ""


_LISTED_KEY = 1024  # the most characters of a key build.skipped lists


def _assemble(shards: list[_Shard], cfg: IndexConfig) -> tuple[list[mf.ShardInfo], mf.Skips, list[int | None]]:
    """The manifest's shard entries, what was skipped, and the dataset's kind ``[channels, bit_depth]``."""
    skips = mf.Skips(log)
    seen: dict[str, str] = {}
    infos = []
    kind: list[int | None] = [cfg.channels, cfg.bit_depth]

    def bad(shard: str, key: str | None, reason: str) -> None:
        where = f"{shard}: {brief(key)}" if key is not None else shard
        if cfg.on_error is OnError.FAIL:
            raise IndexingError(f"{where}: {reason} (--on-error skip leaves it out)")
        entry: dict[str, Any] = {"shard": shard, "reason": reason}
        if key is not None:
            entry = {"shard": shard, "key": key if len(key) <= _LISTED_KEY else key[: _LISTED_KEY - 3] + "...", "reason": reason}
        skips.add(entry, reason, where)

    def other_kind(s: _Sample) -> str | None:
        hr = s.members[cfg.hr][3]
        kind[0], kind[1] = kind[0] or hr.channels, kind[1] or hr.bit_depth
        if (hr.channels, hr.bit_depth) == tuple(kind):
            return None
        origin = "as --channels/--bit-depth say" if cfg.channels or cfg.bit_depth else "its first usable sample's kind"
        return (
            f"sample is {mf.kind_text(hr.channels, hr.bit_depth)}, the dataset {mf.kind_text(*kind)} ({origin}; "
            "one dataset holds one kind: --channels/--bit-depth choose it)"
        )

    for sh in shards:
        if sh.problem:
            bad(sh.name, None, sh.problem)
            continue
        good = []
        for s in sh.samples:
            if s.problem is None and s.key in seen:
                s.problem = f"key is also in {seen[s.key]}"
            if s.problem is None:
                s.problem = other_kind(s)
            if s.problem is not None:
                bad(sh.name, s.key, s.problem)
                continue
            seen[s.key] = sh.name
            good.append(s)
        if not good and not sh.samples and sh.unmatched:
            asked = ", ".join([cfg.hr, *(f"{s}:{n}" for s, n in sorted(cfg.lr.items()))])
            bad(
                sh.name, None, f"no member matches the names asked for ({asked}); its members are named {', '.join(sh.unmatched)}"
            )
        elif not good:
            bad(sh.name, None, "no usable sample in this shard")
            continue
        good.sort(key=lambda s: min(v[0] for v in s.members.values()))
        names = [cfg.hr, *(cfg.lr[k] for k in sorted(cfg.lr))]
        cols = {
            n: mf.MemberColumns(
                np.array([s.members[n][0] for s in good], dtype=np.int64),
                np.array([s.members[n][1] for s in good], dtype=np.int64),
                np.array([s.members[n][2] for s in good], dtype=np.uint64),
            )
            for n in names
        }
        infos.append(
            mf.ShardInfo(
                sh.name,
                len(good),
                sh.size,
                sh.sha256,
                [s.key for s in good],
                [min(v[0] for v in s.members.values()) for s in good],
                [[s.members[cfg.hr][3].width, s.members[cfg.hr][3].height] for s in good],
                sh.probe,
                cols,
            )
        )
    return infos, skips, kind


def wids_name(manifest_name: str) -> str:
    stem = manifest_name[:-5] if manifest_name.endswith(".json") else manifest_name
    return f"{stem}.wids.json"


def write_wids(fs: Any, root: str, manifest_name: str, shards: list[_Shard]) -> str:
    """A wids shard list (``wids.ShardListDataset``) of the same shards, next to the manifest:
    shard URLs relative to it and sample counts as WebDataset groups members."""
    import json

    doc = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": posixpath.basename(root.rstrip("/")) or "shards",
        "shardlist": [{"url": s.name, "nsamples": s.wds_samples} for s in shards if not s.problem],
    }
    for s in shards:
        if s.extended_names and not s.problem:
            log.warning(
                "%s: member names in PAX or GNU long-name headers (longer than 100 bytes or not ASCII); wids's own "
                "tar reader does not read those, so wids may count or name this shard's samples differently",
                s.name,
            )
    path = storage.join(root, wids_name(manifest_name))
    storage.write_atomic(fs, path, (json.dumps(doc, indent=1) + "\n").encode())
    return path
