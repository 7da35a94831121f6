"""Run a training gang (the pods of an Indexed Job, or of a JobSet's one replicated Job) as local
processes, with a controller model (tests/k8sctl.py) deciding what each terminated pod costs and
whether it is replaced, the whole group restarted, or the run over.

As on a cluster: a pod runs its init containers one after another, then its containers together;
a container ends when its first process does, and everything it started ends with it (each
container's processes carry a marker: see ``k8srun.kill_marked``); a preempted pod gets the
DisruptionTarget condition and SIGTERM to each container's first process, SIGKILL after
terminationGracePeriodSeconds; a replacement starts in a fresh pod folder (fresh emptyDirs) once the
pod it replaces is gone. Not modelled: the controller's back-off delays (recorded by the model, not
waited for); a replacement starts once no pod of the gang is still terminating, which on a cluster
the back-off of at least 10 s gives.
"""

from __future__ import annotations

import dataclasses
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.k8sctl import JobModel, JobSetModel, PodResult
from tests.k8srun import Pod, kill_marked


@dataclasses.dataclass
class RunningPod:
    pod: Pod
    name: str
    generation: int  # results of pods from an earlier child Job (before a group restart) are dropped
    pending_init: list[dict[str, Any]]
    procs: dict[str, subprocess.Popen] = dataclasses.field(default_factory=dict)
    exit_codes: dict[str, int] = dataclasses.field(default_factory=dict)
    init_exit_codes: dict[str, int] = dataclasses.field(default_factory=dict)
    conditions: set[str] = dataclasses.field(default_factory=set)
    kill_at: float | None = None  # terminating: SIGKILL then

    @property
    def index(self) -> int:
        return self.pod.index


