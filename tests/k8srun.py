"""Run the pods of rendered Kubernetes Jobs as local processes, the way the kubelet would start them.

What is taken from the manifests as is: each container's command and args, its env (``value``,
``fieldRef`` to the Job's completion index or the pod's labels, ``configMapKeyRef``/``secretKeyRef``, ``envFrom``
ConfigMaps and Secrets, ``$(VAR)`` expansion as Kubernetes does it) and its configMap volumes (files written where the container
would see them). What is mapped: mount paths to local folders, the image's programs to this
venv's, the S3 endpoint and credentials to the test server, the rendezvous Service's DNS name to
127.0.0.1. Anything left unresolved fails the test instead of being guessed.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any

import yaml

KUBECTL = Path(sys.executable).parent / "kubectl"
_COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
MARKER = "WDSR_K8SRUN_CONTAINER"


def render(folder: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize folder``, parsed."""
    out = subprocess.run([str(KUBECTL), "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: found {len(hits)}"
    return hits[0]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes); an undefined variable is an error here."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        assert m.group(1) in env, f"$({m.group(1)}) is not defined in the container's environment"
        return env[m.group(1)]

    return _VAR.sub(sub, text)


def _object_data(obj: dict[str, Any]) -> dict[str, str]:
    data = dict(obj.get("data") or {})
    if obj["kind"] == "Secret":
        data = {k: base64.b64decode(v).decode() for k, v in data.items()}
        data.update(obj.get("stringData") or {})
    return data


class Pod:
    """One pod of a Job at completion index ``index``; ``workdir`` holds its mapped volumes."""

    marker: str | None = None  # set to tag the pod's processes, so that all of them can be ended

    def __init__(
        self,
        job: dict[str, Any],
        objects: list[dict[str, Any]],
        index: int,
        workdir: Path,
        overrides: dict[str, str],
        hosts: dict[str, str],
    ) -> None:
        self.job, self.objects, self.index = job, objects, index
        self.spec = job["spec"]["template"]["spec"]
        self.workdir = workdir
        self.overrides = overrides
        self.hosts = hosts  # text in args to replace (DNS names, ports)
        self.mounts = self._volumes()

    def _volumes(self) -> dict[str, dict[str, str]]:
        """Per container: mountPath -> local folder. ConfigMap files are written there with the
        mount paths they name mapped too (a config file saying /scratch/logs gets the local one)."""
        local: dict[str, Path] = {}
        for vol in self.spec.get("volumes", []):
            assert "configMap" in vol or "emptyDir" in vol, f"volume {vol['name']}: only configMap and emptyDir are mapped"
            if vol.get("emptyDir", {}).get("medium") == "Memory":  # a folder on the real tmpfs, removed with the pod
                local[vol["name"]] = Path(tempfile.mkdtemp(prefix="wdsr-k8srun-", dir="/dev/shm"))
                weakref.finalize(self, shutil.rmtree, str(local[vol["name"]]), True)
            else:
                local[vol["name"]] = self.workdir / vol["name"]
                local[vol["name"]].mkdir(parents=True, exist_ok=True)
        out = {}
        for c in self.spec.get("initContainers", []) + self.spec["containers"]:
            # paths in /dev/shm that settings name (the decoded cache) go to the pod's own folder there; what
            # torch puts in /dev/shm for the batch handoff needs no mapping
            out[c["name"]] = {m["mountPath"]: str(local[m["name"]]) for m in c.get("volumeMounts", [])}
        self.mounts = out
        everywhere = {"*": {k: v for mounts in out.values() for k, v in mounts.items()}}
        for vol in self.spec.get("volumes", []):
            if "configMap" in vol:
                for key, text in _object_data(find(self.objects, "ConfigMap", vol["configMap"]["name"])).items():
                    (local[vol["name"]] / key).write_text(self._map_paths(text, "*", everywhere))
        return out

    def _map_paths(self, text: str, container: str, table: dict[str, dict[str, str]] | None = None) -> str:
        """Mount paths at the start of a word (or after ``=``) -> local folders, in one pass."""
        mounts = (table or self.mounts)[container]
        if not mounts:
            return text
        alt = "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))
        return re.sub(rf"(^|=|\s)({alt})(?=/|$|\s)", lambda m: m.group(1) + mounts[m.group(2)], text, flags=re.M)

    def labels(self) -> dict[str, str]:
        """The pod's labels: its template's, and those the Job controller adds (its Job's name and, in
        an Indexed Job, the completion index). A JobSet's labels are in its child Job's template."""
        labels = dict(self.job["spec"]["template"].get("metadata", {}).get("labels", {}))
        name = self.job["metadata"]["name"]
        labels.update({"batch.kubernetes.io/job-name": name, "job-name": name})
        if self.job["spec"].get("completionMode") == "Indexed":
            labels["batch.kubernetes.io/job-completion-index"] = str(self.index)
        return labels

    def _field(self, var: str, ref: str) -> str:
        """A downward-API fieldRef: the completion index, or one of the pod's labels."""
        if ref == _COMPLETION_INDEX:
            assert self.job["spec"].get("completionMode") == "Indexed", "completion index outside an Indexed Job"
            return str(self.index)
        m = re.fullmatch(r"metadata\.labels\['([^']+)'\]", ref)
        assert m, f"env {var}: fieldRef {ref} is not mapped"
        labels = self.labels()
        assert m.group(1) in labels, f"env {var}: the pod has no label {m.group(1)} (it has {sorted(labels)})"
        return labels[m.group(1)]

    def env(self, c: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for src in c.get("envFrom", []):
            if "configMapRef" in src:
                env.update(_object_data(find(self.objects, "ConfigMap", src["configMapRef"]["name"])))
            else:
                env.update(_object_data(find(self.objects, "Secret", src["secretRef"]["name"])))
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            elif "fieldRef" in e["valueFrom"]:
                env[e["name"]] = self._field(e["name"], e["valueFrom"]["fieldRef"]["fieldPath"])
            else:  # one key of a ConfigMap or Secret
                kind, ref = next(iter(e["valueFrom"].items()))
                obj = {"configMapKeyRef": "ConfigMap", "secretKeyRef": "Secret"}[kind]
                data = _object_data(find(self.objects, obj, ref["name"]))
                assert ref["key"] in data or ref.get("optional"), f"env {e['name']}: {obj} {ref['name']} has no key {ref['key']}"
                if ref["key"] in data:
                    env[e["name"]] = data[ref["key"]]
        env.update({k: v for k, v in self.overrides.items() if k in env})  # the Secret's values -> the test server
        return {k: self._map_paths(v, c["name"]) for k, v in env.items()}

    def argv(self, c: dict[str, Any], env: dict[str, str]) -> list[str]:
        words = [expand(w, env) for w in c.get("command", []) + c.get("args", [])]
        for i, w in enumerate(words):
            for text, repl in self.hosts.items():
                w = w.replace(text, repl)
            words[i] = self._map_paths(w, c["name"])
        return words

    def start(self, c: dict[str, Any]) -> subprocess.Popen:
        env = self.env(c)
        argv = self.argv(c, env)
        full = {
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": "1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            **env,
        }
        if self.marker:  # every process of this container carries it (see kill_marked)
            full[MARKER] = f"{self.marker}/{c['name']}"
        log = open(self.workdir / f"{c['name']}.log", "w")
        return subprocess.Popen(argv, env=full, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self, container: str) -> str:
        return (self.workdir / f"{container}.log").read_text()[-4000:]


def kill_marked(tag: str) -> int:
    """SIGKILL every process whose environment holds ``MARKER=tag`` (a container's processes: what a
    container runtime ends with the container); returns how many were signalled."""
    needle = f"{MARKER}={tag}".encode()
    hit = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), 9)
                hit += 1
        except (OSError, ProcessLookupError):
            continue
    return hit


def run_all(pods: list[Pod], containers: str, timeout: float) -> None:
    """Start container list ``containers`` ("initContainers" one after another per pod, "containers"
    all at once) in every pod, wait for all; assert each exits 0 (the pod's log on failure)."""
    procs: list[tuple[Pod, str, subprocess.Popen]] = []
    try:
        for pod in pods:
            for c in pod.spec.get(containers, []):
                p = pod.start(c)
                if containers == "initContainers":
                    p.wait(timeout=timeout)
                procs.append((pod, c["name"], p))
        for pod, name, p in procs:
            rc = p.wait(timeout=timeout)
            assert rc == 0, f"pod {pod.job['metadata']['name']}-{pod.index} container {name} exited {rc}:\n{pod.log(name)}"
    finally:
        for _, _, p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
