"""Read samples of a shard span through fsspec, starting at the manifest offsets.

One range read per sample (``offsets[i]`` .. ``offsets[i+1]``), members parsed with our small
tar reader and grouped by key; only the members asked for are kept.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

from shardmaker import storage, tario
from shardmaker.manifest import Manifest
from wdsr.errors import SampleError
from wdsr.plan import Span


@dataclasses.dataclass
class RawSample:
    shard: str
    key: str
    index: int  # sample index inside the shard
    rep: int  # wrap-around count from the plan (0 = first pass)
    members: dict[str, bytes]  # member suffix ("json", "hr.png", ...) -> data; only the wanted ones
    nbytes: int
    read_ns: int
    loc: Span  # where it was read: this one sample, for reading it again


class ShardReader:
    """Opens shards of one dataset; the filesystem is made lazily, in the worker that reads."""

    def __init__(self, url: str, manifest: Manifest, storage_options: dict[str, Any] | None = None) -> None:
        self.url, self.manifest = url, manifest
        self.storage_options = dict(storage_options or {})
        self._fs = None
        self._root = ""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"] = None  # filesystems (and their event loops) are not shared across processes
        return state

    def _open_fs(self) -> None:
        if self._fs is None:
            self._fs, self._root = storage.open_dir(self.url, self.storage_options)

    def span(self, span: Span, wanted: frozenset[str]) -> Iterator[RawSample]:
        """Samples of ``span`` in order, with only the ``wanted`` member suffixes."""
        self._open_fs()
        info = self.manifest.shards[span.shard]
        path = storage.join(self._root, info.name)
        try:
            size = self._fs.size(path)
        except FileNotFoundError:
            raise SampleError(info.name, None, f"shard is missing ({path})") from None
        if size != info.bytes:
            raise SampleError(info.name, None, f"shard has {size} bytes, the manifest says {info.bytes} (truncated or replaced)")
        with self._fs.open(path, "rb") as f:
            f.seek(info.offsets[span.start])
            for i in range(span.start, span.stop):
                begin = info.offsets[i]
                end = info.offsets[i + 1] if i + 1 < info.samples else info.bytes
                t0 = time.perf_counter_ns()
                f.seek(begin)
                members = _members(f, end - begin, info.name, info.keys[i], wanted)
                nbytes = sum(len(v) for v in members.values())
                yield RawSample(info.name, info.keys[i], i, span.rep, members, nbytes, time.perf_counter_ns() - t0,
                                Span(span.shard, i, i + 1, span.rep))


def _members(f: Any, length: int, shard: str, key: str, wanted: frozenset[str]) -> dict[str, bytes]:
    """The wanted members of the sample that starts at ``f``'s position and spans ``length`` bytes."""
    out: dict[str, bytes] = {}

    def want(name: str) -> bool:
        k, ext = tario.split_name(name)
        if k != key:
            raise SampleError(shard, key, f"found member {name!r} where the manifest puts sample {key!r}")
        return ext in wanted

    try:
        for name, _, payload in tario.iter_members(f, limit=length, want=want):
            out[tario.split_name(name)[1]] = payload
    except tario.TarFormatError as exc:
        raise SampleError(shard, key, f"bad tar data ({exc})") from None
    return out
