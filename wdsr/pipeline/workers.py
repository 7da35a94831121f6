"""The trainer's side of its DataLoader workers' lives: a dead worker is reported as one
:class:`WorkerDied`, raised where the trainer asks the loader for a batch (or a new pass), whichever
process or check noticed the death first.

torch notices a dead worker in two ways. A SIGCHLD handler in the trainer process raises in whatever
its main thread happens to run at that moment: between two batches that is the trainer's own code (a
checkpoint being written, a validation, a script's ``input()``), which then dies with a traceback
there instead of an error from the loop that could handle it, and which of the two a user sees
depended on how busy the machine was. And while the trainer waits for a batch, the workers are
checked every few seconds (``MP_STATUS_CHECK_INTERVAL``). A wdsr loader takes its workers off the
first (:func:`detach`) and reports the second, and any failed fetch while a worker is dead, the same
way (:func:`check`).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any, NoReturn

from torch.utils.data._utils import signal_handling


class WorkerDied(RuntimeError):
    """A DataLoader worker process died (killed by a signal, or exited) while the loader needed it:
    the batches it was to make are lost; resume from a checkpoint."""

    def __init__(self, dead: list[tuple[int, int]]) -> None:
        self.dead = dead  # (pid, exit code: -N when killed by signal N)
        pids = ", ".join(str(pid) for pid, _ in dead)
        how = ", ".join(_how(code) for _, code in dead)
        what = f"worker (pid {pids})" if len(dead) == 1 else f"workers (pids {pids})"
        super().__init__(f"DataLoader {what} died: {how}")


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def detach(it: Any) -> None:
    """Take the workers of DataLoader iterator ``it`` off torch's SIGCHLD check, which would raise
    in whatever the trainer runs when one dies (a no-op for an iterator without workers, or done)."""
    if getattr(it, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(it))
        it._worker_pids_set = False  # its shutdown then does not remove them again


def dead(it: Any) -> list[tuple[int, int]]:
    """``(pid, exit code)`` of each worker of ``it`` that has ended (none for an iterator without workers)."""
    out = []
    for w in getattr(it, "_workers", ()):
        code = w.exitcode  # None while it runs
        if code is not None:
            out.append((w.pid, code))
    return out


def ended(it: Any) -> None:
    """Raise :class:`WorkerDied` if a worker of ``it`` has died: killed or failed, or exited while
    torch still counted on it (one whose stream ended exits with status 0 once torch lets it go);
    nothing for an iterator without workers."""
    needed = getattr(it, "_workers_status", ())
    gone = [
        (w.pid, w.exitcode)
        for w, up in zip(getattr(it, "_workers", ()), needed, strict=False)
        if w.exitcode is not None and (up or w.exitcode != 0)
    ]
    if gone:
        raise WorkerDied(gone)


def check(it: Any, exc: BaseException) -> NoReturn:
    """Raise :class:`WorkerDied` for the failed fetch ``exc`` of ``it`` if one of its workers is
    dead (torch's "exited unexpectedly", or any other error the death caused); else ``exc`` itself."""
    gone = dead(it) if isinstance(exc, RuntimeError) else []
    if gone:
        raise WorkerDied(gone) from None
    raise exc


def watched(it: Any) -> Iterator[Any]:
    """The items of DataLoader iterator ``it``; a fetch that fails while a worker is dead raises :class:`WorkerDied`,
    and so does a fetch asked for after a worker died (at once: torch would notice at its next check,
    ``MP_STATUS_CHECK_INTERVAL`` seconds into the wait)."""
    while True:
        ended(it)
        try:
            item = next(it)
        except StopIteration:
            return
        except RuntimeError as exc:
            check(it, exc)
        yield item
