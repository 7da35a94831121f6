"""Stream samples into one tar shard, published atomically with its sha256 and offsets."""

from __future__ import annotations

import collections
import hashlib

import fsspec

from shardmaker import storage
from shardmaker.builder.pack import EncodedSample
from shardmaker.errors import BuildError
from shardmaker.format import tario
from shardmaker.format.manifest import PROBE_BYTES, ShardInfo, probe_of


class ShardWriter:
    """Write to a temp name; ``finish`` completes the tar and returns its manifest entry.

    The caller publishes with ``publish`` once it has recorded the entry, or ``abort``s: no
    partial shard is ever visible under the final name.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, name: str) -> None:
        self.fs, self.name = fs, name
        self.path = storage.join(root, name)
        self.temp = storage.temp_name(fs, self.path)
        self._sha = hashlib.sha256()
        self._head = bytearray()  # first and last MiB, for the manifest's probe
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_bytes = 0
        self.offset = 0
        self.keys: list[str] = []
        self.offsets: list[int] = []
        self.hr_sizes: list[list[int]] = []
        self.tiles: list[int] = []  # HR tile side per sample, 0: whole
        try:
            self._f = fs.open(self.temp, "wb")
        except OSError as exc:
            raise BuildError(f"cannot create {self.temp}: {exc}") from None

    @property
    def samples(self) -> int:
        return len(self.keys)

    def _write(self, data: bytes) -> None:
        try:
            self._f.write(data)
        except OSError as exc:
            raise BuildError(f"write to {self.temp} failed: {exc}") from None
        self._sha.update(data)
        self.offset += len(data)
        if len(self._head) < PROBE_BYTES:
            self._head += data[: PROBE_BYTES - len(self._head)]
        self._tail.append(data)
        self._tail_bytes += len(data)
        while self._tail_bytes - len(self._tail[0]) >= PROBE_BYTES:
            self._tail_bytes -= len(self._tail.popleft())

    def add(self, sample: EncodedSample) -> None:
        self.keys.append(sample.key)
        self.offsets.append(self.offset)
        self.hr_sizes.append(list(sample.hr_size))
        self.tiles.append(sample.tiles)
        self._write(sample.tar_bytes)

    def finish(self) -> ShardInfo:
        self._write(tario.END_OF_ARCHIVE)
        try:
            self._f.close()
        except OSError as exc:
            raise BuildError(f"closing {self.temp} failed: {exc}") from None
        return ShardInfo(
            name=self.name,
            samples=self.samples,
            bytes=self.offset,
            sha256=self._sha.hexdigest(),
            keys=self.keys,
            offsets=self.offsets,
            hr_sizes=self.hr_sizes,
            probe=probe_of(self._head, b"".join(self._tail)[-PROBE_BYTES:]),
            tiles=self.tiles if any(self.tiles) else None,  # the column only where a sample is tiled
        )

    def publish(self) -> None:
        try:
            storage.publish(self.fs, self.temp, self.path)
        except OSError as exc:
            raise BuildError(f"publishing {self.path} failed: {exc}") from None

    def abort(self) -> None:
        """Drop the unfinished shard. On an object store the upload is aborted, never completed:
        closing it would publish a torn shard under its final name."""
        try:
            if storage.is_object_store(self.fs) and hasattr(self._f, "discard"):
                self._f.discard()  # s3fs: abort the multipart upload
                self._f.closed = True  # and never complete it on close / garbage collection
            else:
                self._f.close()
        except Exception:  # noqa: BLE001 - already failing; the temp file goes next
            pass
        storage.discard(self.fs, self.temp)
