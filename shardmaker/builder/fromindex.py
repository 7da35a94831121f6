"""An index of image files (``shardmaker index DIR``) used by the other commands: its samples as
``build``'s sources (``build --from IDX``: the pairs the folder's scan gives, so the shards are the
ones a build from the folder writes), and its files checked against it (size and xxh3_64, or ETag/mtime:
``verify IDX``, ``build --from``, ``cat``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import xxhash
from tqdm import tqdm

from shardmaker import storage
from shardmaker.builder.sources import Pair
from shardmaker.errors import InputError, ShardmakerError
from shardmaker.format import load, locate
from shardmaker.format.files import MISSING
from shardmaker.format.manifest import Manifest, ShardInfo

log = logging.getLogger("shardmaker")
_CHUNK = 8 << 20


class NotAFileIndex(ShardmakerError, ValueError):
    """``--from`` names something that is not an index of image files."""


def load_files_index(url: str, storage_options: dict[str, Any] | None = None) -> Manifest:
    """The index at ``url`` (its folder, or its ``.json``); a NotAFileIndex if it names shards instead."""
    folder, name = locate(url.rstrip("/"))
    m = load(folder, storage_options, name=name)
    if m.files is None:
        raise NotAFileIndex(f"{url}: not an index of image files (make one with shardmaker index DIR --lr DIR | --hr-only)")
    return m


def file_url(m: Manifest, member: str, rel: str) -> str:
    """The URL (or local path) of file ``rel`` of ``member`` (``hr.png``, ``lr_x4.png``)."""
    assert m.files is not None and m.members is not None
    side = None if member == m.members.hr else next(s for s, n in m.members.lr.items() if n == member)
    return f"{m.files.root(side).rstrip('/')}/{rel}"


def samples_of(m: Manifest) -> Iterator[tuple[ShardInfo, int]]:
    """Every ``(group, index in it)``, in the index's order."""
    for info in m.shards:
        for i in range(info.samples):
            yield info, i


def pairs_of(m: Manifest) -> list[Pair]:
    """The index's samples as ``build``'s scan gives them (sorted by key); a file's stamp is its size
    and xxh3_64, so build's fingerprint changes with any file that changed."""
    assert m.members is not None
    out = []
    for info, i in samples_of(m):
        assert info.files is not None
        hr = info.files[m.members.hr]
        lr = []
        for s in sorted(m.members.lr):
            c = info.files[m.members.lr[s]]
            lr.append((s, file_url(m, m.members.lr[s], c.paths[i]), c.paths[i]))
        stamps = tuple(f"{int(c.bytes[i])}:{int(c.xxh3_64[i]):016x}" for c in (info.files[n] for n in m.members.names()))
        w, h = info.hr_sizes[i]
        out.append(Pair(info.keys[i], file_url(m, m.members.hr, hr.paths[i]), hr.paths[i], (int(w), int(h)), tuple(lr), stamps))
    return sorted(out, key=lambda p: p.key)


def file_problem(m: Manifest, info: ShardInfo, i: int, member: str, storage_options: dict[str, Any] | None) -> str | None:
    """Why file ``member`` of sample ``i`` is not the one the index recorded (None: it is), read in chunks."""
    assert info.files is not None and m.files is not None
    c = info.files[member]
    url = file_url(m, member, c.paths[i])
    want = (int(c.bytes[i]), int(c.xxh3_64[i]))
    fs, path = storage.open_dir(url, storage_options)
    try:
        with storage.open_input(fs, path) as f:
            stamp = storage.file_stamp(fs, path, f if storage.is_local(fs) else None) if m.files.stamped else None
            why = m.files.mismatch(want, storage.size_of(fs, path), stamp=stamp)  # before reading it all
            if why is not None:
                return f"{url}: {why}"
            h = xxhash.xxh3_64()
            while m.files.digested and (chunk := f.read(_CHUNK)):
                h.update(chunk)
    except FileNotFoundError:
        return f"{url}: {MISSING}"
    except InputError as exc:
        return f"{url}: {exc.reason}"
    except OSError as exc:
        return f"{url}: cannot be read ({exc.strerror or type(exc).__name__})"
    why = m.files.mismatch(want, want[0], h.intdigest() if m.files.digested else None)
    return None if why is None else f"{url}: {why}"


def check_files(
    m: Manifest, storage_options: dict[str, Any] | None = None, workers: int = 4, progress: bool = True
) -> dict[str, str]:
    """Every sample whose files are not the ones the index recorded: key -> the first problem."""
    assert m.members is not None

    def one(item: tuple[ShardInfo, int]) -> tuple[str, str | None]:
        info, i = item
        for name in m.members.names():  # type: ignore[union-attr]
            why = file_problem(m, info, i, name, storage_options)
            if why is not None:
                return info.keys[i], why
        return info.keys[i], None

    out: dict[str, str] = {}
    with ThreadPoolExecutor(workers) as pool, tqdm(total=m.samples, unit="img", desc="check", disable=not progress) as bar:
        for key, why in pool.map(one, samples_of(m)):
            bar.update(1)
            if why is not None:
                out[key] = why
    return out


def read_file(m: Manifest, info: ShardInfo, i: int, member: str, storage_options: dict[str, Any] | None) -> bytes:
    """File ``member`` of sample ``i``, whole, checked against the index (an InputError naming it if not)."""
    assert info.files is not None and m.files is not None
    c = info.files[member]
    url = file_url(m, member, c.paths[i])
    fs, path = storage.open_dir(url, storage_options)
    try:
        data = storage.read_bytes(fs, path)
    except FileNotFoundError:
        raise InputError(url, MISSING) from None
    xxh3 = xxhash.xxh3_64_intdigest(data) if m.files.digested else None
    stamp = storage.file_stamp(fs, path) if m.files.stamped else None
    why = m.files.mismatch((int(c.bytes[i]), int(c.xxh3_64[i])), len(data), xxh3, stamp)
    if why is not None:
        raise InputError(url, why)
    return data
