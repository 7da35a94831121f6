"""``shardmaker build``: sources -> deterministic tar shards + manifest, resumable, parallel.

Order of events (what makes it crash-safe):
1. scan and pair the sources, sort by key, seeded shuffle, take this part's slice;
2. per shard: stream samples into ``shard-N.tar.partial``; record the finished entry under
   ``_build/``; rename the shard to its final name;
3. write ``manifest.json`` (or the part manifest) last, atomically; drop ``_build/``.
A rerun finds the recorded, complete shards, keeps them, and continues after them.

One dataset holds one kind of image: the first written sample's channels and bit depth are the
manifest's ``channels`` and ``bit_depth``; a source of another kind (a grey photo among RGB ones,
16-bit among 8-bit) is a bad input (``--on-error``), as is one whose key the format refuses.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import multiprocessing
import time
from collections import deque
from collections.abc import Generator
from typing import Any

import fsspec
import numpy as np
from tqdm import tqdm

from shardmaker import storage
from shardmaker.builder import outdir
from shardmaker.builder.clips import clip_record, scan_clips
from shardmaker.builder.config import (
    WRITER_REVISION,
    BuildConfig,
    BuildResult,
    shard_name,
)
from shardmaker.builder.fromindex import check_files, load_files_index, pairs_of
from shardmaker.builder.output import Output
from shardmaker.builder.sample import EncodedSample, LrMethod, encode_or_skip
from shardmaker.builder.sources import Collector, Pair, Skipped, scan_sources, split_regions
from shardmaker.builder.writer import ShardWriter
from shardmaker.errors import BuildError, InputError, OnError, brief
from shardmaker.format import SampleHeader, tario
from shardmaker.format.colindex import write_manifest
from shardmaker.format.manifest import (
    FORMAT,
    MANIFEST,
    Dropped,
    Manifest,
    ManifestError,
    ShardInfo,
    Skips,
    key_problem,
    kind_text,
)
from shardmaker.format.manifest import parse as parse_manifest
from shardmaker.version import __version__

log = logging.getLogger("shardmaker.builder")


def _content_hashes(pairs: list[Pair], opts: BuildConfig) -> list[str]:
    """sha256 of every source file (``--strict-resume``)."""
    out = []
    for p in tqdm(pairs, desc="hash sources", unit="img", disable=not opts.progress):
        h = hashlib.sha256()
        for url in [p.hr] + [u for _, u, _ in p.lr]:
            fs, path = fsspec.core.url_to_fs(url, **opts.sample.storage_options)
            with storage.open_input(fs, path) as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
        out.append(h.hexdigest())
    return out


def _hr_sources(opts: BuildConfig) -> tuple[str, ...]:
    return (opts.hr_src,) if isinstance(opts.hr_src, str) else tuple(opts.hr_src)


def _refuse_out_inside_sources(opts: BuildConfig) -> None:
    """OUT inside an HR (or LR) folder: a later scan would walk the build's own output; refused."""
    fs, out = fsspec.core.url_to_fs(opts.out, **(opts.sample.storage_options or {}))
    for src in (*_hr_sources(opts), *opts.lr_srcs):
        if "{" in src:
            continue  # a brace pattern names files, not a folder to walk
        fs2, root = fsspec.core.url_to_fs(src, **(opts.sample.storage_options or {}))
        if type(fs2) is type(fs) and (out.rstrip("/") + "/").startswith(root.rstrip("/") + "/"):
            raise BuildError(f"{opts.out}: OUT is inside the source folder {src}; choose an OUT outside it")


