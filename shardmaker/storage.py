"""The few fsspec operations we need, with atomic publication of finished files.

Local and in-memory filesystems get "write temp, then rename". Object stores (S3, GCS, Azure)
publish an object only when its upload completes, so we write the final name directly there.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from collections.abc import Iterator
from typing import Any, BinaryIO

import fsspec
from fsspec.core import url_to_fs

from shardmaker.errors import InputError

__all__ = [
    "naming",
    "discard",
    "file_stamp",
    "is_local",
    "is_object_store",
    "is_s3",
    "join",
    "open_dir",
    "open_input",
    "open_regular",
    "publish",
    "read_bytes",
    "read_local",
    "read_range",
    "size_of",
    "temp_name",
    "url_of",
    "write_atomic",
]

PARTIAL_SUFFIX = ".partial"
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"}


def open_dir(url: str, storage_options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """Filesystem and root path (no trailing slash) for a directory URL or local path."""
    fs, root = url_to_fs(url, **(storage_options or {}))
    return fs, root.rstrip("/") or "/"


def join(root: str, name: str) -> str:
    return posixpath.join(root, name)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return tuple(fs.protocol) if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)


def is_object_store(fs: fsspec.AbstractFileSystem) -> bool:
    return any(p in _OBJECT_STORES for p in _protocols(fs))


def is_s3(fs: fsspec.AbstractFileSystem) -> bool:
    return any(p in ("s3", "s3a") for p in _protocols(fs))


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return any(p in ("file", "local") for p in _protocols(fs))


def url_of(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """A path another process can open with ``fsspec.open``: local paths stay plain."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def temp_name(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """Where a file is written before it is published under ``path``."""
    return path if is_object_store(fs) else path + PARTIAL_SUFFIX


def publish(fs: fsspec.AbstractFileSystem, temp: str, path: str) -> None:
    """Make a completely written temp file visible under its final name."""
    if temp != path:
        fs.mv(temp, path)


def discard(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Remove a file if it is there; used on error paths, so it never raises."""
    try:
        if fs.exists(path):
            fs.rm(path)
    except Exception:  # noqa: BLE001 - best effort cleanup after another error
        pass


@contextlib.contextmanager
def naming(target: str) -> Iterator[None]:
    """An ``OSError`` that says no file (a full disk's bare ``[Errno 28] No space left on device``, a
    write past a quota) raised while ``target`` is written is raised again naming ``target``, with
    its errno (and so its exit code) kept."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, f"{exc.strerror or exc} (writing)", target) from exc
        raise


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see all of it or nothing; a failed write names ``path``."""
    temp = temp_name(fs, path)
    try:
        with naming(url_of(fs, path)):
            with fs.open(temp, "wb") as f:
                f.write(data)
            publish(fs, temp, path)
    except BaseException:
        discard(fs, temp)
        raise


def read_bytes(fs: fsspec.AbstractFileSystem, path: str) -> bytes:
    """The whole file at ``path``; a local one must be a regular file (``open_input``)."""
    with open_input(fs, path) as f:
        return f.read()


def read_local(path: str) -> bytes:
    """The whole local file at ``path``, which must be a regular file (``open_regular``)."""
    with open_regular(path) as f:
        return f.read()


def size_of(fs: fsspec.AbstractFileSystem, path: str) -> int:
    """The size of the file at ``path``; a local one must be a regular file (``open_regular``)."""
    if not is_local(fs):
        return int(fs.size(path))
    with open_regular(path) as f:
        return os.fstat(f.fileno()).st_size


def file_stamp(fs: fsspec.AbstractFileSystem, path: str, f: Any = None) -> str:
    """What changes when the file at ``path`` is rewritten: its mtime_ns (local; of the open file ``f``
    when given), else its ETag (or modification time) as the store reports it now."""
    if is_local(fs):
        return str((os.fstat(f.fileno()) if f is not None else os.stat(path)).st_mtime_ns)
    info = fs.info(path, refresh=True) if is_s3(fs) else fs.info(path)
    return str(info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or "").strip('"')


def read_range(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the file at ``path``; a local one must be a regular file (``open_input``)."""
    if not is_local(fs):
        return fs.cat_file(path, start=start, end=end)  # type: ignore[no-any-return]
    with open_regular(path) as f:
        f.seek(start)
        return f.read(max(0, end - start))


def _kind(mode: int) -> str:
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISSOCK: "a socket", stat.S_ISCHR: "a character device"}
    kinds.update({stat.S_ISBLK: "a block device", stat.S_ISDIR: "a directory", stat.S_ISLNK: "a symbolic link"})
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def open_regular(path: str, follow_symlinks: bool = True) -> BinaryIO:
    """Open a local file that is not ours for reading, never blocking on it: THE opener of every local
    file shardmaker and wdsr read that another process could have replaced (manifests, column indexes,
    shards, sources, checkpoints, run files, configs); ``tests/test_house.py`` keeps it the only one.

    ``open()`` on a FIFO waits for a writer forever, and a device reads without end; here the file is
    opened non-blocking, checked to be a regular file on the open descriptor (no race between the
    check and the open), then read normally. ``follow_symlinks=False`` also refuses a link.
    Raises ``InputError`` naming the path and what it is instead.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow_symlinks and os.path.islink(path):
            raise InputError(path, "is a symbolic link; refused here") from None
        raise e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InputError(path, f"is {_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return open(fd, "rb", closefd=True)  # house: the opener itself
    except BaseException:
        os.close(fd)
        raise


def open_input(fs: fsspec.AbstractFileSystem, path: str, **kwargs: Any) -> Any:
    """``fs.open(path, "rb", **kwargs)`` for a file that is not ours: a local one must be a regular file.

    Local files are opened with ``open_regular`` (the fsspec options are for remote reads); remote
    stores only hold objects.
    """
    if is_local(fs):
        return open_regular(path)
    return fs.open(path, "rb", **kwargs)
