"""Every shard a manifest names is there, whole: checked from one listing per folder, not one stat per shard.

What ``wdsr train --check`` runs before a Job starts training: a missing or truncated shard is bad input
(exit 2, the first ones named), not a retry loop in the training pods; a storage outage while listing
stays an outage (exit 69, see :mod:`shardmaker.exitcodes`).
"""

from __future__ import annotations

import posixpath
from collections import defaultdict
from typing import Any

import fsspec

from shardmaker import format as fmt
from shardmaker import storage

__all__ = ["ShardsMissing", "check_present"]

SHOWN = 3  # problems named in the message; the rest are counted


class ShardsMissing(ValueError):
    """Shards of a dataset are missing or have another size than the manifest says."""


def _listing(fs: fsspec.AbstractFileSystem, folder: str) -> dict[str, int | None]:
    """Sizes of the files in ``folder`` by name (None for a folder); empty when the folder does not exist."""
    fs.invalidate_cache(folder)  # a listing cached by an earlier call may predate a deletion
    try:
        entries = fs.ls(folder, detail=True)
    except FileNotFoundError:
        return {}
    out: dict[str, int | None] = {}
    for e in entries:
        name = posixpath.basename(str(e["name"]).rstrip("/"))
        out[name] = int(e["size"]) if e.get("type") == "file" and e.get("size") is not None else None
    return out


def problems(fs: fsspec.AbstractFileSystem, root: str, shards: list[Any]) -> list[str]:
    """One line per shard that is missing or whose size is not the manifest's ``bytes``, in manifest order."""
    by_folder: dict[str, list[tuple[int, str, Any]]] = defaultdict(list)
    for i, info in enumerate(shards):
        path = fmt.shard_path(root, info.name)
        by_folder[posixpath.dirname(path)].append((i, posixpath.basename(path), info))
    found: list[tuple[int, str]] = []
    for folder, members in by_folder.items():
        sizes = _listing(fs, folder)
        for i, base, info in members:
            size = sizes.get(base, -1)
            if size == -1:
                found.append((i, f"{info.name} is missing"))
            elif size is None:
                found.append((i, f"{info.name} is a folder, not a shard"))
            elif size != info.bytes:
                found.append((i, f"{info.name} has {size} bytes, the manifest says {info.bytes}"))
    return [line for _, line in sorted(found)]


def check_present(folder: str, manifest: fmt.Manifest, storage_options: dict[str, Any] | None = None) -> None:
    """Raise :class:`ShardsMissing` naming the first missing or truncated shards of ``manifest`` in ``folder``."""
    fs, root = storage.open_dir(folder, storage_options)
    bad = problems(fs, root, list(manifest.shards))
    if bad:
        more = f" (and {len(bad) - SHOWN} more)" if len(bad) > SHOWN else ""
        raise ShardsMissing(
            f"{folder}: {len(bad)} of {len(manifest.shards)} shards missing or truncated: "
            f"{'; '.join(bad[:SHOWN])}{more}; restore them or rebuild the dataset"
        )