def fingerprint(pairs: list[Pair], opts: BuildConfig) -> str:
    """Hash of everything that decides the dataset's bytes: sources by name, pixel size, file size
    and modification stamp (content hash with ``strict_resume``), and the flags. A source edited in
    place changes it, so a rerun rebuilds instead of keeping stale shards."""
    cfg = opts.sample
    doc = {
        "format": FORMAT,
        "writer": WRITER_REVISION,
        "pairs": [[p.key, p.hr_rel, list(p.hr_size), [[s, rel] for s, _, rel in p.lr], list(p.stamps)] for p in pairs],
        "content": _content_hashes(pairs, opts) if opts.strict_resume else None,
        "codec": cfg.codec.value,
        "png_level": cfg.png_level,
        "lr_method": cfg.lr_method.value,
        "scales": sorted(cfg.scales) if cfg.lr_method not in (LrMethod.PROVIDED, LrMethod.NONE) else None,
        "mod_crop": cfg.mod_crop,
        "drop_alpha": cfg.drop_alpha,
        "shard_size": opts.shard_size,
        "max_samples": opts.max_samples,
        "seed": opts.seed,
        "parts": opts.part[1] if opts.part else None,
        "skip_errors": opts.on_error is OnError.SKIP,  # key kept: fingerprints of earlier builds stay valid
    }
    if opts.lr_pattern is not None:  # only when given: fingerprints of builds without one stay valid
        doc["lr_pattern"] = opts.lr_pattern
    if cfg.tiles != "off":  # the same: untiled builds keep their fingerprints
        doc["tiles"] = cfg.tiles
    if any(p.region is not None for p in pairs):  # and builds of images no larger than a region
        doc["region"] = cfg.region
    if cfg.min_valid:
        doc["min_valid"] = cfg.min_valid
    if opts.clips is not None:
        doc["clips"] = [opts.clips.segment, opts.clips.max_span]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def order_samples(pairs: list[Pair], seed: int, part: tuple[int, int] | None) -> list[Pair]:
    """Key-sorted pairs in a seeded random order; with a part, its contiguous slice."""
    perm = np.random.default_rng(seed).permutation(len(pairs))
    ordered = [pairs[i] for i in perm]
    if part is None:
        return ordered
    i, n = part
    lo, hi = i * len(ordered) // n, (i + 1) * len(ordered) // n
    return ordered[lo:hi]


def _encoded(todo: list[Pair], opts: BuildConfig) -> Generator[EncodedSample | Skipped, None, None]:
    """Encode in order; with several workers keep a bounded window of samples in flight."""
    if opts.workers == 1 or len(todo) <= 1:
        for pair in todo:
            yield encode_or_skip(pair, opts.sample, opts.on_error)
        return
    ctx = multiprocessing.get_context("spawn")  # no fork: fsspec/s3fs hold threads and loops
    with cf.ProcessPoolExecutor(opts.workers, mp_context=ctx) as pool:
        window: deque[cf.Future] = deque()
        pending = iter(todo)
        try:
            for pair in pending:
                window.append(pool.submit(encode_or_skip, pair, opts.sample, opts.on_error))
                if len(window) >= 2 * opts.workers:
                    yield window.popleft().result()
            while window:
                yield window.popleft().result()
        finally:
            for fut in window:
                fut.cancel()


def _good_keys(pairs: list[Pair], on_error: OnError) -> tuple[list[Pair], list[Skipped]]:
    """The pairs whose key the format takes; the others refused (``fail``) or skipped, with the reason."""
    good, skipped = [], []
    for p in pairs:
        why = key_problem(p.key)
        if why is None:
            good.append(p)
        elif on_error is OnError.SKIP:
            skipped.append(Skipped(p.hr, f"its key {brief(p.key)} {why}"))
        else:
            raise InputError(p.hr, f"its key {brief(p.key)} {why} (--on-error skip leaves it out)")
    return good, skipped


def _log_skips(skipped: list[Skipped]) -> None:
    skips = Skips(log)
    for s in skipped:
        skips.add({}, s.reason, s.path)
    skips.summarise()


def _kind_of(tar_bytes: bytes, where: str) -> tuple[int, int]:
    """``(channels, bit_depth)`` of an encoded sample, from its ``{key}.json`` (its first member)."""
    first = next(tario.iter_entries(io.BytesIO(tar_bytes), limit=len(tar_bytes)))
    header = SampleHeader.parse(first.data, where, tario.split_name(first.name)[0])
    return header.channels, header.bit_depth


def _kept_kind(out: Output, shards: list[ShardInfo]) -> tuple[int, int] | None:
    """The kind of the samples in shards kept from an earlier run: their first sample's."""
    if not shards:
        return None
    data = storage.read_range(out.fs, out.path(shards[0].name), 0, min(shards[0].bytes, 1 << 16))
    return _kind_of(data + tario.END_OF_ARCHIVE, shards[0].name)


