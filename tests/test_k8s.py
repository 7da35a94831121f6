"""k8s/: every overlay renders with real `kubectl kustomize`, passes `kubernetes-validate --strict`,
and local-dev's Jobs run, as local processes, against a real S3 server: build, merge, train."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.k8srun import Pod, find, render, run_all
from tests.s3server import free_port

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
K8S_VERSION = "1.33.0"  # the oldest Kubernetes these manifests are checked against
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"
OVERLAYS = ["local-dev/s3", "local-dev/build", "local-dev/train", "multi-node-gpu/build", "multi-node-gpu/train"]


def validate(objects: list[dict], tmp_path: Path) -> subprocess.CompletedProcess:
    f = tmp_path / "rendered.yaml"
    f.write_text(yaml.safe_dump_all(objects))
    return subprocess.run(
        [str(VALIDATE), "--strict", "--quiet", "-k", K8S_VERSION, str(f)], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_render_and_pass_strict_schema_validation(overlay, tmp_path):
    objects = render(K8S / "overlays" / overlay)
    assert objects
    res = validate(objects, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    for obj in objects:
        if obj["kind"] not in ("Job", "Deployment"):
            continue
        spec = obj["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert c["resources"]["limits"] and c["resources"]["requests"]


def test_strict_validation_rejects_a_misspelt_field(tmp_path):
    """The check above can fail: a field the schema does not know is refused."""
    objects = render(K8S / "overlays" / "local-dev" / "train")
    job = find(objects, "Job", "wdsr-train")
    job["spec"]["template"]["spec"]["containers"][0]["commands"] = ["torchrun"]
    res = validate(objects, tmp_path)
    assert res.returncode != 0 and "commands" in res.stdout + res.stderr


@pytest.mark.parametrize("overlay", ["local-dev", "multi-node-gpu"])
def test_job_sizes_agree_with_the_settings(overlay):
    """completions = parallelism = NNODES (train) / BUILD_PARTS (build); GPUs per pod = ranks per pod."""
    train = render(K8S / "overlays" / overlay / "train")
    env = find(train, "ConfigMap", "wdsr-env")["data"]
    job = find(train, "Job", "wdsr-train")
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == int(env["NNODES"])
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    if "nvidia.com/gpu" in limits:
        assert int(limits["nvidia.com/gpu"]) == int(env["NPROC_PER_NODE"])
    settings = yaml.safe_load(find(train, "ConfigMap", "wdsr-train")["data"]["train.yaml"])
    assert "data" not in settings  # the dataset is named once: DATA_URL, which the build writes and training reads
    spec = job["spec"]["template"]["spec"]
    for c in spec.get("initContainers", []) + spec["containers"]:
        assert "--data=$(DATA_URL)" in c["args"], c["name"]
    build = render(K8S / "overlays" / overlay / "build")
    bjob = find(build, "Job", "wdsr-build")
    assert (
        bjob["spec"]["completions"]
        == bjob["spec"]["parallelism"]
        == int(find(build, "ConfigMap", "wdsr-env")["data"]["BUILD_PARTS"])
    )


def test_example_secret_holds_placeholders_only():
    text = (K8S / "secret.example.yaml").read_text()
    secret = yaml.safe_load(text)
    assert secret["metadata"]["name"] == "wdsr-s3"
    assert secret["stringData"]["AWS_SECRET_ACCESS_KEY"] == "REPLACE_ME"
    assert secret["stringData"]["AWS_ACCESS_KEY_ID"] == "REPLACE_ME"


def test_dockerfile_installs_the_pinned_torch_of_the_makefile():
    pin = re.search(r"^TORCH\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    docker = (ROOT / "Dockerfile").read_text()
    assert f"ARG TORCH={pin}" in docker
    images = {
        o["metadata"]["name"]: {c["image"].split(":")[0] for c in o["spec"]["template"]["spec"]["containers"]}
        for o in render(K8S / "base" / "train") + render(K8S / "base" / "build")
        if o["kind"] == "Job"
    }
    # training runs the image (CUDA where there are GPUs); build and merge the CPU one (overlays pin both)
    assert images == {"wdsr-train": {"wdsr"}, "wdsr-build": {"wdsr-cpu"}, "wdsr-merge": {"wdsr-cpu"}}


def test_dockerfile_installs_spandrel_with_the_torchvision_of_its_torch():
    """The image trains spandrel models (the zoo extra), with the torchvision built for the pinned torch installed
    in the same pip command, from the same index, as torch: PyPI's CUDA torchvision never lands beside the CPU torch."""
    from wdsr.integrations.basicsr import torchvision_pin

    docker = (ROOT / "Dockerfile").read_text()
    torch_pin = re.search(r"^ARG TORCH=torch==(\S+)", docker, re.M).group(1)
    assert f"ARG TORCHVISION={torchvision_pin(torch_pin)}" in docker
    assert "zoo" in re.search(r"^ARG EXTRAS=(\S+)", docker, re.M).group(1).split(",")
    installs = [line for line in docker.replace("\\\n", " ").splitlines() if "pip install" in line]
    torch_install = next(line for line in installs if '"$TORCH"' in line)
    assert '"$TORCHVISION"' in torch_install.split("&&")[0] and "$TORCH_INDEX" in torch_install.split("&&")[0]
    assert torch_install.index('"$TORCHVISION"') < torch_install.index(".[$EXTRAS]")
    guide = (ROOT / "docs" / "kubernetes.md").read_text()
    assert f"TORCHVISION={torchvision_pin(torch_pin)}" in guide and "EXTRAS=s3,demo,video,tiff,zoo" in guide


