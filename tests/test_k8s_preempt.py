"""k8s/ for spot capacity (issue 37, section 5): the build as one JobSet whose merge waits for the parts
(dependsOn) instead of polling, a deadline on every variant, no deprecated NCCL variable, and a pre-flight
that ends at SIGTERM even as the container's PID 1 (where the kernel drops a signal with no handler)."""

from __future__ import annotations

import copy
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import descendants
from tests.k8sctl import trainjob_to_jobset, validate_custom_resource
from tests.k8srun import Pod, find, render, run_all

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
ENVS = ["local-dev", "multi-node-gpu"]
TRAIN = ["train", "train-jobset", "train-trainer"]


def child_jobs(jobset: dict) -> dict[str, dict]:
    """The Jobs JobSet makes of its replicated Jobs (one replica each), by replicated Job name."""
    out = {}
    for rj in jobset["spec"]["replicatedJobs"]:
        name = f"{jobset['metadata']['name']}-{rj['name']}-0"
        out[rj["name"]] = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": copy.deepcopy(rj["template"]["spec"]),
        }
        # the labels JobSet gives the pods of its child Jobs (the master address reads the JobSet's name from them)
        meta = out[rj["name"]]["spec"]["template"].setdefault("metadata", {})
        meta["labels"] = {
            **meta.get("labels", {}),
            "jobset.sigs.k8s.io/jobset-name": jobset["metadata"]["name"],
            "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
            "jobset.sigs.k8s.io/job-index": "0",
        }
    return out


def core_valid(objects: list[dict], tmp_path: Path) -> None:
    f = tmp_path / "core.yaml"
    f.write_text(yaml.safe_dump_all(objects))
    res = subprocess.run(
        [str(VALIDATE), "--strict", "--quiet", "-k", "1.33.0", str(f)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("env", ENVS)
def test_the_build_jobset_merges_only_after_every_part_completed(env, tmp_path):
    objects = render(K8S / "overlays" / env / "build-jobset")
    js = find(objects, "JobSet", "wdsr-build")
    assert validate_custom_resource(js) == []
    core_valid([o for o in objects if o["kind"] != "JobSet"], tmp_path)
    jobs = child_jobs(js)
    core_valid(list(jobs.values()), tmp_path)
    parts, merge = jobs["parts"]["spec"], jobs["merge"]["spec"]
    (rj_parts, rj_merge) = js["spec"]["replicatedJobs"]
    assert "dependsOn" not in rj_parts and rj_merge["dependsOn"] == [{"name": "parts", "status": "Complete"}]
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 0  # a part failed for good: the JobSet fails, no merge starts
    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["merge"]}
    n = int(find(objects, "ConfigMap", "wdsr-env")["data"]["BUILD_PARTS"])
    assert parts["completions"] == parts["parallelism"] == n and parts["maxFailedIndexes"] == 0
    assert parts["backoffLimitPerIndex"] >= 1 and parts["activeDeadlineSeconds"] and merge["activeDeadlineSeconds"]
    (mc,) = merge["template"]["spec"]["containers"]
    assert mc["args"][0] == "merge" and not any(a.startswith("--wait") for a in mc["args"])  # nothing to poll for
    # the same pods as the plain build Jobs
    plain = render(K8S / "overlays" / env / "build")
    for job, name in ((parts, "wdsr-build"), (merge, "wdsr-merge")):
        want = find(plain, "Job", name)["spec"]["template"]["spec"]
        got = copy.deepcopy(job["template"]["spec"]["containers"])
        if name == "wdsr-merge":  # the one difference: the JobSet's merge has nothing to --wait for
            got[0]["args"].append(next(a for a in want["containers"][0]["args"] if a.startswith("--wait")))
        assert got == want["containers"]
        assert job["template"]["spec"]["volumes"] == want["volumes"]


@pytest.mark.parametrize("env", ENVS)
def test_every_variant_has_a_deadline_and_no_deprecated_nccl_variable(env):
    for variant in (*TRAIN, "build", "build-jobset"):
        objects = render(K8S / "overlays" / env / variant)
        assert "NCCL_ASYNC_ERROR_HANDLING" not in yaml.safe_dump_all(objects).replace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "")
        for o in objects:
            if o["kind"] == "Job":
                assert o["spec"]["activeDeadlineSeconds"] > 0, (variant, o["metadata"]["name"])
            elif o["kind"] == "JobSet":
                assert all(rj["template"]["spec"]["activeDeadlineSeconds"] > 0 for rj in o["spec"]["replicatedJobs"]), variant
            elif o["kind"] == "TrainJob":
                assert o["spec"]["activeDeadlineSeconds"] > 0  # the whole TrainJob, its JobSet's restarts included
                assert validate_custom_resource(o) == []


