"""``shardmaker index DIR (--lr DIR ... | --hr-only) -o IDX``: a manifest naming image files in place.

The folder (or prefix) is listed and paired exactly as ``shardmaker build`` does
(``builder.sources.scan_sources``: DIV2K/Set5 names, ``--lr-pattern``, symbolic links followed, FIFOs
and devices left out), and ordered as ``build`` orders its samples (``builder.run.order_samples``, same
``--seed``), so streaming the index gives the batches the shards built from the folder give. Each file
is read once, in the scan (``indexreads``): its header (size, channels, depth: no decode) and its xxh3_64 (``--no-digest``: its
size alone); a file larger than any image within ``max_pixels`` (or than its own header's image) is
refused before it is read. Samples are grouped (``group_bytes`` of files a group) as shards group them.
Nothing is written under the sources: the index goes to ``-o``, outside them.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from shardmaker import storage
from shardmaker.builder.run import order_samples
from shardmaker.builder.sources import Pair, scan_sources
from shardmaker.errors import InputError, OnError, ShardmakerError
from shardmaker.format import colindex, headers
from shardmaker.format import manifest as mf
from shardmaker.format.files import FileColumns, FileRoots, group_digest, group_layout
from shardmaker.format.loading import locate
from shardmaker.indexreads import FileEntry, FileReads
from shardmaker.version import __version__

log = logging.getLogger("shardmaker")


class FileIndexError(ShardmakerError, ValueError):
    """A folder that cannot be indexed, or an unusable request."""


@dataclasses.dataclass(frozen=True)
class FileIndexConfig:
    lr: tuple[str, ...] = ()  # LR folders or URLs, one per scale
    lr_pattern: str | None = None
    hr_only: bool = False
    digest: bool = True  # False: --no-digest (sizes alone are checked when streaming)
    on_error: OnError = OnError.FAIL
    workers: int = 4  # files read at a time
    max_pixels: int = headers.DEFAULT_MAX_PIXELS
    mod_crop: bool = True
    seed: int = 0  # the sample order, as shardmaker build --seed orders its shards' samples
    group_bytes: int = 256_000_000  # files of one group (what shardmaker build --shard-size is to shards)
    overwrite: bool = False
    progress: bool = True
    storage_options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "on_error", OnError(self.on_error))
        object.__setattr__(self, "lr", tuple(self.lr))
        if self.hr_only == bool(self.lr):
            raise ValueError("give --lr FOLDER (one per scale) for provided LR, or --hr-only (LR made when streaming)")
        if self.workers < 1 or self.group_bytes < 1:
            raise ValueError("workers and group_bytes must be >= 1")


@dataclasses.dataclass(frozen=True)
class FileIndexResult:
    manifest: mf.Manifest
    path: str
    skipped: list[dict[str, Any]]
    skipped_count: int
    seconds: float


def _member(side: str, url: str) -> str:
    ext = posixpath.splitext(url)[1].lower().lstrip(".")
    return f"{side}.{ext}"


def _names(pairs: list[Pair]) -> dict[int | None, str]:
    """Each side's member (HR under None, LR under its scale): ``hr.png`` when all its files are PNG,
    ``hr.img`` when the side mixes formats (each file read as the format it is, :data:`mf.MIXED`)."""
    sides: dict[int | None, set[str]] = {None: set()}
    for p in pairs:
        sides[None].add(_member("hr", p.hr))
        for s, u, _ in p.lr:
            sides.setdefault(s, set()).add(_member(f"lr_x{s}", u))
    names = {}
    for side, found in sides.items():
        one = sorted(found)[0]
        names[side] = one if len(found) == 1 else f"{one.split('.')[0]}.{mf.MIXED}"
        if mf.codec_of(one) not in mf.MEMBER_CODECS:  # the scan's reads refuse these first: kept as a guard
            raise FileIndexError(f"{pairs[0].hr}: .{mf.codec_of(one)} files are not streamed in place; build shards of them")
    return names


def _root_of(url: str, rel: str) -> str:
    return url[: len(url) - len(rel)].rstrip("/") if url.endswith(rel) else posixpath.dirname(url)


def _sample(p: Pair, cfg: FileIndexConfig, read: FileReads) -> dict[int | None, FileEntry]:
    """Every file of pair ``p`` as the scan read it (HR under key None, LR under its scale), the pair's
    headers checked."""
    out: dict[int | None, FileEntry] = {}
    for side, url in [(None, p.hr), *((s, u) for s, u, _ in p.lr)]:
        out[side] = read.entries[url]
    hr = out[None].header
    for s, u, _ in p.lr:
        try:
            headers.check_pair(hr, out[s].header, s, None, cfg.max_pixels)
        except headers.HeaderError as exc:
            raise InputError(u, str(exc)) from None
    return out


def index_files(hr_src: str, out: str, cfg: FileIndexConfig) -> FileIndexResult:
    """Index the image files under ``hr_src`` (and ``cfg.lr``) and write the manifest to ``out`` (a
    folder: ``out/manifest.json``, or a ``.json`` URL)."""
    t0 = time.perf_counter()
    folder, name = locate(out.rstrip("/"))
    ofs, oroot = storage.open_dir(folder, cfg.storage_options)
    target = storage.join(oroot, name)
    for src in (hr_src, *cfg.lr):
        sfs, sroot = storage.open_dir(src, cfg.storage_options)
        if type(sfs) is type(ofs) and (oroot + "/").startswith(sroot.rstrip("/") + "/"):
            raise FileIndexError(f"-o {out}: inside the source {src}; an index is written outside its sources")
    if ofs.exists(target) and not cfg.overwrite:
        raise FileIndexError(f"{out}: an index exists there; give --overwrite to replace it")
    skips = mf.Skips(log)
    data = _manifest(hr_src, cfg, skips).dumps()  # the listing, pairs and entries are gone by now: memory
    m = mf.parse(data, out, compact=True)  # as readers see it (columns): checked before it is written
    ofs.makedirs(oroot, exist_ok=True)
    storage.write_atomic(ofs, colindex.index_path(target), colindex.encode(m, data))  # first: the manifest commits
    storage.write_atomic(ofs, target, data)
    return FileIndexResult(m, storage.url_of(ofs, target), skips.first, skips.count, time.perf_counter() - t0)


def _manifest(hr_src: str, cfg: FileIndexConfig, skips: mf.Skips) -> mf.Manifest:
    """The index of the files under ``hr_src``: listed, paired and read once each (the scan's sizer),
    then grouped; what the scan held of each file goes when this returns."""
    with tqdm(unit="file", desc="index", disable=not cfg.progress) as bar:
        read = FileReads(cfg.workers, cfg.max_pixels, cfg.digest, lambda: bar.update(1))  # one read a file, in the scan
        pairs, scan_skips, _ = scan_sources(
            [hr_src], cfg.lr, cfg.mod_crop, cfg.on_error, cfg.storage_options, cfg.lr_pattern, sizer=read
        )
    pairs = order_samples(pairs, cfg.seed, None)
    names = _names(pairs)
    roots = FileRoots(
        _root_of(pairs[0].hr, pairs[0].hr_rel),
        {s: _root_of(u, rel) for s, u, rel in pairs[0].lr},
        "xxh3_64" if cfg.digest else "stamp",
    )
    if not cfg.digest:
        log.warning(
            "--no-digest: the index trusts sizes and ETag/mtime; content rewritten under an unchanged stamp is not noticed"
        )
    for sk in scan_skips:
        skips.add(sk.to_json(), sk.reason, sk.path)
    entries: list[dict[int | None, FileEntry] | InputError] = []
    for p in pairs:
        try:
            entries.append(_sample(p, cfg, read))
        except InputError as exc:
            entries.append(exc)
    good, kind = _keep(pairs, entries, cfg, skips)
    skips.summarise()
    if not good:
        raise FileIndexError(f"{hr_src}: no usable image in {len(pairs)}")
    build = {"tool": "shardmaker index", "version": __version__, "seed": cfg.seed, **skips.to_build()}
    members = mf.MemberNames(names[None], {s: n for s, n in names.items() if s is not None})
    return mf.Manifest(
        mf.codec_of(names[None]),
        sorted(roots.lr),
        "provided" if roots.lr else "none",
        _groups(good, names, cfg.group_bytes),
        build,
        members=members,
        channels=kind[0],
        bit_depth=kind[1],
        files=roots,
    )


def _keep(
    pairs: list[Pair], entries: list[Any], cfg: FileIndexConfig, skips: mf.Skips
) -> tuple[list[tuple[Pair, dict[int | None, FileEntry]]], tuple[int, int]]:
    """The pairs whose files were read, of the dataset's one kind (the first good sample's)."""
    good: list[tuple[Pair, dict[int | None, FileEntry]]] = []
    kind: tuple[int, int] | None = None
    for p, e in zip(pairs, entries, strict=True):
        why = mf.key_problem(p.key)  # as build refuses it: the key is the file's path
        if why is not None:
            e = InputError(p.hr, f"its key {p.key!r} {why}")
        if not isinstance(e, InputError):
            head = e[None].header
            kind = kind or (head.channels, head.bit_depth)
            if (head.channels, head.bit_depth) != kind:
                e = InputError(p.hr, f"is {mf.kind_text(head.channels, head.bit_depth)}, the index {mf.kind_text(*kind)}")
        if isinstance(e, InputError):
            if cfg.on_error is OnError.FAIL:
                raise FileIndexError(f"{e} (--on-error skip leaves it out)")
            skips.add({"path": e.path, "reason": e.reason}, e.reason, e.path)
            continue
        good.append((p, e))
    return good, kind or (3, 8)


def _groups(good: list[tuple[Pair, dict[int | None, FileEntry]]], names: dict[int | None, str], limit: int) -> list[mf.ShardInfo]:
    """Consecutive samples in groups of about ``limit`` bytes of files (one sample at least)."""
    groups: list[list[tuple[Pair, dict[int | None, FileEntry]]]] = [[]]
    total = 0
    for item in good:
        n = sum(e.size for e in item[1].values())
        if groups[-1] and total + n > limit:
            groups.append([])
            total = 0
        groups[-1].append(item)
        total += n
    out = []
    for g, items in enumerate(groups):
        files = {}
        for side, name in names.items():
            rel = [p.hr_rel if side is None else next(r for s, _, r in p.lr if s == side) for p, _ in items]
            files[name] = FileColumns(
                rel,
                _column([e[side].size for _, e in items], "int64"),
                _column([e[side].xxh3_64 for _, e in items], "uint64"),
            )
        keys = [p.key for p, _ in items]
        offsets, size = group_layout([sum(e.size for e in x.values()) for _, x in items])
        hr_sizes = [[e[None].header.width, e[None].header.height] for _, e in items]
        out.append(
            mf.ShardInfo(f"files-{g:06d}.tar", len(items), size, group_digest(keys, files), keys, offsets, hr_sizes, files=files)
        )
    return out


def _column(values: list[int], dtype: str) -> np.ndarray:
    return np.array(values, dtype=dtype)
