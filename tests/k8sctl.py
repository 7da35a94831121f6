"""What the controllers would decide, for the manifests in k8s/: a model of the Job controller's
failure accounting (podFailurePolicy, backoffLimit, backoffLimitPerIndex, maxFailedIndexes), of
JobSet's failurePolicy, of the Kubeflow Trainer's TrainJob -> JobSet step (torch plugin, v2.3.0),
and strict offline validation of custom resources against vendored CRD schemas.

The models read the rendered objects, so a wrong number or rule in a manifest changes what they
decide. They follow the upstream controllers' documented behaviour (Kubernetes 1.33 Job
controller, JobSet v0.12, Trainer v2.3); time (back-off delays) is reported, never waited for.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).resolve().parent / "data" / "crds"
MAX_INT32 = 2**31 - 1


# ---- pods and the Job controller ------------------------------------------------------------------
@dataclasses.dataclass
class PodResult:
    """A terminated pod as the Job controller sees it."""

    index: int
    exit_codes: dict[str, int]  # app containers that terminated: name -> exit code
    init_exit_codes: dict[str, int] = dataclasses.field(default_factory=dict)
    conditions: frozenset[str] = frozenset()  # condition types with status True, e.g. DisruptionTarget
    name: str = "pod"
    namespace: str = "default"

    @property
    def succeeded(self) -> bool:
        return (
            bool(self.exit_codes)
            and all(c == 0 for c in self.exit_codes.values())
            and all(c == 0 for c in self.init_exit_codes.values())
        )


def _exit_matches(codes: dict[str, int], req: dict[str, Any]) -> tuple[str, int] | None:
    for name, code in codes.items():
        if code == 0 or req.get("containerName") not in (None, name):
            continue
        inside = code in req["values"]
        if inside == (req["operator"] == "In"):
            return name, code
    return None


def match_pod_failure_policy(policy: dict[str, Any] | None, pod: PodResult) -> tuple[str, str | None]:
    """(action, job failure message) for a failed pod: the first matching rule; Count when none does.
    App containers are looked at before init containers, exit code 0 never matches (as upstream)."""
    for i, rule in enumerate((policy or {}).get("rules", [])):
        action = rule["action"]
        if "onExitCodes" in rule:
            hit = _exit_matches(pod.exit_codes, rule["onExitCodes"]) or _exit_matches(pod.init_exit_codes, rule["onExitCodes"])
            if hit:
                msg = (
                    f"Container {hit[0]} for pod {pod.namespace}/{pod.name} failed with exit code {hit[1]} "
                    f"matching {action} rule at index {i}"
                )
                return action, msg if action == "FailJob" else None
        else:
            for pattern in rule["onPodConditions"]:
                if pattern.get("status", "True") == "True" and pattern["type"] in pod.conditions:
                    msg = f"Pod {pod.namespace}/{pod.name} has condition {pattern['type']} matching {action} rule at index {i}"
                    return action, msg if action == "FailJob" else None
    return "Count", None


class JobModel:
    """The failure accounting of one Indexed Job. ``pod_finished`` returns what happens to the index:
    "replace" (a new pod; see ``backoff_s``), "done", "index-failed" or "job-failed"."""

    def __init__(self, spec: dict[str, Any], name: str = "job") -> None:
        assert spec.get("completionMode") == "Indexed", "the training Jobs are Indexed"
        self.spec, self.name = spec, name
        self.completions = int(spec["completions"])
        self.per_index = spec.get("backoffLimitPerIndex")
        self.backoff_limit = spec.get("backoffLimit", MAX_INT32 if self.per_index is not None else 6)
        self.max_failed_indexes = spec.get("maxFailedIndexes")
        self.index_failures = {i: 0 for i in range(self.completions)}  # counted, per index
        self.ignored = {i: 0 for i in range(self.completions)}
        self.failed_total = 0  # counted, all indexes (.status.failed minus ignored ones)
        self.failed_indexes: set[int] = set()
        self.succeeded: set[int] = set()
        self.state, self.reason, self.message = "Active", "", ""

    def pod_finished(self, pod: PodResult) -> str:
        if self.state != "Active":
            return "job-" + self.state.lower()
        if pod.succeeded:
            self.succeeded.add(pod.index)
            if len(self.succeeded) == self.completions:
                self.state = "Complete"
            return "done"
        action, msg = match_pod_failure_policy(self.spec.get("podFailurePolicy"), pod)
        if action == "Ignore":
            self.ignored[pod.index] += 1
            return "replace"
        self.failed_total += 1
        if action == "FailJob":
            return self._fail("PodFailurePolicy", msg or "")
        self.index_failures[pod.index] += 1
        if action == "FailIndex" or (self.per_index is not None and self.index_failures[pod.index] > self.per_index):
            self.failed_indexes.add(pod.index)
            if self.max_failed_indexes is not None and len(self.failed_indexes) > self.max_failed_indexes:
                return self._fail("MaxFailedIndexesExceeded", "Job has exceeded the specified maximal number of failed indexes")
            return "index-failed"
        if self.failed_total > self.backoff_limit:
            return self._fail("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        return "replace"

    def backoff_s(self, index: int) -> float:
        """The controller's delay before the replacement: 10 s doubling, at most 6 min, counted per
        index with backoffLimitPerIndex and over the whole Job without it; none after an Ignore."""
        n = self.index_failures[index] if self.per_index is not None else self.failed_total
        return 0.0 if n == 0 else min(360.0, 10.0 * 2 ** (n - 1))

    def _fail(self, reason: str, message: str) -> str:
        self.state, self.reason, self.message = "Failed", reason, message
        return "job-failed"


def preempt(job: JobModel, victim: int, survivors_first: bool = False) -> list[str]:
    """One preemption in a gang of torchrun pods: the victim gets DisruptionTarget; every other pod's
    torchrun loses its peer and exits 1. Returns the decisions, in the order the pods were seen."""
    gone = PodResult(victim, {"train": 1}, conditions=frozenset({"DisruptionTarget"}), name=f"{job.name}-{victim}")
    others = [PodResult(i, {"train": 1}, name=f"{job.name}-{i}") for i in range(job.completions) if i != victim]
    order = others + [gone] if survivors_first else [gone] + others
    return [job.pod_finished(p) for p in order]


# ---- JobSet ----------------------------------------------------------------------------------------
class JobSetModel:
    """JobSet v0.12's failurePolicy over one replicated Job (replicas: 1): a failed child Job is matched
    against the rules in order (reasons and message regexes; empty lists match anything; no match means
    RestartJobSet); a counted restart beyond maxRestarts fails the JobSet."""

    def __init__(self, jobset: dict[str, Any]) -> None:
        self.obj = jobset
        spec = jobset["spec"]
        assert len(spec["replicatedJobs"]) == 1 and spec["replicatedJobs"][0].get("replicas", 1) == 1
        self.rjob = spec["replicatedJobs"][0]
        self.policy = spec.get("failurePolicy") or {}
        self.restarts = self.counted = 0
        self.state, self.rule = "Active", ""
        self.child = self.new_child()

    @property
    def child_name(self) -> str:
        return f"{self.obj['metadata']['name']}-{self.rjob['name']}-0"

    def new_child(self) -> JobModel:
        return JobModel(self.rjob["template"]["spec"], self.child_name)

    def child_failed(self) -> str:
        """The child Job failed: "restart" (a new child) or "failed"."""
        reason, message = self.child.reason, self.child.message
        action, self.rule = "RestartJobSet", "(default)"
        for rule in self.policy.get("rules", []):
            if rule.get("onJobFailureReasons") and reason not in rule["onJobFailureReasons"]:
                continue
            pats = rule.get("onJobFailureMessagePatterns") or []
            if pats and not any(re.search(p, message) for p in pats):
                continue
            action, self.rule = rule["action"], rule["name"]
            break
        if action == "FailJobSet" or (action == "RestartJobSet" and self.counted >= self.policy.get("maxRestarts", 0)):
            self.state = "Failed"
            return "failed"
        assert action in ("RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"), action
        self.restarts += 1
        self.counted += action == "RestartJobSet"
        self.child = self.new_child()
        return "restart"

    def pod_finished(self, pod: PodResult) -> str:
        """Feed a pod to the child Job; a child failure is acted on at once."""
        decision = self.child.pod_finished(pod)
        if decision == "job-failed":
            return self.child_failed()
        if self.child.state == "Complete":
            self.state = "Complete"
        return decision


# ---- Kubeflow Trainer: TrainJob + runtime -> JobSet ------------------------------------------------
TRAINER_PORT = 29500
PET_RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def _upsert(items: list[dict[str, Any]], new: list[dict[str, Any]], key: str = "name") -> list[dict[str, Any]]:
    out = list(items)
    for item in new:
        at = next((i for i, old in enumerate(out) if old[key] == item[key]), None)
        if at is None:
            out.append(copy.deepcopy(item))
        else:
            out[at] = copy.deepcopy(item)
    return out


def _cpu_count(q: Any) -> int:
    """A CPU quantity rounded up to whole CPUs (what resource.Quantity.Value() gives)."""
    s = str(q)
    return math.ceil(int(s[:-1]) / 1000) if s.endswith("m") else math.ceil(float(s))


def nproc_per_node(trainer: dict[str, Any]) -> str:
    """The Trainer's PET_NPROC_PER_NODE: numProcPerNode if set, else "auto" on GPU nodes (torchrun: one
    per GPU) and the CPU request (or limit) on CPU nodes."""
    if trainer.get("numProcPerNode") is not None:
        return str(trainer["numProcPerNode"])
    res = trainer.get("resourcesPerNode") or {}
    if any("gpu" in k for part in res.values() for k in part):
        return "auto"
    cpu = (res.get("requests") or {}).get("cpu") or (res.get("limits") or {}).get("cpu")
    return str(max(1, _cpu_count(cpu) if cpu is not None else 0))


def _patch_pod(pod: dict[str, Any], patch: dict[str, Any]) -> None:
    for kind in ("containers", "initContainers"):
        for cp in patch.get(kind, []):
            target = next((c for c in pod.get(kind, []) if c["name"] == cp["name"]), None)
            assert target is not None, f"runtimePatches: the runtime has no {kind[:-1]} {cp['name']!r}"
            assert not (cp.get("env") and cp["name"] == "node"), "runtimePatches may not set env of the node container"
            if "env" in cp:
                target["env"] = _upsert(target.get("env", []), cp["env"])
            if "volumeMounts" in cp:
                target["volumeMounts"] = _upsert(target.get("volumeMounts", []), cp["volumeMounts"], "mountPath")
            if "securityContext" in cp:
                target["securityContext"] = {**target.get("securityContext", {}), **cp["securityContext"]}
    if "volumes" in patch:
        pod["volumes"] = _upsert(pod.get("volumes", []), patch["volumes"])
    for field in ("securityContext", "nodeSelector"):
        if field in patch:
            pod[field] = {**pod.get(field, {}), **patch[field]}
    for field in ("terminationGracePeriodSeconds", "serviceAccountName", "affinity"):
        if field in patch:
            pod[field] = copy.deepcopy(patch[field])
    for field in ("tolerations", "imagePullSecrets", "schedulingGates"):
        if field in patch:
            pod[field] = pod.get(field, []) + copy.deepcopy(patch[field])


def trainjob_to_jobset(trainjob: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The JobSet the Trainer (v2.3.0, torch plugin) makes of a TrainJob on a runtime: the runtime's
    JobSet template; the "trainer" step's Job sized to numNodes; its container "node" given the
    TrainJob's image/command/args/resources, its env merged, then the PET_* variables; runtimePatches
    applied; and what JobSet's webhook defaults (Indexed completion, DNS hostnames)."""
    name, tr = trainjob["metadata"]["name"], trainjob["spec"]["trainer"]
    assert not PET_RESERVED & {e["name"] for e in tr.get("env", [])}, "trainer.env must not set reserved PET_* variables"
    assert "torch" in runtime["spec"]["mlPolicy"], "a torch runtime"
    spec = copy.deepcopy(runtime["spec"]["template"]["spec"])
    nodes = int(tr.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1)))
    for rj in spec["replicatedJobs"]:
        job = rj["template"]["spec"]
        job.setdefault("completionMode", "Indexed")
        pod = job["template"]["spec"]
        if rj["template"].get("metadata", {}).get("labels", {}).get("trainer.kubeflow.org/trainjob-ancestor-step") != "trainer":
            continue
        job["completions"] = job["parallelism"] = nodes
        node = next(c for c in pod["containers"] if c["name"] == "node")
        for field in ("image", "command", "args"):
            if field in tr:
                node[field] = copy.deepcopy(tr[field])
        if "resourcesPerNode" in tr:
            node["resources"] = copy.deepcopy(tr["resourcesPerNode"])
        pet: list[dict[str, Any]] = [
            {"name": "PET_NNODES", "value": str(nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": nproc_per_node(tr)},
            {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
            {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
            {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
        ]
        node["env"] = _upsert(_upsert(node.get("env", []), tr.get("env", [])), pet)
        node["ports"] = _upsert(node.get("ports", []), [{"containerPort": TRAINER_PORT}], "containerPort")
    for patch in trainjob["spec"].get("runtimePatches", []):
        for rp in patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", []):
            rj = next(r for r in spec["replicatedJobs"] if r["name"] == rp["name"])
            pod_patch = rp.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
            _patch_pod(rj["template"]["spec"]["template"]["spec"], pod_patch)
    spec.setdefault("network", {}).setdefault("enableDNSHostnames", True)
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name}, "spec": spec}


# ---- strict validation against a CRD's openAPIV3Schema ---------------------------------------------
_OBJECT_META = {"name", "generateName", "namespace", "labels", "annotations", "finalizers", "ownerReferences"}


def _strict(schema: Any) -> Any:
    """openAPIV3Schema -> JSON Schema with unknown fields refused: every object that lists properties
    gets additionalProperties: false unless it preserves unknown fields; nullable becomes a null type."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    props = schema.get("properties")
    skip = {"x-kubernetes-validations", "description", "default"} | ({"properties"} if isinstance(props, dict) else set())
    out = {k: _strict(v) for k, v in schema.items() if k not in skip}
    if isinstance(props, dict):  # field names are kept, a field called description too (each once: not 2^depth)
        out["properties"] = {k: _strict(v) for k, v in props.items()}
    if "properties" in out and "additionalProperties" not in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def crd_validator(filename: str, served: str | None = None) -> tuple[str, str, str, Any]:
    """(group, version, kind, validator) of a vendored CRD: its one served version, or ``served``
    where it serves several (Kueue serves v1beta1 and v1beta2)."""
    import jsonschema

    crd = yaml.load((CRDS / filename).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served", True) and served in (None, v["name"])]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    return crd["spec"]["group"], version["name"], crd["spec"]["names"]["kind"], jsonschema.Draft7Validator(schema)


CRD_FILES = {
    "JobSet": "jobset.x-k8s.io_jobsets.yaml",
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
    "LocalQueue": "kueue.x-k8s.io_localqueues.yaml",
    "WorkloadPriorityClass": "kueue.x-k8s.io_workloadpriorityclasses.yaml",
}
SERVED = {"LocalQueue": "v1beta2", "WorkloadPriorityClass": "v1beta2"}  # the version we write, of CRDs serving several


def validate_custom_resource(obj: dict[str, Any]) -> list[str]:
    """Errors ('path: message') of a custom resource against its vendored CRD; [] when it is valid.
    CEL rules (x-kubernetes-validations) and webhooks are not evaluated here."""
    group, version, kind, validator = crd_validator(CRD_FILES[obj["kind"]], SERVED.get(obj["kind"]))
    errors = []
    if obj.get("apiVersion") != f"{group}/{version}":
        errors.append(f"apiVersion: {obj.get('apiVersion')!r} is not {group}/{version}")
    errors += [f"metadata: unknown field {k!r}" for k in set(obj.get("metadata", {})) - _OBJECT_META]
    for err in validator.iter_errors(obj):
        errors.append(f"{'.'.join(str(p) for p in err.absolute_path) or '(root)'}: {err.message}")
    return errors
