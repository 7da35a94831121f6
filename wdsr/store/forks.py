"""A forked process keeps the async filesystems it inherited from its parent, and never closes them.

A forked process (a DataLoader worker) inherits its parent's fsspec filesystems: those in fsspec's
instance cache (which fsspec empties in the child when the child makes its first one), those held by
objects the child drops, and garbage not collected yet. An async one (s3fs, gcsfs) holds a finalizer
that closes its session on the event loop of the process that made it. Run in the child, whenever the
cyclic collector happens to reach the filesystem, that finalizer either waits a second for the
parent's loop (which has no thread in the child) or, when the collector runs on the child's own
event-loop thread, awaits the parent's futures there and logs "Task exception was never retrieved
... attached to a different loop". Closing the parent's connections from the child would also take
their sockets out of the epoll set the two processes share.

So, right after a fork, each such filesystem is kept alive for the life of the child and its
finalizer is detached: the parent closes its own sessions, and the kernel the child's copies of
their sockets when the child exits. The child makes its own filesystems, on its own loop.
"""

from __future__ import annotations

import weakref
from typing import Any

from fsspec.asyn import AsyncFileSystem

__all__ = ["keep_inherited"]

_KEPT: list[Any] = []  # the parent's filesystems, alive until this process exits


def keep_inherited() -> None:
    """In a forked child: keep every async filesystem that has a finalizer, and detach the finalizer.

    Registered by :mod:`wdsr.store.remote` with ``os.register_at_fork``. Every object alive at the
    fork belongs to the parent. ``weakref.finalize._registry`` holds the live finalizers (a CPython
    detail since 3.4; without it nothing is done).
    """
    for fin in list(getattr(weakref.finalize, "_registry", ())):
        found = fin.peek()
        if found is not None and isinstance(found[0], AsyncFileSystem):
            _KEPT.append(found[0])
            fin.detach()
