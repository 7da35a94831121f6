"""``shardmaker merge``: the part manifests of a ``--part I/N`` build joined into ``manifest.json``."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from shardmaker import storage
from shardmaker.errors import BuildError
from shardmaker.format.colindex import write_manifest
from shardmaker.format.manifest import MANIFEST, Dropped, Manifest, ManifestError, Skips, kind_text, shard_path
from shardmaker.format.manifest import parse as parse_manifest

log = logging.getLogger("shardmaker.builder")


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


def _kind(channels: int | None, bit_depth: int | None) -> str:
    if channels is None or bit_depth is None:
        return "images of an unrecorded kind (an older shardmaker built it)"
    return f"{kind_text(channels, bit_depth)} images"


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
    kinds = {(pm.channels, pm.bit_depth): i for i, pm in reversed(list(enumerate(manifests))) if pm.shards}
    if len(kinds) > 1:
        (a, i), (b, j) = sorted(kinds.items(), key=lambda kv: kv[1])[:2]
        raise BuildError(
            f"{out_url}: part {i} holds {_kind(*a)}, part {j} {_kind(*b)}; one dataset holds one kind "
            "(convert the odd sources, or build them as another dataset and mix the two)"
        )
    channels, bit_depth = next(iter(kinds), (None, None))
    shards = [s for pm in manifests for s in pm.shards]
    for s in shards:
        try:
            size = fs.size(shard_path(root, s.name))
        except FileNotFoundError:
            raise BuildError(f"{out_url}: shard {s.name} listed by a part manifest is missing") from None
        if size != s.bytes:
            raise BuildError(f"{out_url}: shard {s.name} has {size} bytes, its part manifest says {s.bytes}")
    skips, dropped = Skips(), Dropped()
    for pm in manifests:
        skips.extend(pm.build)
        dropped.extend(pm.build)
    build_info = dict(first.build, part=None, parts=total, **skips.to_build(), **dropped.to_build())
    merged = Manifest(first.codec, first.scales, first.lr_method, shards, build_info, channels=channels, bit_depth=bit_depth)
    write_manifest(fs, storage.join(root, MANIFEST), merged)  # and its column index
    return merged
