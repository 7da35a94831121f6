"""``shardmaker build``: sources -> deterministic tar shards + manifest, resumable, parallel.

Order of events (what makes it crash-safe):
1. scan and pair the sources, sort by key, seeded shuffle, take this part's slice;
2. per shard: stream samples into ``shard-N.tar.partial``; record the finished entry under
   ``_build/``; rename the shard to its final name;
3. write ``manifest.json`` (or the part manifest) last, atomically; drop ``_build/``.
A rerun finds the recorded, complete shards, keeps them, and continues after them.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import re
import time
from collections import deque
from collections.abc import Generator
from typing import Any

import fsspec
import numpy as np
from tqdm import tqdm

import shardmaker
from shardmaker import _compat, outdir, storage
from shardmaker.errors import BuildError, OnError
from shardmaker.format.manifest import FORMAT, MANIFEST, Manifest, ManifestError, ShardInfo, shard_path
from shardmaker.format.manifest import parse as parse_manifest
from shardmaker.sample import EncodedSample, LrMethod, SampleConfig, encode_or_skip
from shardmaker.sources import Pair, Skipped, scan_sources
from shardmaker.writer import ShardWriter

log = logging.getLogger(__name__)
STATE_DIR = "_build"
WRITER_REVISION = 4  # bump when the bytes written for the same inputs change (3: xxh3_64 in {key}.json; 4: probe)
_SHARD_RE = re.compile(r"^shard-(?:\d{4}-)?\d{6}\.tar$")


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    hr_src: str | tuple[str, ...]  # a folder; several folders or brace patterns of files (keys prefixed)
    out: str
    lr_srcs: tuple[str, ...] = ()
    sample: SampleConfig = dataclasses.field(default_factory=lambda: SampleConfig(scales=(4,)))
    shard_size: int = 256 * 10**6
    max_samples: int | None = None
    workers: int = 1
    seed: int = 0
    part: tuple[int, int] | None = None  # (index, count)
    on_error: OnError = OnError.FAIL
    overwrite: bool = False
    progress: bool = True
    strict_resume: bool = False  # resume only over sources whose content hash is unchanged (reads them all once)
    skip_errors: dataclasses.InitVar[bool | None] = None  # deprecated: on_error=OnError.SKIP

    def __post_init__(self, skip_errors: bool | None) -> None:
        if skip_errors is not None:
            _compat.warn("BuildConfig(skip_errors=...)", "BuildConfig(on_error=OnError.SKIP)", stacklevel=4)
            object.__setattr__(self, "on_error", OnError.SKIP if skip_errors else OnError.FAIL)
        object.__setattr__(self, "on_error", OnError(self.on_error))
        if self.shard_size < 4096:
            raise ValueError(f"--shard-size must be at least 4096 bytes, got {self.shard_size}")
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"--max-samples must be >= 1, got {self.max_samples}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.part is not None and not (0 <= self.part[0] < self.part[1]):
            raise ValueError(f"--part I/N needs 0 <= I < N, got {self.part[0]}/{self.part[1]}")


@dataclasses.dataclass
class BuildResult:
    manifest_path: str
    samples: int
    shards: int
    bytes: int
    reused_shards: int
    skipped: list[Skipped]
    seconds: float
    complete: bool  # False for a part: run `shardmaker merge` once every part is done


def shard_name(index: int, part: tuple[int, int] | None) -> str:
    return f"shard-{index:06d}.tar" if part is None else f"shard-{part[0]:04d}-{index:06d}.tar"


def part_manifest_name(part: tuple[int, int]) -> str:
    return f"manifest.part-{part[0]:04d}-of-{part[1]:04d}.json"


def _content_hashes(pairs: list[Pair], opts: BuildConfig) -> list[str]:
    """sha256 of every source file (``--strict-resume``)."""
    out = []
    for p in tqdm(pairs, desc="hash sources", unit="img", disable=not opts.progress):
        h = hashlib.sha256()
        for url in [p.hr] + [u for _, u, _ in p.lr]:
            with fsspec.open(url, "rb", **opts.sample.storage_options) as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
        out.append(h.hexdigest())
    return out


def _hr_sources(opts: BuildConfig) -> tuple[str, ...]:
    return (opts.hr_src,) if isinstance(opts.hr_src, str) else tuple(opts.hr_src)


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
        "scales": sorted(cfg.scales) if cfg.lr_method is not LrMethod.PROVIDED else None,
        "mod_crop": cfg.mod_crop,
        "drop_alpha": cfg.drop_alpha,
        "shard_size": opts.shard_size,
        "max_samples": opts.max_samples,
        "seed": opts.seed,
        "parts": opts.part[1] if opts.part else None,
        "skip_errors": opts.on_error is OnError.SKIP,  # key kept: fingerprints of earlier builds stay valid
    }
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


class _Output:
    """The output folder: what is there, and what we may overwrite or resume."""

    def __init__(self, opts: BuildConfig, fp: str) -> None:
        self.opts, self.fp = opts, fp
        self.fs, self.root = storage.open_dir(opts.out, opts.sample.storage_options)
        self.state_root = storage.join(self.root, STATE_DIR)
        self.final_name = MANIFEST if opts.part is None else part_manifest_name(opts.part)

    def path(self, name: str) -> str:
        return storage.join(self.root, name)

    def _ours(self, name: str) -> bool:
        part = self.opts.part
        if part is None:
            return bool(_SHARD_RE.match(name))
        return name.startswith(f"shard-{part[0]:04d}-") and bool(_SHARD_RE.match(name))

    def listing(self) -> list[str]:
        if not self.fs.exists(self.root):
            return []
        return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False))

    def read_json(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads(storage.read_bytes(self.fs, self.path(name)))
        except FileNotFoundError:
            return None
        except ValueError:
            return {}

    def finished(self) -> tuple[Manifest | None, str | None]:
        """The manifest of an identical finished build, or why the folder holds another dataset."""
        for name in (MANIFEST, self.final_name):
            doc = self.read_json(name)
            if doc is None:
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("build", {}), dict):
                return None, f"{self.path(name)} is not a wdsr manifest"
            if doc.get("build", {}).get("fingerprint") == self.fp:
                return Manifest.from_json(doc, where=self.path(name), allow_empty=True), None
            if name == MANIFEST or self.opts.part is not None:
                return None, f"{self.path(name)} describes a different dataset"
        return None, None

    def _refuse(self, why: str) -> None:
        if not self.opts.overwrite:
            raise BuildError(f"{self.opts.out}: {why}; refusing to overwrite it (pass --overwrite to replace it)")

    def states(self) -> dict[str, dict[str, Any]]:
        if not self.fs.exists(self.state_root):
            return {}
        found = {}
        for p in self.fs.ls(self.state_root, detail=False):
            name = p.rsplit("/", 1)[-1]
            if name.endswith(".json") and self._ours(name[: -len(".json")]):
                try:
                    doc = json.loads(storage.read_bytes(self.fs, p))
                except (ValueError, RecursionError):
                    continue
                if isinstance(doc, dict) and {"fingerprint", "shard", "next_sample"} <= set(doc):
                    found[name[: -len(".json")]] = doc  # a build record of ours; anything else is left alone
        return found

    def conflict(self, conflict: str | None) -> str | None:
        """Why the folder holds something other than this build (None: empty, or ours to resume)."""
        states = self.states()
        recorded = {n for n, s in states.items() if s.get("fingerprint") == self.fp}
        foreign = sorted(set(states) - recorded)
        strays = [n for n in self.listing() if self._ours(n) and n not in recorded]
        if conflict is None and foreign:
            conflict = f"holds an unfinished build of a different dataset ({foreign[0]})"
        if conflict is None and strays and not recorded:
            conflict = f"already holds shards ({strays[0]}, ...) that this build did not write"
        return conflict

    def replaceable(self, extra_known: set[str] | frozenset[str] = frozenset()) -> tuple[set[str], list[str]]:
        """``(names to delete, build records to delete)`` of the dataset in the folder: only what a
        wdsr manifest or record lists; shard-named files nobody lists make it a refusal."""
        names = self.listing()
        records = self.states()
        parts = [n for n in names if n.startswith("manifest.part-") and n.endswith(".json")]
        if self.opts.part is not None:
            parts = [n for n in parts if n == self.final_name]
            records = {k: v for k, v in records.items() if self._ours(k)}
        listed = outdir.listed_names(self.fs, self.root, self.opts.out, parts, records)
        strays = [n for n in names if self._ours(n) and n not in listed and n not in extra_known]
        if strays:
            raise BuildError(
                f"{self.opts.out}: holds {strays[0]}, named like a shard, that no wdsr manifest or "
                "build record lists; refusing to delete it, even with --overwrite"
            )
        if self.opts.part is None:
            listed.discard(self.final_name)  # the whole-build swap writes it last
        return listed, [f"{k}.json" for k in records]

    def prepare(self, conflict: str | None) -> tuple[list[ShardInfo], int, list[Skipped]]:
        """Check the folder; return the reusable finished shards, samples done, skips so far."""
        states = self.states()
        names = self.listing()
        if conflict is not None:  # a part build with --overwrite: delete only what wdsr lists, in place
            self._refuse(conflict)
            doomed, records = self.replaceable()
            log.warning("--overwrite: removing the previous part in %s", self.opts.out)
            for n in doomed:
                storage.discard(self.fs, self.path(n))
            for r in records:
                storage.discard(self.fs, storage.join(self.state_root, r))
            states = {}
        for n in names:  # stale temp files from a killed build
            if n.endswith(storage.PARTIAL_SUFFIX) and (self._ours(n[: -len(storage.PARTIAL_SUFFIX)]) or n.startswith("manifest")):
                storage.discard(self.fs, self.path(n))
        reused: list[ShardInfo] = []
        done, skipped = 0, []
        while True:
            name = shard_name(len(reused), self.opts.part)
            st = states.get(name)
            if not st or st.get("fingerprint") != self.fp:
                break
            try:
                info = ShardInfo.from_json(st.get("shard"), where=self.path(f"_build/{name}.json"))
            except ManifestError:
                break  # a damaged record: rebuild from here
            try:
                if self.fs.size(self.path(name)) != info.bytes:
                    break
            except FileNotFoundError:
                break
            reused.append(info)
            done = int(st["next_sample"])
            skipped = [Skipped(**x) for x in st.get("skipped", [])]
        return reused, done, skipped

    def record(self, info: ShardInfo, next_sample: int, skipped: list[Skipped]) -> None:
        doc = {
            "fingerprint": self.fp,
            "shard": info.to_json(),
            "next_sample": next_sample,
            "skipped": [dataclasses.asdict(s) for s in skipped],
        }
        self.fs.makedirs(self.state_root, exist_ok=True)
        storage.write_atomic(self.fs, storage.join(self.state_root, info.name + ".json"), json.dumps(doc).encode())

    def cleanup(self, shards: list[ShardInfo]) -> None:
        """After the manifest: drop our state files and shards of ours the manifest lacks."""
        listed = {s.name for s in shards}
        for name in self.states():
            storage.discard(self.fs, storage.join(self.state_root, name + ".json"))
        try:
            if self.fs.exists(self.state_root) and not self.fs.ls(self.state_root, detail=False):
                self.fs.rmdir(self.state_root)
        except OSError:
            pass
        for n in self.listing():
            if self._ours(n) and n not in listed:
                storage.discard(self.fs, self.path(n))


def _manifest(opts: BuildConfig, fp: str, shards: list[ShardInfo], skipped: list[Skipped], n_total: int) -> Manifest:
    cfg = opts.sample
    scales = sorted(cfg.scales)
    return Manifest(
        codec=cfg.codec.value,
        scales=scales,
        lr_method=cfg.lr_method.value,
        shards=shards,
        build={
            "fingerprint": fp,
            "tool": f"shardmaker {shardmaker.__version__}",
            "seed": opts.seed,
            "png_level": cfg.png_level,
            "shard_size": opts.shard_size,
            "max_samples": opts.max_samples,
            "mod_crop": cfg.mod_crop,
            "part": list(opts.part) if opts.part else None,
            "sources": n_total,
            "skipped": [dataclasses.asdict(s) for s in skipped],
        },
    )


def build(opts: BuildConfig) -> BuildResult:
    """Run a whole (or part) build; see the module docstring for the crash-safety contract."""
    t0 = time.perf_counter()
    pairs, skipped_scan = scan_sources(
        _hr_sources(opts), opts.lr_srcs, opts.sample.mod_crop, opts.on_error, opts.sample.storage_options
    )
    if opts.lr_srcs:
        scales = tuple(s for s, _, _ in pairs[0].lr)
        if opts.sample.scales and set(opts.sample.scales) != set(scales):
            raise BuildError(f"--scale {list(opts.sample.scales)} does not match the LR folders' scales {list(scales)}")
        opts = dataclasses.replace(opts, sample=dataclasses.replace(opts.sample, scales=scales, lr_method=LrMethod.PROVIDED))
    elif opts.sample.lr_method is LrMethod.PROVIDED:
        raise BuildError("lr_method 'provided' needs LR folders (--lr)")
    fp = fingerprint(pairs, opts)
    out = _Output(opts, fp)
    outdir.refuse_dangerous(out.fs, out.root, opts.out)
    if out.fs.exists(out.root) and not out.fs.isdir(out.root):
        raise BuildError(f"{opts.out}: is a file, not a folder for shards")
    lock = ".shardmaker.lock" if opts.part is None else f".shardmaker-part-{opts.part[0]:04d}.lock"
    with outdir.locked(out.fs, out.root, opts.out, lock):
        return _build_locked(opts, out, pairs, skipped_scan, t0)


def _build_locked(opts: BuildConfig, out: _Output, pairs: list[Pair], skipped_scan: list[Skipped], t0: float) -> BuildResult:
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
    bar = tqdm(total=len(todo_all), initial=start, unit="img", desc="build", disable=not opts.progress, dynamic_ncols=True)
    writer: ShardWriter | None = None
    encoded: Generator[EncodedSample | Skipped, None, None] | None = None
    written = 0
    t_start = time.perf_counter()
    try:
        index = start
        encoded = _encoded(todo, opts)
        for item in encoded:
            index += 1
            if isinstance(item, Skipped):
                log.warning("skipping %s: %s", item.path, item.reason)
                skipped.append(item)
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
    if not shards and todo_all:
        raise BuildError(f"{', '.join(_hr_sources(opts))}: every sample was skipped; nothing to write")
    if not todo_all and opts.part is not None:
        log.warning("part %d/%d has no samples (more parts than images); writing an empty part", *opts.part)
    scan_skips = skipped_scan if opts.part is None or opts.part[0] == 0 else []  # listed once
    skipped_all = scan_skips + skipped
    manifest = _manifest(opts, fp, shards, skipped_all, len(pairs))
    try:
        storage.write_atomic(out.fs, manifest_path, manifest.dumps())
    except OSError as exc:
        raise BuildError(f"writing {manifest_path} failed: {exc}") from None
    out.cleanup(shards)
    return BuildResult(
        manifest_path,
        manifest.samples,
        len(shards),
        manifest.bytes,
        reused,
        skipped_all,
        time.perf_counter() - t0,
        opts.part is None,
    )


def _replace(opts: BuildConfig, out: _Output, staging: str) -> BuildResult:
    """``--overwrite`` of a whole dataset: build the new one in OUT/_staging (resumable there), and
    only once it is complete swap it in; a failed build leaves the old dataset as it was."""
    known: set[str] = set()
    with contextlib.suppress(FileNotFoundError, ManifestError):
        known = {s.name for s in parse_manifest(storage.read_bytes(out.fs, storage.join(staging, MANIFEST)), staging).shards}
    doomed, records = out.replaceable(known)
    log.warning("--overwrite: building the new dataset in %s; the old one stays until it is complete", staging)
    res = build(dataclasses.replace(opts, out=storage.url_of(out.fs, staging), overwrite=False))
    outdir.swap_in(out.fs, out.root, staging, doomed, records)
    return dataclasses.replace(res, manifest_path=out.path(MANIFEST))


def _close(writer: ShardWriter, out: _Output, next_sample: int, skipped: list[Skipped]) -> ShardInfo:
    info = writer.finish()
    try:
        out.record(info, next_sample, skipped)
    except OSError as exc:
        writer.abort()
        raise BuildError(f"recording {info.name} in {out.state_root} failed: {exc}") from None
    writer.publish()
    return info


class PartsPending(BuildError):
    """Not every part of a ``--part I/N`` build has written its part manifest yet."""


def merge_when_ready(
    out_url: str, wait_s: float, poll_s: float = 10.0, storage_options: dict[str, Any] | None = None
) -> Manifest:
    """``merge``, retried every ``poll_s`` while parts are still being built, for up to ``wait_s``
    seconds (a merge Job started next to the part builds waits for them)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return merge(out_url, storage_options)
        except PartsPending as exc:
            if time.monotonic() + poll_s > deadline:
                raise PartsPending(f"{exc} (waited {wait_s:g} s)") from None
            log.info("%s; checking again in %g s", exc, poll_s)
            time.sleep(poll_s)