def _of_kind(
    item: EncodedSample, path: str, kind: tuple[int, int] | None, opts: BuildConfig
) -> tuple[tuple[int, int], EncodedSample | Skipped]:
    """``(the dataset's kind, item)`` where ``item`` is of that kind (the first sample's, when ``kind`` is
    None); else a ``Skipped`` in its place (``skip``) or an ``InputError``."""
    got = _kind_of(item.tar_bytes, path)
    kind = kind or got
    if got == kind:
        return kind, item
    why = f"is {kind_text(*got)}, the dataset {kind_text(*kind)} (its first sample's kind); one dataset holds one kind"
    if opts.on_error is OnError.SKIP:
        return kind, Skipped(path, why)
    raise InputError(path, f"{why} (--on-error skip leaves it out)")


def _regions(opts: BuildConfig, pairs: list[Pair]) -> dict[str, Any]:
    """The build's ``regions`` record: the region side, how many source images were split and into
    how many region samples (absent when no image is larger than a region); or its ``clips`` record."""
    if opts.clips is not None:
        return {"clips": clip_record(pairs, opts.clips)}
    split = [p for p in pairs if p.region is not None]
    if not split:
        return {}
    return {"regions": {"side": opts.sample.region, "images": len({p.hr for p in split}), "samples": len(split)}}


def _manifest(
    opts: BuildConfig,
    fp: str,
    shards: list[ShardInfo],
    skipped: list[Skipped],
    n_total: int,
    kind: tuple[int, int] | None,
    regions: dict[str, Any],
) -> Manifest:
    cfg = opts.sample
    scales = sorted(cfg.scales)
    skips, dropped = Skips(), Dropped(cfg.min_valid)
    for s in skipped:
        if s.valid is not None:
            dropped.add(s.key, s.path, s.valid)
        else:
            skips.add(s.to_json(), s.reason, s.path, logged=False)
    return Manifest(
        codec=cfg.codec.value,
        scales=scales,
        lr_method=cfg.lr_method.value,
        shards=shards,
        build={
            "fingerprint": fp,
            "tool": f"shardmaker {__version__}",
            "seed": opts.seed,
            "png_level": cfg.png_level,
            "shard_size": opts.shard_size,
            "max_samples": opts.max_samples,
            "mod_crop": cfg.mod_crop,
            "part": list(opts.part) if opts.part else None,
            "sources": n_total,  # source images (one split into regions counts once)
            **skips.to_build(),
            **dropped.to_build(),
            **regions,
        },
        channels=kind[0] if kind else None,
        bit_depth=kind[1] if kind else None,
    )


def _scan(opts: BuildConfig) -> tuple[list[Pair], list[Skipped], list[str]]:
    """The samples to build: clip segments (``--clips``), or image pairs, those larger than a region split."""
    cfg = opts.sample
    if opts.clips is not None:
        if len(_hr_sources(opts)) != 1 or opts.lr_pattern is not None:
            raise BuildError("--clips takes one folder of clips (and --lr folders of LR clips; no --lr-pattern)")
        hr, lr = _hr_sources(opts)[0], opts.lr_srcs
        return scan_clips(hr, lr, opts.clips, cfg.mod_crop, opts.on_error, cfg.storage_options, cfg.max_pixels, cfg.drop_alpha)
    if opts.from_index is not None:
        pairs, skipped, ignored = _indexed(opts)
    else:
        pairs, skipped, ignored = scan_sources(
            _hr_sources(opts), opts.lr_srcs, cfg.mod_crop, opts.on_error, cfg.storage_options, opts.lr_pattern
        )
    out = Collector(opts.on_error)  # an image over --max-pixels (also one read by region) is refused before planning
    pairs = split_regions(pairs, cfg.region, None if opts.lr_srcs else cfg.scales or (1,), cfg.max_pixels, out)
    if not pairs and out.skipped:
        raise InputError(out.skipped[0].path, f"{out.skipped[0].reason} (no usable source left)")
    return pairs, [*skipped, *out.skipped], ignored


def _indexed(opts: BuildConfig) -> tuple[list[Pair], list[Skipped], list[str]]:
    """``--from IDX``: the index's pairs (as the scan of its folder gives them), each file checked against
    the index first (size, xxh3_64): a changed one stops the build, or with ``--on-error skip`` is left out."""
    assert opts.from_index is not None
    m = load_files_index(opts.from_index, opts.sample.storage_options)
    bad = check_files(m, opts.sample.storage_options, max(1, opts.workers), opts.progress)
    pairs, skipped = [], []
    for p in pairs_of(m):
        if p.key in bad:
            url, _, reason = bad[p.key].partition(": ")
            if opts.on_error is OnError.FAIL:
                raise InputError(url, reason)
            skipped.append(Skipped(url, reason))
        else:
            pairs.append(p)
    if not pairs:
        raise BuildError(f"{opts.from_index}: every file changed since it was indexed; nothing to build")
    return pairs, skipped, []


