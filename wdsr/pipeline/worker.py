"""A DataLoader worker's set-up: one torch thread, and glibc's malloc kept from returning every
decode buffer to the OS (``worker_init`` is the ``worker_init_fn`` of every wdsr loader)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os

import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_malloc() -> bool:
    """Keep large decode buffers in the heap instead of mmap/munmap per image (glibc only).

    Each 4K decode allocates 25-60 MB; glibc maps and unmaps such blocks every time and the
    page faults cost +25% decode time on PNG. Returns whether the settings took.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 * 1024 * 1024) == 1
        return bool(libc.mallopt(_M_TRIM_THRESHOLD, 512 * 1024 * 1024) == 1 and ok)
    except (OSError, AttributeError):
        return False


def worker_init(_worker_id: int) -> None:
    """SIGTERM is left as torch set it in the worker, before this runs (a handler in C that replaces
    any the trainer installed, such as ``wdsr train``'s checkpoint-then-exit): from the trainer
    process (multiprocessing terminating its workers at exit) the worker exits cleanly; from anyone
    else it dies as by default. Setting SIG_DFL here made every script that exited with persistent
    workers alive print "DataLoader worker ... is killed by signal: Terminated".

    The worker leaves its rank's process group: torchrun stops a rank by signalling its whole group,
    which killed the workers under a rank that was checkpointing on that SIGTERM (it then crashed on
    "DataLoader worker ... killed" instead of exiting cleanly). The rank still ends them itself, and a
    worker whose parent dies exits (torch's watchdog)."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    torch.set_num_threads(1)
    tune_malloc()
