"""What WebDataset users write, turned into a dataset folder and the shards to stream.

``SRDataset`` accepts a dataset folder or prefix (with its ``manifest.json``), a brace pattern of
shard URLs (``s3://bucket/ds/shard-{000000..000127}.tar``, expanded as ``braceexpand`` does, counted
first and refused above ``shardmaker.format.MAX_NAMES``: ``shardmaker.format.expand_braces``), or a
list of shard URLs. The manifest is the one beside the shards, or the one given with
``manifest=``; the shards must be in its folder (a shard's location is always ``folder + "/" +
name``, see ``docs/format.md``) and listed by it. The dataset is then those shards, in the
manifest's order.
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
from collections.abc import Sequence
from typing import Any

from shardmaker import format as fmt
from shardmaker import storage


@dataclasses.dataclass(frozen=True)
class Resolved:
    folder: str  # the dataset folder URL: where the manifest and the shards are
    manifest: str  # the manifest's file name in it
    shards: tuple[str, ...] | None  # shard names chosen by the URLs; None: every shard of the manifest


def _is_shard_spec(url: str) -> bool:
    return "{" in url or url.rstrip("/").endswith(".tar")


def dataset_folders(spec: str | Sequence[str]) -> list[str] | None:
    """The dataset folders of a mix (a list of folders, not of shard URLs), or None."""
    if isinstance(spec, str):
        return None
    items = list(spec)
    shardish = [_is_shard_spec(u) for u in items]
    if items and not any(shardish):
        if len(set(u.rstrip("/") for u in items)) != len(items):
            raise ValueError("a dataset folder is given twice; give it a larger weight instead")
        return items
    if any(shardish) and not all(shardish):
        raise ValueError("give either shard URLs (one dataset) or dataset folders (a mix), not both")
    return None


def _split(url: str) -> tuple[str, str]:
    """``(folder URL, name)`` of a file URL, keeping the protocol."""
    head, _, name = url.rstrip("/").rpartition("/")
    if not head or not name:
        raise ValueError(f"{url}: not a file URL (expected .../NAME)")
    return head, name


def resolve(spec: str | Sequence[str], manifest: str | None = None) -> Resolved:
    """The dataset folder, manifest name and chosen shards for ``spec`` (see the module docstring)."""
    if isinstance(spec, str) and not _is_shard_spec(spec):
        if manifest is not None:
            folder, name = _split(manifest)
            if folder.rstrip("/") != spec.rstrip("/"):
                raise ValueError(f"manifest={manifest!r} is not in the dataset folder {spec!r}")
            return Resolved(folder, name, None)
        return Resolved(spec, fmt.MANIFEST, None)
    urls = fmt.expand_braces(spec)
    if not urls:
        raise ValueError("no shard URLs given")
    folders, names = zip(*(_split(u) for u in urls), strict=True)
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"shard {dup} is given twice")
    folder = folders[0]
    if manifest is not None:
        folder, name = _split(manifest)
    else:
        name = fmt.MANIFEST
    for url, f in zip(urls, folders, strict=True):
        if f.rstrip("/") != folder.rstrip("/"):
            raise ValueError(f"{url}: not in {folder}, the folder of the manifest; a dataset's shards live beside its manifest")
    return Resolved(folder, name, tuple(names))


def select(m: fmt.Manifest, r: Resolved, storage_options: dict[str, Any] | None = None) -> fmt.Manifest:
    """The manifest cut down to the chosen shards (manifest order); a URL the manifest does not list
    or that is not there is named."""
    if r.shards is None:
        return m
    listed = {s.name: s for s in m.shards}
    for name in r.shards:
        if name not in listed:
            raise ValueError(f"{storage.join(r.folder, name)}: not listed in {storage.join(r.folder, r.manifest)}")
    fs, root = storage.open_dir(r.folder, storage_options)
    present = {posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)}
    for name in r.shards:
        if name not in present:
            raise FileNotFoundError(f"{storage.join(r.folder, name)}: no such shard (the manifest lists it)")
    chosen = set(r.shards)
    names = [s.name for s in m.shards if s.name in chosen]
    identity = hashlib.sha256("\n".join([m.digest, *names]).encode()).hexdigest()  # the file and the shards chosen
    return dataclasses.replace(m, shards=[s for s in m.shards if s.name in chosen], identity=identity)