def from_index(opts: BuildConfig) -> BuildConfig:
    """``opts`` with the sources of its index (``--from``): its HR root, its LR roots (provided LR)."""
    if opts.from_index is None:
        return opts
    m = load_files_index(opts.from_index, opts.sample.storage_options)
    assert m.files is not None
    return dataclasses.replace(opts, hr_src=m.files.hr, lr_srcs=tuple(m.files.lr[s] for s in sorted(m.files.lr)))


def build(opts: BuildConfig) -> BuildResult:
    """Run a whole (or part) build; see the module docstring for the crash-safety contract."""
    t0 = time.perf_counter()
    opts = from_index(opts)
    _refuse_out_inside_sources(opts)
    pairs, skipped_scan, ignored = _scan(opts)
    pairs, bad_keys = _good_keys(pairs, opts.on_error)
    _log_skips(skipped_scan + bad_keys)
    if not pairs and bad_keys:
        raise BuildError(f"{', '.join(_hr_sources(opts))}: every source was skipped; nothing to write")
    skipped_scan += bad_keys
    if opts.lr_srcs:
        scales = tuple(s for s, _, _ in pairs[0].lr)
        if opts.sample.scales and set(opts.sample.scales) != set(scales):
            raise BuildError(f"--scale {list(opts.sample.scales)} does not match the LR folders' scales {list(scales)}")
        opts = dataclasses.replace(opts, sample=dataclasses.replace(opts.sample, scales=scales, lr_method=LrMethod.PROVIDED))
    elif opts.sample.lr_method is LrMethod.PROVIDED:
        raise BuildError("lr_method 'provided' needs LR folders (--lr)")
    if opts.lr_srcs and opts.sample.lr_method is LrMethod.NONE:
        raise BuildError("--hr-only stores no LR: leave out --lr")
    fp = fingerprint(pairs, opts)
    out = Output(opts, fp)
    outdir.refuse_dangerous(out.fs, out.root, opts.out)
    if out.fs.exists(out.root) and not out.fs.isdir(out.root):
        raise BuildError(f"{opts.out}: is a file, not a folder for shards")
    lock = ".shardmaker.lock" if opts.part is None else f".shardmaker-part-{opts.part[0]:04d}.lock"
    with outdir.locked(out.fs, out.root, opts.out, lock):
        res = _build_locked(opts, out, pairs, skipped_scan, t0)
    clips = {p.clip.clip for p in order_samples(pairs, opts.seed, opts.part) if p.clip is not None}
    return dataclasses.replace(res, ignored=ignored, clips=len(clips))


