"""``python -m wdsr.train.launch [torchrun flags] -m wdsr train ...``: torchrun whose exit status is the
class of the rank that failed (shardmaker.exitcodes), not torchrun's 1 for every failure.

A Kubernetes Job decides on the pod's exit status (k8s/: 2 fails the run at once, 69 is retried within a
bounded budget, anything else counts as a crash), and torchrun reports any rank's failure as 1: a run
that fails for good (bad data, a diverged run) would be replayed into the same failure as a crash. This
runs torchrun's own launcher in this process (the same flags, PET_* variables and signal handling) and
maps what its ranks exited with to the pod's exit status (:func:`pod_exit_code`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure, record

from shardmaker.commandline import configure_logging
from shardmaker.exitcodes import ExitCode

log = logging.getLogger("wdsr")

# what a rank exits with when it failed on its own; its peers then fail with 1 or a signal (they lost
# it, or torchrun ended them), or 75 when they stopped with it at a peer's preemption
_ROOT_CAUSES = (ExitCode.BAD_INPUT, ExitCode.UNAVAILABLE, ExitCode.WORKER_DIED)


def pod_exit_code(failures: Mapping[int, ProcessFailure]) -> ExitCode:
    """The exit status for the pod from its failed ranks (global rank -> ``ProcessFailure``): the class
    of the first rank that failed with a root cause (2 bad input, 69 unavailable, 3 a DataLoader worker
    died); else 75 if a rank stopped for a peer; else 1 (a crash). Torchrun's timestamps are whole
    seconds, and the ranks it ended after the first failure are recorded too: a root cause is never
    outranked by its peers' exits (1, signals), whatever their timestamps; ties go to the lower rank."""
    first = min(((f.timestamp, rank, f.exitcode) for rank, f in failures.items() if f.exitcode in _ROOT_CAUSES), default=None)
    if first is not None:
        return ExitCode(first[2])
    if any(f.exitcode == ExitCode.PEER_STOPPED for f in failures.values()):
        return ExitCode.PEER_STOPPED
    return ExitCode.FAILED


def _describe(code: int) -> str:
    if code < 0:
        return f"killed by signal {-code}"
    try:
        return f"exit {code} ({ExitCode(code).name.lower().replace('_', ' ')})"
    except ValueError:
        return f"exit {code}"


@record
def main(argv: list[str] | None = None) -> int:
    """torchrun with ``argv`` (its flags, then the program); returns the pod's exit status."""
    args = torchrun.parse_args(argv)  # a usage error exits 2 (argparse), as torchrun's own does
    configure_logging("wdsr.train.launch")
    try:
        torchrun.run(args)
    except ChildFailedError as exc:
        code = pod_exit_code(exc.failures)
        failed = sorted(exc.failures.items(), key=lambda rf: (rf[1].timestamp, rf[0]))
        ranks = ", ".join(f"rank {rank}: {_describe(f.exitcode)}" for rank, f in failed)
        log.error("%s\nranks that failed: %s; this pod exits %d (%s)", exc, ranks, code, code.name.lower())
        return int(code)
    except SignalException as exc:  # this pod was told to stop (SIGTERM: a preemption, a deletion)
        log.warning("torchrun stopped by %s; its ranks were told to stop too", exc.sigval.name)
        return 128 + int(exc.sigval)
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