def _pods(
    objects: list[dict], job_name: str, work: Path, overrides: dict[str, str], hosts: dict[str, str] | None = None
) -> list[Pod]:
    job = find(objects, "Job", job_name)
    n = job["spec"].get("completions", 1)
    return [Pod(job, objects, i, work / f"{job_name}-{i}", overrides, hosts or {}) for i in range(n)]


@pytest.mark.slow
def test_local_dev_jobs_build_merge_and_train_from_s3(s3, tmp_path):
    import s3fs
    import torch

    from shardmaker.verify import verify

    secret_objs = render(K8S / "overlays" / "local-dev" / "s3")
    secret = find(secret_objs, "Secret", "wdsr-s3")
    overrides = {k: v for k, v in s3.env().items() if k in secret["stringData"]}
    assert {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(overrides)

    # seed: the bucket and the demo photos, by local-dev's own seed Job
    run_all(_pods(secret_objs, "wdsr-seed", tmp_path, overrides), "containers", timeout=120)

    # build (2 parts at once) and merge, with the Secret the s3 overlay defines
    build = render(K8S / "overlays" / "local-dev" / "build") + [secret]
    env = find(build, "ConfigMap", "wdsr-env")["data"]
    build_pods = _pods(build, "wdsr-build", tmp_path, overrides)
    assert len(build_pods) == 2
    run_all(build_pods + _pods(build, "wdsr-merge", tmp_path, overrides), "containers", timeout=300)
    assert verify(env["DATA_URL"], deep=False, progress=False) == []

    # train: 2 "nodes", torchrun in each, the rendezvous Service's name mapped to 127.0.0.1
    train = render(K8S / "overlays" / "local-dev" / "train") + [secret]
    cm = find(train, "ConfigMap", "wdsr-train")
    settings = yaml.safe_load(cm["data"]["train.yaml"])
    settings.update({"steps": 4, "log-every": 1, "ckpt-every": 2})  # a few steps, not a few hundred
    cm["data"]["train.yaml"] = yaml.safe_dump(settings)
    job = find(train, "Job", "wdsr-train")
    pod0 = Pod(job, train, 0, tmp_path / "expand", {}, {})
    words = pod0.argv(
        job["spec"]["template"]["spec"]["containers"][0], pod0.env(job["spec"]["template"]["spec"]["containers"][0])
    )
    addr = next(a.split("=", 1)[1] for a in words if a.startswith("--master-addr="))
    port = next(a.split("=", 1)[1] for a in words if a.startswith("--master-port="))
    service = find(train, "Service", job["spec"]["template"]["spec"]["subdomain"])
    assert addr == f"wdsr-train-0.{service['metadata']['name']}"
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    hosts = {f"--master-addr={addr}": "--master-addr=127.0.0.1", f"--master-port={port}": f"--master-port={free_port()}"}
    pods = _pods(train, "wdsr-train", tmp_path, overrides, hosts)
    assert len(pods) == 2
    run_all(pods, "initContainers", timeout=120)  # the pre-flight --check
    run_all(pods, "containers", timeout=400)

    fs = s3fs.S3FileSystem(
        endpoint_url=s3.endpoint, key=overrides["AWS_ACCESS_KEY_ID"], secret=overrides["AWS_SECRET_ACCESS_KEY"]
    )
    out = settings["out"].removeprefix("s3://")
    latest = json.loads(fs.cat(f"{out}/latest.json"))
    assert latest["step"] == 4
    import io

    state = torch.load(io.BytesIO(fs.cat(f"{out}/{latest['path']}")), weights_only=True)
    assert state["step"] == 4 and state["world_size"] == 2
    records = [json.loads(x) for x in fs.cat(f"{out}/metrics.jsonl").decode().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4], records
    final = records[-1]
    assert final["event"] == "finished" and final["weights_in_sync"] and len(final["weights_sha256"]) == 2
    assert all(0 <= r["data_wait"] <= 1 and r["patches_per_s"] > 0 for r in records if "loss" in r)
    # the config file's /scratch paths reached the pod's own scratch volume (mapped here), not the host's
    assert (tmp_path / "wdsr-train-0" / "scratch" / "logs" / "metrics.jsonl").exists()
    assert list((tmp_path / "wdsr-train-1" / "scratch" / "shard-cache").rglob("*.tar"))
