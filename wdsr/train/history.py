"""A run's history across attempts: ``OUT/metrics.jsonl`` and the TensorBoard files under ``OUT/tb``.

Every attempt of a run (a first start, each ``--resume`` of a replaced pod) continues the one history:

* At the start, the history is carried over from OUT's ``metrics.jsonl`` (downloaded when OUT is
  remote, into ``--log-dir`` which may be empty), up to the step the attempt starts from. Lines of
  later steps were logged by an attempt whose weights after them were never checkpointed: this
  attempt logs those steps again, and its lines replace them (each step once, in order). A torn last
  line (a process killed mid-write) is dropped, so the next line never lands on a fragment; a
  complete last line without its newline gets one. Unreadable lines (and lines over ``MAX_LINE``,
  skipped without being read whole) are dropped and counted in a warning.
* A remote OUT gets the whole file at every checkpoint (before the checkpoint, so OUT's history
  always reaches the step ``latest.json`` names) and at the end; TensorBoard files go to ``OUT/tb``
  at the same times. Each attempt writes its own event file there; it starts with TensorBoard's
  ``purge_step`` (the start step + 1), so TensorBoard too hides the steps the attempt logs again.

One writer: rank 0 of the one attempt running (a run is never trained by two attempts at once).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import BinaryIO

from shardmaker import storage
from wdsr.jsonl import MAX_LINE, lines
from wdsr.train.checkpoint import RunDir, RunError

log = logging.getLogger("wdsr")
NAME = "metrics.jsonl"


@dataclasses.dataclass(frozen=True)
class Carried:
    """What carrying a history over to a new attempt kept and dropped."""

    kept: int  # lines kept
    replayed: int  # lines of steps after the start step (this attempt logs those steps again)
    torn: bool  # the last line was a fragment
    unreadable: int  # other lines that were not JSON, or longer than MAX_LINE

    def __post_init__(self) -> None:
        if min(self.kept, self.replayed, self.unreadable) < 0:
            raise ValueError(f"line counts must be >= 0: {self}")


def _step(record: object) -> int | None:
    step = record.get("step") if isinstance(record, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def carry(src: BinaryIO, dst: BinaryIO, upto: int) -> Carried:
    """Copy the lines of ``src`` whose step is at most ``upto`` to ``dst``, repaired (see the module)."""
    kept = replayed = unreadable = 0
    torn = False
    for raw in lines(src):
        if raw is None:
            unreadable += 1
            continue
        complete = raw.endswith(b"\n")
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, nested past the parser's depth
            torn = torn or not complete
            unreadable += complete
            continue
        step = _step(record)
        if step is not None and step > upto:
            replayed += 1
            continue
        dst.write(raw if complete else raw + b"\n")
        kept += 1
    return Carried(kept, replayed, torn, unreadable)


def restore(run: RunDir, path: Path, upto: int) -> Carried | None:
    """Make the local file ``path`` (OUT's own ``metrics.jsonl`` when OUT is local) the run's history up to
    step ``upto``, read from OUT; None when OUT has no history yet (``path`` is then removed: a log
    dir's file of another run never joins this one)."""
    source = run.path(NAME)
    where = f"{run.url}/{NAME}"
    temp = path.with_name(path.name + ".partial")
    try:
        with storage.open_input(run.fs, source) as src, open(temp, "wb") as dst:
            carried = carry(src, dst, upto)
    except FileNotFoundError:
        temp.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        return None
    except ValueError as exc:  # InputError: a FIFO or a device at the name
        temp.unlink(missing_ok=True)
        raise RunError(str(exc)) from None
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    os.replace(temp, path)
    _report(where, upto, carried)
    return carried


def _report(where: str, upto: int, c: Carried) -> None:
    dropped = []
    if c.replayed:
        dropped.append(f"{c.replayed} lines of steps after {upto}, which this attempt logs again")
    if c.torn:
        dropped.append("a torn last line")
    if c.unreadable:
        dropped.append(f"{c.unreadable} unreadable lines (not JSON, or over {MAX_LINE >> 20} MiB)")
    if dropped:
        log.warning("metrics: %s: kept %d lines up to step %d; dropped %s", where, c.kept, upto, ", ".join(dropped))
    else:
        log.info("metrics: %s: continuing a history of %d lines (up to step %d)", where, c.kept, upto)


class Uploads:
    """The files of a local folder copied into a remote run folder; a file is sent again only once it changed."""

    def __init__(self, run: RunDir, folder: Path, under: str) -> None:
        self.run, self.folder, self.under = run, folder, under
        self.sent: dict[str, tuple[int, int]] = {}

    def sync(self) -> int:
        """Upload what is new or changed; the number of files sent."""
        sent = 0
        for file in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            rel = file.relative_to(self.folder).as_posix()
            st = file.stat()
            if self.sent.get(rel) == (st.st_size, st.st_mtime_ns):
                continue
            data = storage.read_local(str(file))
            self.run.upload(f"{self.under}/{rel}", data)
            self.sent[rel] = (len(data), st.st_mtime_ns) if len(data) == st.st_size else (-1, -1)
            sent += 1
        return sent
