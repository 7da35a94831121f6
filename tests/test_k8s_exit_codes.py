"""k8s/ and the exit codes (docs/kubernetes.md, "Exit codes"): every manifest fails the run at once on 2
(bad input, from the pre-flight or a rank mid-run), retries 69 (storage unavailable) within a bounded
budget, and shows a failed container's last log lines as its termination message.

Decided by the controller models of tests/k8sctl.py on the rendered manifests, and executed as local
processes (tests/k8srun.py, tests/k8sgang.py): the pre-flight and a build part against a closed port on
127.0.0.1 exit 69 and are replaced; a rank that meets bad data mid-run fails the whole run through
torchrun (python -m wdsr.train.launch)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shardmaker import format as fmt
from shardmaker.exitcodes import ExitCode
from tests.helpers import rewrite
from tests.k8sctl import JobModel, JobSetModel, PodResult, trainjob_to_jobset
from tests.k8srun import Pod, find, render
from tests.s3server import free_port
from tests.test_k8s_scale import K8S, VARIANTS, gang_job, local_run, render_at

OVERLAYS = [f"{env}/{kind}" for env in ("local-dev", "multi-node-gpu") for kind in ("build", *VARIANTS)]


def pods_of(objects: list[dict]) -> list[tuple[str, dict]]:
    """(what, pod spec) of every pod the objects make (a TrainJob's through the Trainer's step)."""
    out = []
    for o in objects:
        if o["kind"] in ("Job", "Deployment"):
            out.append((f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"]))
        elif o["kind"] == "JobSet":
            out += [(f"JobSet/{rj['name']}", rj["template"]["spec"]["template"]["spec"]) for rj in o["spec"]["replicatedJobs"]]
        elif o["kind"] == "TrainJob":
            runtime = find(objects, "TrainingRuntime", o["spec"]["runtimeRef"]["name"])
            js = trainjob_to_jobset(o, runtime)
            out += [(f"TrainJob/{rj['name']}", rj["template"]["spec"]["template"]["spec"]) for rj in js["spec"]["replicatedJobs"]]
    return out


@pytest.mark.parametrize("overlay", OVERLAYS + ["local-dev/s3"])
def test_every_container_reports_its_last_log_lines_when_it_fails(overlay, tmp_path):
    objects = render_at(overlay, tmp_path)
    pods = pods_of(objects)
    assert pods
    for what, spec in pods:
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c.get("terminationMessagePolicy") == "FallbackToLogsOnError", (overlay, what, c["name"])


def failure_policies(objects: list[dict]) -> list[tuple[str, dict]]:
    jobs = [(o["metadata"]["name"], o["spec"]) for o in objects if o["kind"] == "Job"]
    for o in objects:
        if o["kind"] in ("JobSet", "TrainingRuntime"):
            spec = o["spec"] if o["kind"] == "JobSet" else o["spec"]["template"]["spec"]
            jobs += [(f"{o['kind']}/{rj['name']}", rj["template"]["spec"]) for rj in spec["replicatedJobs"]]
    return [(name, spec["podFailurePolicy"]) for name, spec in jobs if name != "wdsr-seed"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_job_fails_at_once_on_2_and_counts_69(overlay, tmp_path):
    """2 -> FailJob ahead of every other rule; 69 -> Count (the Job's or the index's bounded budget, with the
    controller's back-off between tries), after the DisruptionTarget rule (a preempted pod never counts)."""
    for name, policy in failure_policies(render_at(overlay, tmp_path)):
        rules = policy["rules"]
        codes = [(r["action"], r["onExitCodes"]["values"]) for r in rules if "onExitCodes" in r]
        assert codes == [("FailJob", [ExitCode.BAD_INPUT]), ("Count", [ExitCode.UNAVAILABLE])], (overlay, name)
        assert "onExitCodes" in rules[0] and "onExitCodes" in rules[-1] and "onPodConditions" in rules[1], (overlay, name)


def model(variant: str, nnodes: int, tmp_path: Path) -> JobModel | JobSetModel:
    job, jobset = gang_job(render_at(f"multi-node-gpu/{variant}", tmp_path, nnodes))
    return JobModel(job["spec"], "wdsr-train") if jobset is None else JobSetModel(jobset)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_rank_that_exits_2_mid_run_fails_the_run_at_once(variant, tmp_path):
    m = model(variant, 16, tmp_path)
    container = "node" if variant == "train-trainer" else "train"
    for i in range(15):  # its peers lost it and exit 1 first: counted, replaced
        assert m.pod_finished(PodResult(i, {container: 1}, name=f"wdsr-train-{i}")) == "replace"
    m.pod_finished(PodResult(15, {container: 2}, name="wdsr-train-15"))
    assert m.state == "Failed"
    if isinstance(m, JobSetModel):
        assert m.rule == "BadInput" and m.restarts == 0
    else:
        assert m.reason == "PodFailurePolicy" and f"Container {container} " in m.message


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("where", ["preflight", "mid-run"])
def test_storage_unavailable_is_retried_within_a_bounded_budget(variant, where, tmp_path):
    """One S3 blip in every pod at once (a restart storm) costs each index one unit, the run goes on; a
    lasting outage ends it in bounded rounds, as a repeating crash does (never at once, never forever)."""
    nnodes = 16
    m = model(variant, nnodes, tmp_path)
    container = "node" if variant == "train-trainer" else "train"
    policy = (m.rjob["template"]["spec"] if isinstance(m, JobSetModel) else m.spec)["podFailurePolicy"]
    assert {"action": "Count", "onExitCodes": {**(r := policy["rules"][-1])["onExitCodes"], "values": [69]}} == r  # explicit

    def blip(i: int) -> PodResult:
        if where == "preflight" and variant != "train-trainer":
            return PodResult(i, {}, {"preflight": ExitCode.UNAVAILABLE}, name=f"wdsr-train-{i}")
        return PodResult(i, {container: ExitCode.UNAVAILABLE}, name=f"wdsr-train-{i}")

    assert {m.pod_finished(blip(i)) for i in range(nnodes)} == {"replace"} and m.state == "Active"
    rounds = 1
    while m.state == "Active":
        rounds += 1
        assert rounds < 50
        child = getattr(m, "child", m)
        for i in range(nnodes):
            m.pod_finished(blip(i))
            if m.state != "Active" or getattr(m, "child", m) is not child:
                break
    assert 2 <= rounds <= 8
    if isinstance(m, JobSetModel):
        assert m.rule == "Crashed"


# ---- executed: the rendered pods' own commands, as local processes --------------------------------------
def closed_port_overrides(objects: list[dict]) -> dict[str, str]:
    secret = find(objects, "Secret", "wdsr-s3")["stringData"]
    return {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        **{k: "x" for k in secret if k.startswith("AWS_") and "KEY" in k},
    }


def first_container(pod: Pod) -> dict:
    """What runs first in the pod: the pre-flight init container, or (TrainJob) the node's `check && exec`."""
    return (pod.spec.get("initContainers") or pod.spec["containers"])[0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_preflight_against_unreachable_storage_exits_69_and_the_pod_is_replaced(variant, tmp_path):
    objects = render_at(f"local-dev/{variant}", tmp_path) + [find(render(K8S / "overlays/local-dev/s3"), "Secret", "wdsr-s3")]
    job, jobset = gang_job(objects)
    pod = Pod(job, objects, 0, tmp_path / "pod-0", closed_port_overrides(objects), {})
    c = first_container(pod)
    c.setdefault("env", []).append({"name": "AWS_MAX_ATTEMPTS", "value": "1"})  # one try per request: seconds, not minutes
    rc = pod.start(c).wait(timeout=300)
    assert rc == ExitCode.UNAVAILABLE, pod.log(c["name"])
    assert "EndpointConnectionError" in pod.log(c["name"]) and "Traceback" not in pod.log(c["name"])
    init = c["name"] == "preflight"
    result = PodResult(0, {} if init else {c["name"]: rc}, {c["name"]: rc} if init else {}, name="wdsr-train-0")
    m = JobModel(job["spec"], "wdsr-train") if jobset is None else JobSetModel(jobset)
    assert m.pod_finished(result) == "replace" and m.state == "Active"


def test_a_build_part_against_unreachable_storage_exits_69_and_is_replaced(tmp_path):
    objects = render_at("local-dev/build", tmp_path) + [find(render(K8S / "overlays/local-dev/s3"), "Secret", "wdsr-s3")]
    find(objects, "ConfigMap", "wdsr-env")["data"]["AWS_MAX_ATTEMPTS"] = "1"
    job = find(objects, "Job", "wdsr-build")
    pod = Pod(job, objects, 1, tmp_path / "build-1", closed_port_overrides(objects), {})
    (c,) = pod.spec["containers"]
    rc = pod.start(c).wait(timeout=300)
    assert rc == ExitCode.UNAVAILABLE, pod.log("build")
    m = JobModel(job["spec"], "wdsr-build")
    assert m.pod_finished(PodResult(1, {"build": rc}, name="wdsr-build-1")) == "replace" and m.state == "Active"


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_data_mid_run_fails_every_variant_at_once_through_torchrun(variant, s3_server, photo_shards, tmp_path):
    """3 "nodes", data on local disk with one HR image truncated: the pre-flight passes (the manifest is
    fine), the rank that meets the image exits 2, its pod's launcher exits 2 and the run fails, no retry."""
    bad = tmp_path / "bad"
    shutil.copytree(photo_shards, bad)
    victim = fmt.load(str(bad)).shards[1].keys[0]
    rewrite(bad, 1, lambda name, data: (name, data[:200]) if name == f"{victim}.hr.png" else (name, data))
    gang, _ = local_run(variant, tmp_path, s3_server, f"file://{bad}")  # file://: /tmp is a volume of the pod
    gang.run(timeout=300)
    m = gang.model
    assert m.state == "Failed", gang.events
    container = "node" if variant == "train-trainer" else "train"
    failed = [r for _, r, decision in gang.finished_pods if decision in ("job-failed", "failed")]
    assert failed and failed[-1].exit_codes == {container: ExitCode.BAD_INPUT}, gang.events
    if isinstance(m, JobSetModel):
        assert m.rule == "BadInput" and m.restarts == 0
    else:
        assert m.reason == "PodFailurePolicy"
    logs = "".join(gang.pod_log(i, container, a) for i in range(3) for a in range(gang.attempts[i] + 1))
    assert victim in logs and "this pod exits 2 (bad_input)" in logs