def _build_locked(opts: BuildConfig, out: Output, pairs: list[Pair], skipped_scan: list[Skipped], t0: float) -> BuildResult:
    fp = out.fp
    todo_all = order_samples(pairs, opts.seed, opts.part)
    manifest_path = out.path(out.final_name)
    done_manifest, conflict = out.finished()
    if done_manifest is not None:
        log.info("%s is already built (same sources and flags); nothing to do", manifest_path)
        return BuildResult(
            manifest_path,
            done_manifest.samples,
            len(done_manifest.shards),
            done_manifest.bytes,
            len(done_manifest.shards),
            skipped_scan,
            time.perf_counter() - t0,
            opts.part is None,
            storage.url_of(out.fs, manifest_path),
        )
    conflict = out.conflict(conflict)
    staging = out.path(outdir.STAGING)
    if opts.part is None and (conflict is not None or out.fs.exists(storage.join(staging, MANIFEST))):
        out._refuse(conflict or "holds an unfinished replacement")
        return _replace(opts, out, staging)

    shards, start, skipped = out.prepare(conflict)
    if shards:
        log.info("resuming: %d finished shards kept, continuing at sample %d of %d", len(shards), start, len(todo_all))
    out.fs.makedirs(out.root, exist_ok=True)
    todo = todo_all[start:]
    reused = len(shards)
    unit = "segment" if opts.clips else "img"
    bar = tqdm(total=len(todo_all), initial=start, unit=unit, desc="build", disable=not opts.progress, dynamic_ncols=True)
    writer: ShardWriter | None = None
    encoded: Generator[EncodedSample | Skipped, None, None] | None = None
    written = 0
    t_start = time.perf_counter()
    kind, skips = _kept_kind(out, shards), Skips(log)
    try:
        index = start
        encoded = _encoded(todo, opts)
        for item in encoded:
            index += 1
            if isinstance(item, EncodedSample):
                kind, item = _of_kind(item, todo[index - start - 1].hr, kind, opts)
            if isinstance(item, Skipped):
                _left_out(item, skips, skipped)
            else:
                size = len(item.tar_bytes)
                if (
                    writer is not None
                    and writer.samples
                    and (
                        writer.offset + size + 1024 > opts.shard_size
                        or (opts.max_samples is not None and writer.samples >= opts.max_samples)
                    )
                ):
                    shards.append(_close(writer, out, index - 1, skipped))
                    writer = None
                if writer is None:
                    writer = ShardWriter(out.fs, out.root, shard_name(len(shards), opts.part))
                writer.add(item)
                written += size
            bar.update(1)
            bar.set_postfix_str(f"{written / 1e6 / max(time.perf_counter() - t_start, 1e-9):.1f} MB/s", refresh=False)
        if writer is not None:
            shards.append(_close(writer, out, index, skipped))
            writer = None
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        if encoded is not None:
            encoded.close()  # on an error: shut the encoding processes down now, not at garbage collection
        bar.close()
        skips.summarise()
    if not shards and todo_all:
        raise BuildError(f"{', '.join(_hr_sources(opts))}: every sample was skipped; nothing to write")
    if not todo_all and opts.part is not None:
        log.warning("part %d/%d has no samples (more parts than images); writing an empty part", *opts.part)
    scan_skips = skipped_scan if opts.part is None or opts.part[0] == 0 else []  # listed once
    skipped_all = scan_skips + skipped
    manifest = _manifest(opts, fp, shards, skipped_all, len({p.hr for p in pairs}), kind, _regions(opts, pairs))
    try:
        write_manifest(out.fs, manifest_path, manifest, index=opts.part is None)  # and manifest.json.idx
    except OSError as exc:
        raise BuildError(f"writing {manifest_path} failed: {exc}") from None
    out.cleanup(shards)
    return BuildResult(
        manifest_path,
        manifest.samples,
        len(shards),
        manifest.bytes,
        reused,
        [s for s in skipped_all if s.valid is None],
        time.perf_counter() - t0,
        opts.part is None,
        storage.url_of(out.fs, manifest_path),
        dropped=[s for s in skipped_all if s.valid is not None],
    )


def _replace(opts: BuildConfig, out: Output, staging: str) -> BuildResult:
    """``--overwrite`` of a whole dataset: build the new one in OUT/_staging (resumable there), and
    only once it is complete swap it in; a failed build leaves the old dataset as it was."""
    known: set[str] = set()
    with contextlib.suppress(FileNotFoundError, ManifestError):
        known = {s.name for s in parse_manifest(storage.read_bytes(out.fs, storage.join(staging, MANIFEST)), staging).shards}
    doomed, records = out.replaceable(known)
    log.warning("--overwrite: building the new dataset in %s; the old one stays until it is complete", staging)
    res = build(dataclasses.replace(opts, out=storage.url_of(out.fs, staging), overwrite=False))
    outdir.swap_in(out.fs, out.root, staging, doomed, records)
    final = out.path(MANIFEST)
    return dataclasses.replace(res, manifest_path=final, manifest_url=storage.url_of(out.fs, final))


def _left_out(item: Skipped, skips: Skips, skipped: list[Skipped]) -> None:
    """A skipped source (logged, a few per reason) or a sample ``--min-valid`` dropped (not an error)."""
    if item.valid is None:
        skips.add({}, item.reason, item.path)
    else:
        log.debug("dropping %s: %s", item.key, item.reason)
    skipped.append(item)


def _close(writer: ShardWriter, out: Output, next_sample: int, skipped: list[Skipped]) -> ShardInfo:
    info = writer.finish()
    try:
        out.record(info, next_sample, skipped)
    except OSError as exc:
        writer.abort()
        raise BuildError(f"recording {info.name} in {out.state_root} failed: {exc}") from None
    writer.publish()
    return info
