"""Loading a dataset's manifest: from ``manifest.json``, or memory-mapped from its column index
(``manifest.json.idx``) where it has one made from it. Above :mod:`.manifest` (the schema) and
:mod:`.colread` (the mapped index), which both stand without it."""

from __future__ import annotations

from typing import Any

from shardmaker import storage
from shardmaker.errors import InputError
from shardmaker.format.colindex import index_path
from shardmaker.format.colread import open_indexed
from shardmaker.format.manifest import Manifest, parse
from shardmaker.format.schema import MANIFEST, ManifestError

__all__ = ["load", "load_index", "locate"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def locate(url: str) -> tuple[str, str]:
    """``(dataset folder, manifest name)`` of ``url``: a dataset folder, or the URL of a manifest in it
    with another name (``shardmaker index -o``)."""
    if url.endswith(".json"):
        folder, _, name = url.rpartition("/")
        return folder or ".", name
    return url, MANIFEST


def load(
    url: str, storage_options: dict[str, Any] | None = None, compact: bool = False, name: str = MANIFEST, index: bool = True
) -> Manifest:
    """Read ``URL/manifest.json`` (URL is the dataset folder); ``compact``: per-sample data in
    numpy columns (what the streaming reader holds in every process), from the column index
    beside the manifest (``manifest.json.idx``, memory-mapped) when it has one made from it
    (``index=False``: from the JSON all the same)."""
    fs, root = storage.open_dir(url, storage_options)
    path = storage.join(root, name)
    try:
        if compact and index:
            indexed = open_indexed(fs, path, storage_options)
            if indexed is not None:
                return indexed
        raw = storage.read_bytes(fs, path)
    except FileNotFoundError:
        raise ManifestError(f"{url}: no {MANIFEST} (not a shard set, or its build did not finish)") from None
    except InputError as exc:  # a FIFO, a directory or a device at the name: never read (it would block)
        raise ManifestError(path, None, exc.reason) from None
    except PermissionError as exc:
        raise PermissionError(
            f"{url}: access denied reading {MANIFEST} ({_first_line(exc)}); check the credentials "
            "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or storage_options)"
        ) from None
    return parse(raw, path, compact=compact)


def load_index(url: str, storage_options: dict[str, Any] | None = None, name: str = MANIFEST) -> tuple[bool, Manifest | None]:
    """``(there is a column index, the manifest as read from it)``: what the streaming reader uses
    (None: it parses the JSON, as there is no index or it was made from another manifest). An index
    that breaks a rule, or is not a regular file, is a :class:`ManifestError`."""
    fs, root = storage.open_dir(url, storage_options)
    path = storage.join(root, name)
    present = fs.exists(index_path(path))
    return present, open_indexed(fs, path, storage_options) if present else None