def merge(out_url: str, storage_options: dict[str, Any] | None = None) -> Manifest:
    """Join the part manifests of a ``--part I/N`` build into ``manifest.json``."""
    fs, root = storage.open_dir(out_url, storage_options)
    try:
        names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False))
    except FileNotFoundError:
        raise PartsPending(f"{out_url}: no such folder (no part has finished)") from None
    rx = re.compile(r"^manifest\.part-(\d{4})-of-(\d{4})\.json$")
    parts = {}
    for n in names:
        m = rx.match(n)
        if m:
            parts[(int(m.group(1)), int(m.group(2)))] = n
    if not parts:
        raise PartsPending(f"{out_url}: no part manifests (manifest.part-IIII-of-NNNN.json) to merge")
    counts = {n for _, n in parts}
    if len(counts) != 1:
        raise BuildError(f"{out_url}: part manifests from builds with different part counts {sorted(counts)}")
    total = counts.pop()
    missing = [i for i in range(total) if (i, total) not in parts]
    if missing:
        raise PartsPending(f"{out_url}: parts {missing} of {total} are not finished yet")
    manifests = []
    for i in range(total):
        path = storage.join(root, parts[(i, total)])
        try:
            manifests.append(parse_manifest(storage.read_bytes(fs, path), path, allow_empty=True))
        except ValueError as exc:
            raise ManifestError(f"{path}: {exc}") from None
    fps = {m.build.get("fingerprint") for m in manifests}
    if len(fps) != 1:
        raise BuildError(f"{out_url}: parts were built from different sources or flags; rebuild them alike")
    first = manifests[0]
    for pm in manifests[1:]:
        if (pm.codec, pm.scales, pm.lr_method) != (first.codec, first.scales, first.lr_method):
            raise BuildError(f"{out_url}: parts disagree on codec/scales/lr_method")
    shards = [s for pm in manifests for s in pm.shards]
    for s in shards:
        try:
            size = fs.size(shard_path(root, s.name))
        except FileNotFoundError:
            raise BuildError(f"{out_url}: shard {s.name} listed by a part manifest is missing") from None
        if size != s.bytes:
            raise BuildError(f"{out_url}: shard {s.name} has {size} bytes, its part manifest says {s.bytes}")
    build_info = dict(first.build, part=None, parts=total, skipped=[x for m in manifests for x in m.build.get("skipped", [])])
    merged = Manifest(first.codec, first.scales, first.lr_method, shards, build_info)
    storage.write_atomic(fs, storage.join(root, MANIFEST), merged.dumps())
    return merged


__getattr__ = _compat.module_getattr(__name__, {"BuildOptions": ("shardmaker.build.BuildConfig", BuildConfig)})