# ---- the pre-flight as PID 1 ---------------------------------------------------------------------------
def _pid1_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--map-root-user", "sh", "-c", "echo $$"], capture_output=True, text=True
    )
    return probe.returncode == 0 and probe.stdout.strip() == "1"


def _preflight(variant: str) -> tuple[dict, dict, list[dict]]:
    """(the pod's Job, the container that runs the pre-flight, the objects) of a training variant."""
    objects = render(K8S / "overlays" / "local-dev" / variant)
    if variant == "train":
        job = find(objects, "Job", "wdsr-train")
    else:
        js = find(objects, "JobSet", "wdsr-train") if variant == "train-jobset" else None
        js = js or trainjob_to_jobset(
            find(objects, "TrainJob", "wdsr-train"), find(objects, "TrainingRuntime", "wdsr-torch-distributed")
        )
        job = child_jobs(js)["node"]
    spec = job["spec"]["template"]["spec"]
    return job, (spec.get("initContainers") or spec["containers"])[0], objects


@pytest.mark.skipif(not _pid1_works(), reason="no PID namespaces here (unshare --pid --map-root-user)")
@pytest.mark.parametrize("variant", TRAIN)
def test_sigterm_ends_the_preflight_when_it_runs_as_pid_1(variant, tmp_path):
    """The pre-flight's container command run as PID 1 of a PID namespace, as in a pod, held inside the
    check by an S3 endpoint that accepts and never answers: SIGTERM to PID 1 ends it with 143 at once.
    Without a handler (Python's default, or sh waiting for a foreground child) PID 1 ignores SIGTERM and the
    pod would wait out its grace period."""
    job, container, objects = _preflight(variant)
    objects.append(find(render(K8S / "overlays" / "local-dev" / "s3"), "Secret", "wdsr-s3"))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
        overrides = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
        pod = Pod(job, objects, 0, tmp_path / "pod", overrides, {})
        env = pod.env(container)
        full = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT), **env}
        full["AWS_EC2_METADATA_DISABLED"] = "true"
        argv = ["unshare", "--pid", "--fork", "--map-root-user", *pod.argv(container, env)]
        proc = subprocess.Popen(argv, env=full, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            conn, _ = server.accept()  # the check is talking to S3 (and waits for an answer that never comes)
            (pid1,) = [
                p
                for p in descendants(proc.pid)
                if int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid
            ]
            os.kill(pid1, signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
            conn.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]


@pytest.mark.slow
def test_the_build_jobset_builds_then_merges_from_s3(s3, tmp_path):
    """local-dev's build JobSet executed in dependsOn order: the parts' pods, then (all complete) the merge's."""
    from shardmaker.verify import verify

    secret_objs = render(K8S / "overlays" / "local-dev" / "s3")
    secret = find(secret_objs, "Secret", "wdsr-s3")
    overrides = {k: v for k, v in s3.env().items() if k in secret["stringData"]}
    seed = find(secret_objs, "Job", "wdsr-seed")
    run_all([Pod(seed, secret_objs, 0, tmp_path / "seed", overrides, {})], "containers", timeout=120)
    objects = render(K8S / "overlays" / "local-dev" / "build-jobset") + [secret]
    env = find(objects, "ConfigMap", "wdsr-env")["data"]
    env["DATA_URL"] = env["DATA_URL"].rstrip("/") + "-jobset"
    jobs = child_jobs(find(objects, "JobSet", "wdsr-build"))
    n = jobs["parts"]["spec"]["completions"]
    run_all([Pod(jobs["parts"], objects, i, tmp_path / f"part-{i}", overrides, {}) for i in range(n)], "containers", timeout=300)
    run_all([Pod(jobs["merge"], objects, 0, tmp_path / "merge", overrides, {})], "containers", timeout=120)
    assert verify(env["DATA_URL"], deep=False, progress=False) == []


# ---- what a restart costs ---------------------------------------------------------------------------
