"""The output folder's safety rules: one build at a time, and ``--overwrite`` that never loses data.

* A build holds an exclusive ``flock`` on ``OUT/.shardmaker.lock`` (a part build on its own
  ``.shardmaker-part-IIII.lock``); a second build into the same folder stops at once with the
  holder's pid and host. The kernel drops the lock when its process dies, so no stale lock stays.
  Object stores have no such lock: there, one build per prefix is the user's to arrange.
* ``--overwrite`` builds the new dataset in ``OUT/_staging``; only once its manifest is complete
  does :func:`swap_in` replace the old one, deleting only files a wdsr manifest or build record in
  OUT lists. ``/``, the home folder, and folders whose ``manifest.json`` is not a wdsr manifest,
  or that hold shard-named files no wdsr record lists, are refused.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec

from shardmaker import storage
from shardmaker.errors import BuildError
from shardmaker.format.colindex import write_manifest
from shardmaker.format.manifest import MANIFEST, ManifestError, ShardInfo, parse

log = logging.getLogger(__name__)
STAGING = "_staging"
_REPLACES = "replaces.json"
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,250}")  # one file name: what swap_in may delete


@contextlib.contextmanager
def locked(fs: fsspec.AbstractFileSystem, root: str, url: str, name: str = ".shardmaker.lock") -> Iterator[None]:
    """Hold the folder's build lock (local folders); BuildError naming the holder if it is taken."""
    if not storage.is_local(fs):
        yield
        return
    import fcntl

    fs.makedirs(root, exist_ok=True)
    path = os.path.join(root, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = False
        except BlockingIOError:
            held = True
        if held:  # raised outside the handler: the EAGAIN that found it is no storage outage (exit 2, not 69)
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
                who = f"pid {holder.get('pid')} on {holder.get('host')}"
            except ValueError:
                who = "another process"
            raise BuildError(
                f"{url} is being written by another shardmaker ({who}, lock {path}); wait for it to finish or stop it"
            )
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)  # while still holding it; nobody waits on it (LOCK_NB)
    finally:
        os.close(fd)


def refuse_dangerous(fs: fsspec.AbstractFileSystem, root: str, url: str) -> None:
    """Never write a dataset into / or the home folder."""
    if storage.is_local(fs):
        real = os.path.realpath(root)
        if real == os.path.sep or real == os.path.realpath(Path.home()):
            raise BuildError(f"{url}: refusing to build into {real} (choose a folder of its own for the dataset)")


def _read_json(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    try:
        return json.loads(storage.read_bytes(fs, path))
    except FileNotFoundError:
        return None
    except (ValueError, RecursionError):
        return ...  # present but not JSON


def listed_names(
    fs: fsspec.AbstractFileSystem, root: str, url: str, part_manifests: list[str], records: dict[str, Any]
) -> set[str]:
    """Files of OUT that wdsr wrote, by what its manifests and build records list. A manifest.json
    that is not a wdsr manifest is refused: it belongs to someone else."""
    names: set[str] = set()
    for name in [MANIFEST, *part_manifests]:
        try:
            raw = storage.read_bytes(fs, storage.join(root, name))
        except FileNotFoundError:
            continue
        try:
            m = parse(raw, storage.join(root, name), allow_empty=True)
        except ManifestError as exc:
            raise BuildError(
                f"{url}: {name} is not a wdsr manifest ({exc.reason or exc}); refusing to replace "
                "or delete anything in this folder, even with --overwrite"
            ) from None
        names.add(name)
        names.update(s.name for s in m.shards)
    for record in records.values():
        try:
            names.add(ShardInfo.from_json(record.get("shard") if isinstance(record, dict) else None).name)
        except ManifestError:
            continue
    return names


def swap_in(fs: fsspec.AbstractFileSystem, root: str, staging: str, old_names: set[str], old_records: list[str]) -> None:
    """Replace the old dataset in ``root`` by the complete one in ``staging``; safe to rerun after a crash.

    Order: note what to delete, drop the old manifest (the old dataset is no longer committed),
    delete the old files, move the new shards in, write the new manifest last, drop staging.
    """
    replaces = storage.join(staging, _REPLACES)
    noted = _read_json(fs, replaces)
    if not isinstance(noted, dict):
        noted = {"names": sorted(old_names), "records": sorted(old_records)}
        storage.write_atomic(fs, replaces, json.dumps(noted).encode())
    new = parse(storage.read_bytes(fs, storage.join(staging, MANIFEST)), storage.join(staging, MANIFEST))
    new_names = {s.name for s in new.shards}
    storage.discard(fs, storage.join(root, MANIFEST))
    for name in noted["names"]:
        if name != MANIFEST and name not in new_names and _PLAIN.fullmatch(name) and ".." not in name:
            storage.discard(fs, storage.join(root, name))
    for rec in noted["records"]:
        if _PLAIN.fullmatch(rec) and ".." not in rec:
            storage.discard(fs, storage.join(root, f"_build/{rec}"))
    for s in new.shards:
        src, dst = storage.join(staging, s.name), storage.join(root, s.name)
        if fs.exists(src):
            storage.discard(fs, dst)
            fs.mv(src, dst)
    write_manifest(fs, storage.join(root, MANIFEST), new)  # and its column index, before it
    for leftover in fs.ls(staging, detail=False):
        storage.discard(fs, leftover)
    with contextlib.suppress(OSError, FileNotFoundError):
        fs.rmdir(staging)
    log.info("replaced the previous dataset in %s", root)