class Gang:
    """``job`` is a Job object (a JobSet's replicated Job as its child Job); ``model`` a JobModel or
    JobSetModel over it. ``run()`` returns once the model says Complete or Failed."""

    def __init__(
        self,
        job: dict[str, Any],
        objects: list[dict[str, Any]],
        work: Path,
        model: JobModel | JobSetModel,
        overrides: dict[str, str],
        hosts: dict[str, str],
    ) -> None:
        self.job, self.objects, self.work, self.model = job, objects, work, model
        self.overrides, self.hosts = overrides, hosts
        self.grace = float(job["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30))
        self.pods: list[RunningPod] = []
        self.attempts: dict[int, int] = {}
        self.generation = 0
        self.pending: set[int] = set()  # indexes to (re)create
        self.restart_all = False
        self.events: list[str] = []  # what happened, in order, with seconds since run(): for failure messages
        self.t0 = time.monotonic()
        self.finished_pods: list[tuple[str, PodResult, str]] = []

    def _event(self, text: str) -> None:
        self.events.append(f"{time.monotonic() - self.t0:7.2f}s {text}")

    # ---- pods ------------------------------------------------------------------------------------
    def _start(self, index: int) -> None:
        attempt = self.attempts.get(index, -1) + 1
        self.attempts[index] = attempt
        name = f"{self.job['metadata']['name']}-{index}-a{attempt}"
        pod = Pod(self.job, self.objects, index, self.work / name, self.overrides, self.hosts)
        pod.marker = f"{os.getpid()}/{name}"
        rp = RunningPod(pod, name, self.generation, list(pod.spec.get("initContainers", [])))
        self.pods.append(rp)
        self._event(f"start {name}")
        self._advance(rp)

    def _advance(self, rp: RunningPod) -> None:
        """Start the next init container, or the containers once the init containers are done."""
        if rp.kill_at is not None:
            return
        if rp.pending_init:
            c = rp.pending_init.pop(0)
            rp.procs = {c["name"]: rp.pod.start(c)}
        else:
            rp.procs = {c["name"]: rp.pod.start(c) for c in rp.pod.spec["containers"]}

    def terminate(self, rp: RunningPod, disruption: bool) -> None:
        """SIGTERM to each running container's first process; SIGKILL after the grace period."""
        if disruption:
            rp.conditions.add("DisruptionTarget")
        if rp.kill_at is None:
            rp.kill_at = time.monotonic() + self.grace
            for p in rp.procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
        self._event(f"{'preempt' if disruption else 'terminate'} {rp.name}")

    def preempt(self, index: int) -> None:
        """Preempt the live pod of ``index`` (DisruptionTarget, then SIGTERM)."""
        (rp,) = [p for p in self.pods if p.index == index and p.generation == self.generation]
        self.terminate(rp, disruption=True)

    def pod_log(self, index: int, container: str, attempt: int = -1) -> str:
        names = sorted(
            (p for p in self.work.iterdir() if p.name.startswith(f"{self.job['metadata']['name']}-{index}-a")),
            key=lambda p: int(p.name.rsplit("-a", 1)[1]),
        )
        return (names[attempt] / f"{container}.log").read_text()

    # ---- the loop --------------------------------------------------------------------------------
    def _wait(self, timeout: float) -> None:
        """Block until a process of the gang exits or ``timeout`` seconds pass."""
        fds = []
        try:
            for rp in self.pods:
                for p in rp.procs.values():
                    if p.returncode is None:
                        try:
                            fds.append(os.pidfd_open(p.pid))
                        except ProcessLookupError:
                            continue
            if fds:
                select.select(fds, [], [], timeout)
        finally:
            for fd in fds:
                os.close(fd)

    def _reap(self, rp: RunningPod) -> bool:
        """Collect exits; True once the pod is terminal."""
        for name, p in list(rp.procs.items()):
            if p.poll() is None:
                continue
            kill_marked(f"{rp.pod.marker}/{name}")  # the container is gone: so is all it started
            del rp.procs[name]
            if name in {c["name"] for c in rp.pod.spec.get("initContainers", [])}:
                rp.init_exit_codes[name] = p.returncode
                if p.returncode != 0:
                    return True
                self._advance(rp)
            else:
                rp.exit_codes[name] = p.returncode
        if rp.kill_at is not None and time.monotonic() >= rp.kill_at and rp.procs:
            for name in rp.procs:
                kill_marked(f"{rp.pod.marker}/{name}")
        return not rp.procs and (bool(rp.exit_codes) or rp.kill_at is not None)

    def _finished(self, rp: RunningPod) -> None:
        self.pods.remove(rp)
        if rp.generation != self.generation:
            return
        result = PodResult(rp.index, dict(rp.exit_codes), dict(rp.init_exit_codes), frozenset(rp.conditions), rp.name)
        decision = self.model.pod_finished(result)
        self.finished_pods.append((rp.name, result, decision))
        self._event(f"{rp.name} exited {result.exit_codes or result.init_exit_codes} {sorted(result.conditions)} -> {decision}")
        if decision == "replace":
            self.pending.add(rp.index)
        elif decision in ("restart", "failed", "job-failed"):  # the child Job is over: end its other pods
            self.generation += 1
            self.pending.clear()
            self.restart_all = decision == "restart"
            for other in self.pods:
                self.terminate(other, disruption=False)

    def run(self, timeout: float, chaos: Callable[[Gang], None] | None = None) -> None:
        self.t0 = time.monotonic()
        deadline = self.t0 + timeout
        try:
            for i in range(int(self.job["spec"]["completions"])):
                self._start(i)
            while self.model.state == "Active" or self.pods:
                assert time.monotonic() < deadline, "the gang did not finish in time:\n" + "\n".join(self.events)
                self._wait(0.2)
                for rp in list(self.pods):
                    if self._reap(rp):
                        self._finished(rp)
                if chaos is not None and self.model.state == "Active":
                    chaos(self)
                if any(rp.kill_at is not None for rp in self.pods):
                    continue  # replacements wait until no pod is terminating
                if self.restart_all and self.model.state == "Active":
                    self.restart_all = False
                    self.pending = set(range(int(self.job["spec"]["completions"])))
                for i in sorted(self.pending):
                    self._start(i)
                self.pending.clear()
        finally:
            for rp in self.pods:
                for name, p in rp.procs.items():
                    kill_marked(f"{rp.pod.marker}/{name}")
                    if p.poll() is None:
                        p.kill()
                    p.wait()
