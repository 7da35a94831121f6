"""k8s/ next to other teams (issue 37, sections 3 and 4), checked offline on rendered manifests: the caches
fit the volumes they sit on, pods request the disk they use, several runs share a namespace (every
reference of a named run resolves), the Kueue, placement and identity components validate with every
overlay, the NetworkPolicy admits the run's own traffic only, images are pinned by digest."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

import pytest
import yaml

from tests.k8sctl import trainjob_to_jobset, validate_custom_resource
from tests.k8srun import Pod, find, render
from tests.test_k8s_scale import CUSTOM, K8S, ROOT, VARIANTS, gang_job, kubernetes_validate, main_container

ENVS = ["local-dev", "multi-node-gpu"]
COMPONENTS = ["kueue", "placement", "identity"]
SECRET = yaml.safe_load((K8S / "secret.example.yaml").read_text())
_UNITS = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def quantity(q: str | int) -> float:
    """A Kubernetes quantity (``4Gi``, ``500M``, ``250m``, ``8``) as a number (bytes, CPUs)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]i|[mkMGT])?", str(q))
    assert m, f"not a quantity: {q!r}"
    return float(m.group(1)) * _UNITS.get(m.group(2) or "", 1)


def render_with(overlay: str, tmp_path: Path, components: list[str] = (), prefix: str | None = None) -> list[dict]:
    """An overlay of ours as an operator's overlay on top of it renders it: components, a namePrefix."""
    top = tmp_path / f"top-{overlay.replace('/', '-')}-{'-'.join(components)}-{prefix}"
    top.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(K8S, top)
    kust: dict = {"resources": [f"{rel}/overlays/{overlay}"], "components": [f"{rel}/components/{c}" for c in components]}
    if prefix:
        kust["namePrefix"] = prefix
    (top / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    return render(top)


def pods(objects: list[dict]) -> dict[str, dict]:
    """name -> pod template (metadata and spec) of every workload, training's as its controller makes it."""
    out = {o["metadata"]["name"]: o["spec"]["template"] for o in objects if o["kind"] in ("Job", "Deployment")}
    if any(o["kind"] in CUSTOM for o in objects):
        job, _ = gang_job(objects)
        out[job["metadata"]["name"]] = job["spec"]["template"]
    return out


def train_settings(objects: list[dict], tmp_path: Path):
    from wdsr.train.config import make_config

    path = tmp_path / "train.yaml"
    path.write_text(find(objects, "ConfigMap", "wdsr-train")["data"]["train.yaml"])
    return make_config({"config": str(path), "data": "s3://bucket/data"})  # the real parser: sizes in bytes


def volume_of(spec: dict, path: str) -> dict:
    """The volume a path of the training container lies on (the longest mount path above it)."""
    mounts = [m for m in main_container(spec)["volumeMounts"] if path == m["mountPath"] or path.startswith(m["mountPath"] + "/")]
    name = max(mounts, key=lambda m: len(m["mountPath"]))["name"]
    return next(v for v in spec["volumes"] if v["name"] == name)


# ---- section 3: caches, volumes and the disk pods ask for ------------------------------------------------
SHARD_BYTES = 256 * 10**6  # shardmaker build's default --shard-size: one fetch in flight per worker


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("env", ENVS)
def test_cache_limits_fit_the_volumes_they_sit_on(env, variant, tmp_path):
    """cache-limit + the shards being fetched + the logs fit the scratch volume, decoded-cache-limit + the
    batch handoff the memory one: past a sizeLimit the kubelet evicts at once (no grace, no DisruptionTarget)."""
    objects = render(K8S / "overlays" / env / variant)
    cfg = train_settings(objects, tmp_path)
    spec = gang_job(objects)[0]["spec"]["template"]["spec"]
    ranks = int(find(objects, "ConfigMap", "wdsr-env")["data"]["NPROC_PER_NODE"])
    d = cfg.dataset
    assert d.cache_dir and d.cache_limit is not None, "the shard cache has no cache-limit"
    scratch = volume_of(spec, d.cache_dir)["emptyDir"]
    assert scratch.get("medium") != "Memory"
    in_flight = ranks * max(cfg.workers, 1) * SHARD_BYTES
    assert d.cache_limit + in_flight + 2**30 <= quantity(scratch["sizeLimit"]), (d.cache_limit, scratch)
    assert d.decoded_cache and d.decoded_cache_limit is not None
    dshm = volume_of(spec, d.decoded_cache)["emptyDir"]
    size = quantity(dshm["sizeLimit"])
    assert dshm["medium"] == "Memory" and d.decoded_cache_limit + max(128 * 2**20, size // 10) <= size, (d, dshm)


OVERLAYS = [f"{e}/{v}" for e in ENVS for v in ("build", *VARIANTS)] + ["local-dev/s3"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_request_the_disk_their_volumes_use(overlay, tmp_path):
    """Every container requests ephemeral-storage (the scheduler places the pod where the disk is), and
    the pod's limit covers its disk emptyDirs; no pod mounts an API token."""
    for name, template in pods(render_with(overlay, tmp_path)).items():
        spec = template["spec"]
        containers = spec.get("initContainers", []) + spec["containers"]
        for c in containers:
            assert "ephemeral-storage" in c["resources"]["requests"], (name, c["name"])
        disk = sum(
            quantity(v["emptyDir"]["sizeLimit"])
            for v in spec["volumes"]
            if v.get("emptyDir", {}).get("medium") != "Memory" and "emptyDir" in v
        )
        assert all("sizeLimit" in v["emptyDir"] for v in spec["volumes"] if "emptyDir" in v), name
        limit = sum(quantity(c["resources"]["limits"]["ephemeral-storage"]) for c in spec["containers"])
        assert limit >= disk, (name, limit, disk)
        assert spec.get("automountServiceAccountToken") is False, name


@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_training_pods_are_guaranteed(variant):
    """QoS Guaranteed, as the kubelet decides it: requests == limits for cpu and memory in every
    container, the pre-flight init container included (and for ephemeral-storage too)."""
    spec = gang_job(render(K8S / "overlays" / "multi-node-gpu" / variant))[0]["spec"]["template"]["spec"]
    for c in spec.get("initContainers", []) + spec["containers"]:
        req, lim = c["resources"]["requests"], c["resources"]["limits"]
        for r in ("cpu", "memory", "ephemeral-storage"):
            assert r in lim and quantity(req[r]) == quantity(lim[r]), (c["name"], r, req, lim)


# ---- several runs in a namespace: one run name ----------------------------------------------------------
def render_run(variant: str, tmp_path: Path, run: str) -> list[dict]:
    """k8s/runs/example as an operator copies it: another run name, the local-dev variant."""
    text = (K8S / "runs" / "example" / "kustomization.yaml").read_text()
    text = text.replace("overlays/multi-node-gpu/train-jobset", f"overlays/local-dev/{variant}")
    text = text.replace("namePrefix: edsr-x4-b-", f"namePrefix: {run}-")
    folder = K8S / "runs" / "example"
    top = tmp_path / f"runs-{run}-{variant}" / "x"
    top.mkdir(parents=True)
    rel = os.path.relpath(folder.parent.parent, top.parent)  # k8s/ from the copy's parent, as ../../ is from ours
    (top / "kustomization.yaml").write_text(text.replace("../../overlays/", f"../{rel}/overlays/"))
    return render(top)


def refs(node, key: str) -> set[str]:
    """Every ``name`` under a ``key`` mapping anywhere in an object (configMapRef, secretKeyRef, ...)."""
    out: set[str] = set()
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, dict) and "name" in v:
                out.add(v["name"])
            out |= refs(v, key)
    elif isinstance(node, list):
        for v in node:
            out |= refs(v, key)
    return out


def master_addr(objects: list[dict], tmp_path: Path) -> str:
    """--master-addr as pod 1's torchrun gets it: env expanded from the pod's own labels."""
    job, _ = gang_job(objects)
    pod = Pod(job, objects + [SECRET], 1, tmp_path / "expand", {}, {})
    c = main_container(pod.spec)
    return next(w.split("=", 1)[1] for w in pod.argv(c, pod.env(c)) if w.startswith("--master-addr="))


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_named_run_resolves_every_reference(variant, tmp_path):
    """With a namePrefix every object is the run's, and every reference points at one of them: the
    master address is the prefixed Service's DNS name for pod 0, the subdomain the Service, the
    selectors the run's pods, every ConfigMap and the runtime exist, and out: ends in the run's name."""
    run = "exp2"
    objects = render_run(variant, tmp_path, run)
    plain = render(K8S / "overlays" / "local-dev" / variant)
    assert all(o["metadata"]["name"].startswith(f"{run}-") for o in objects)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for o in objects:
        for cm in refs(o, "configMapRef") | refs(o, "configMapKeyRef") | refs(o, "configMap"):
            assert ("ConfigMap", cm) in names, (o["kind"], cm)
        assert refs(o, "secretRef") | refs(o, "secretKeyRef") <= {"wdsr-s3"}  # namespace-wide, shared by the runs
    ours = next(o for o in objects if o["kind"] in ("Job", "JobSet", "TrainJob"))
    name = ours["metadata"]["name"]
    assert name == f"{run}-wdsr-train"
    policy = find(objects, "NetworkPolicy", name)["spec"]
    label = "batch.kubernetes.io/job-name" if variant == "train" else "jobset.sigs.k8s.io/jobset-name"
    assert policy["podSelector"]["matchLabels"] == {label: name}
    assert policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == {label: name}
    assert policy["egress"][0]["to"][0]["podSelector"]["matchLabels"] == {label: name}
    if variant == "train":
        service = find(objects, "Service", ours["spec"]["template"]["spec"]["subdomain"])
        assert service["spec"]["selector"] == {label: name} and service["spec"]["clusterIP"] == "None"
        assert master_addr(objects, tmp_path) == f"{name}-0.{service['metadata']['name']}"
    elif variant == "train-jobset":
        assert "subdomain" not in ours["spec"]["network"]  # JobSet's Service: the JobSet's name
        assert master_addr(objects, tmp_path) == f"{name}-node-0-0.{name}"
    else:
        runtime = find(objects, "TrainingRuntime", ours["spec"]["runtimeRef"]["name"])
        node = main_container(
            trainjob_to_jobset(ours, runtime)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        )
        assert {e["name"]: e.get("value") for e in node["env"]}["PET_MASTER_ADDR"] == f"{name}-node-0-0.{name}"
    settings = yaml.safe_load(find(objects, "ConfigMap", f"{run}-wdsr-train")["data"]["train.yaml"])
    before = yaml.safe_load(find(plain, "ConfigMap", "wdsr-train")["data"]["train.yaml"])
    assert settings["out"] == before["out"].rsplit("/", 1)[0] + f"/{run}"
    assert {k: v for k, v in settings.items() if k != "out"} == {k: v for k, v in before.items() if k != "out"}


def test_two_runs_share_nothing_but_the_namespace_objects(tmp_path):
    a, b = (render_run("train-jobset", tmp_path, r) for r in ("exp-a", "exp-b"))
    assert not {(o["kind"], o["metadata"]["name"]) for o in a} & {(o["kind"], o["metadata"]["name"]) for o in b}
    outs = {
        yaml.safe_load(find(o, "ConfigMap", f"{r}-wdsr-train")["data"]["train.yaml"])["out"]
        for o, r in ((a, "exp-a"), (b, "exp-b"))
    }
    assert len(outs) == 2
    assert yaml.safe_load(find(render(K8S / "runs" / "example"), "ConfigMap", "edsr-x4-b-wdsr-train")["data"]["train.yaml"])[
        "out"
    ].endswith("/runs/edsr-x4-b")


# ---- the Kueue, placement and identity components with every overlay -------------------------------------
def check_component(component: str, objects: list[dict]) -> None:
    """What each component promises, on what it renders (training's pods as their controller makes them)."""
    train = [o for o in objects if o["kind"] in ("Job", "JobSet", "TrainJob") and o["metadata"]["name"] == "wdsr-train"]
    templates = pods(objects)
    gang = templates.get("wdsr-train") or templates.get("wdsr-train-node-0")
    if component == "kueue":
        queue = yaml.safe_load_all((K8S / "components" / "kueue" / "queue.example.yaml").read_text())
        names = {o["kind"]: o["metadata"]["name"] for o in queue}
        for o in train:
            assert o["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == names["LocalQueue"]
            assert o["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == names["WorkloadPriorityClass"]
            assert o["spec"]["suspend"] is True
        if gang:
            assert gang["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"]
    elif component == "placement" and gang:
        spec = gang["spec"]
        assert {"nvidia.com/gpu.product", "node.kubernetes.io/instance-type"} <= set(spec["nodeSelector"])
        assert {"nvidia.com/gpu", "cloud.google.com/gke-spot"} <= {t["key"] for t in spec["tolerations"]}
        assert gang["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
        assert gang["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    elif component == "identity":
        for name, template in templates.items():
            assert template["spec"]["serviceAccountName"] == "wdsr", name
            for c in template["spec"].get("initContainers", []) + template["spec"]["containers"]:
                secret = [e for e in c.get("envFrom", []) if "secretRef" in e] + [
                    e["valueFrom"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})
                ]
                assert all(next(iter(s.values())).get("optional") for s in secret), (name, c["name"], secret)


@pytest.mark.parametrize("component", [*COMPONENTS, "kueue+placement+identity"])
@pytest.mark.parametrize("overlay", [f"{e}/{v}" for e in ENVS for v in ("build", *VARIANTS)])
def test_components_render_and_validate_with_every_overlay(component, overlay, tmp_path):
    parts = component.split("+")
    objects = render_with(overlay, tmp_path, parts)
    for obj in objects:
        if obj["kind"] in CUSTOM:
            assert validate_custom_resource(obj) == [], obj["kind"]
    job, jobset = (None, None) if overlay.endswith("build") else gang_job(objects)
    if jobset is not None:
        assert validate_custom_resource(jobset) == []
    core = [o for o in objects if o["kind"] not in CUSTOM] + ([job] if jobset is not None else [])
    res = kubernetes_validate(core, tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    for part in parts:
        check_component(part, objects)


def test_kueue_and_identity_examples_validate(tmp_path):
    queue = list(yaml.safe_load_all((K8S / "components" / "kueue" / "queue.example.yaml").read_text()))
    assert {o["kind"] for o in queue} == {"LocalQueue", "WorkloadPriorityClass"}
    for obj in queue:
        assert validate_custom_resource(obj) == [], obj["kind"]
    bad = dict(queue[0], spec={"clusterQeue": "x"})  # the check can fail
    assert any("clusterQeue" in e for e in validate_custom_resource(bad))
    sa = yaml.safe_load((K8S / "serviceaccount.example.yaml").read_text())
    assert sa["metadata"]["name"] == "wdsr" and sa["automountServiceAccountToken"] is False
    res = kubernetes_validate([sa], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr


# ---- the NetworkPolicy, evaluated as the CNI would ----------------------------------------------------------
def _selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_admits(peer: dict, labels: dict | None, ip: str | None) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        return (
            ip is not None
            and ipaddress.ip_address(ip) in ipaddress.ip_network(block["cidr"])
            and not any(ipaddress.ip_address(ip) in ipaddress.ip_network(x) for x in block.get("except", []))
        )
    assert "namespaceSelector" not in peer, peer  # all our peers are pods of the run's own namespace
    return labels is not None and _selects(peer["podSelector"], labels)


def _rules_admit(rules: list[dict], side: str, labels: dict | None, ip: str | None, port: int, proto: str) -> bool:
    for rule in rules:
        peers_ok = not rule.get(side) or any(_peer_admits(p, labels, ip) for p in rule[side])
        ports_ok = not rule.get("ports") or any(p["port"] == port and p.get("protocol", "TCP") == proto for p in rule["ports"])
        if peers_ok and ports_ok:
            return True
    return False


def allowed(policies: list[dict], src: dict | None, dst: dict | None, port: int, proto: str = "TCP", ip: str = "") -> bool:
    """Whether a connection is allowed: src/dst are pod labels (None: outside the cluster, at ``ip``)."""
    for pod, direction, other, side in ((src, "Egress", dst, "to"), (dst, "Ingress", src, "from")):
        if pod is None:
            continue
        mine = [p["spec"] for p in policies if direction in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], pod)]
        key = direction.lower()
        if mine and not any(_rules_admit(p.get(key, []), side, other, ip if other is None else None, port, proto) for p in mine):
            return False
    return True


@pytest.mark.parametrize("variant", VARIANTS)
def test_network_policy_admits_the_runs_own_traffic_only(variant, tmp_path):
    a, b = render_run(variant, tmp_path, "exp-a"), render_run(variant, tmp_path, "exp-b")
    policies = [o for o in a + b if o["kind"] == "NetworkPolicy"]

    def labels(objects: list[dict], i: int) -> dict:
        job, _ = gang_job(objects)
        return Pod(job, objects, i, tmp_path / "labels", {}, {}).labels()

    a0, a1, b0 = labels(a, 0), labels(a, 1), labels(b, 0)
    dns = {"k8s-app": "kube-dns"}
    other = {"app.kubernetes.io/name": "wdsr-build", "batch.kubernetes.io/job-name": "wdsr-build"}
    assert allowed(policies, a1, a0, 29500) and allowed(policies, a0, a1, 41234)  # TCPStore; NCCL/gloo ports
    assert allowed(policies, a0, dns, 53, "UDP") and allowed(policies, a0, dns, 53, "TCP")
    assert allowed(policies, a0, None, 443, ip="52.216.8.1")  # S3
    assert not allowed(policies, a0, None, 22, ip="52.216.8.1") and not allowed(policies, a0, None, 80, ip="169.254.169.254")
    assert not allowed(policies, other, a0, 29500) and not allowed(policies, None, a0, 29500, ip="10.0.0.9")
    assert not allowed(policies, b0, a0, 29500) and not allowed(policies, a0, b0, 29500)  # another run
    seaweed = {"app.kubernetes.io/name": "seaweedfs"}
    assert allowed(policies, a0, seaweed, 8333)  # local-dev's S3 endpoint


# ---- images ---------------------------------------------------------------------------------------------------
def images(objects: list[dict]) -> dict[str, set[str]]:
    out = {
        name: {c["image"] for c in t["spec"].get("initContainers", []) + t["spec"]["containers"]}
        for name, t in pods(objects).items()
    }
    out.update({o["metadata"]["name"]: {o["spec"]["trainer"]["image"]} for o in objects if o["kind"] == "TrainJob"})
    return out


@pytest.mark.parametrize("variant", ["build", *VARIANTS])
def test_multi_node_images_are_pinned_by_digest(variant):
    """A tag can move during a run (pods before and after a preemption would run different code)."""
    got = images(render(K8S / "overlays" / "multi-node-gpu" / variant))
    digests = {img for imgs in got.values() for img in imgs}
    assert all(re.fullmatch(r"[a-z0-9.\-/]+@sha256:[0-9a-f]{64}", img) for img in digests), digests
    kustomization = yaml.safe_load((K8S / "overlays" / "multi-node-gpu" / "config" / "kustomization.yaml").read_text())
    pinned = {i["name"]: f"{i['newName']}@{i['digest']}" for i in kustomization["images"]}
    want = pinned["wdsr-cpu"] if variant == "build" else pinned["wdsr"]  # build and merge: the CPU image
    assert digests == {want} and pinned["wdsr"] != pinned["wdsr-cpu"]


def test_the_image_builds_every_source_kind():
    """Videos (--clips: PyAV) and compressed TIFF slides (imagecodecs) with the image's default extras."""
    extras = re.search(r"^ARG EXTRAS=(\S+)", (ROOT / "Dockerfile").read_text(), re.M).group(1).split(",")
    import tomllib

    defined = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"s3", "video", "tiff"} <= set(extras) <= set(defined)
    assert any(d.startswith("av") for d in defined["video"]) and any(d.startswith("imagecodecs") for d in defined["tiff"])
