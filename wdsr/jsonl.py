"""JSON-lines files read in bounded memory: ``metrics.jsonl`` carried over by ``wdsr train`` and drawn by
``wdsr plot``. A file is read in chunks, a line at a time; a line longer than the bound is skipped to its
newline, never held whole."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

MAX_LINE = 1 << 20  # a line wdsr train writes is under 1 KB (the last one: a digest per rank)
CHUNK = 1 << 16


def lines(f: BinaryIO, bound: int = MAX_LINE, chunk: int = CHUNK) -> Iterator[bytes | None]:
    """The lines of ``f``, each with its newline if it had one; ``None`` for a line longer than ``bound``
    (never held whole: memory stays under ``bound`` + a chunk, whatever the line's length)."""
    parts: list[bytes] = []  # the current line's pieces (no newline in them)
    size, over = 0, False
    while data := f.read(chunk):
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if over or size + end - start > bound:
                yield None
            else:
                yield b"".join((*parts, data[start : end + 1])) if parts else data[start : end + 1]
            parts, size, over, start = [], 0, False, end + 1
        if not over and start < len(data):
            if size + len(data) - start > bound:
                parts, size, over = [], 0, True  # skipped from here to its newline
            else:
                parts.append(data[start:])
                size += len(data) - start
    if over or parts:
        yield None if over else b"".join(parts)
