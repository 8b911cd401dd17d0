"""Rendering attempts as Kubernetes objects: Job, Indexed Job + headless Service, RayJob."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from controller import marks
from controller.runs import objects, rendering
from shared import spec as specs

FIXTURES = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "specs"
RUN = objects.RunRef(name="demo", namespace="team-a", uid="0b5e7c1e-uid")
SETTINGS = rendering.RenderSettings(
    controller_url="http://taugrid.taugrid-system:8080", termination_grace_period_s=90
)
DIGEST = "@sha256:" + "ab" * 32


def _spec(text: str) -> specs.TauSpec:
    return specs.parse_spec(text.encode()).spec


def _fixture(name: str) -> specs.TauSpec:
    return specs.parse_spec((FIXTURES / name).read_bytes()).spec


def _ctx(attempt: int = 1, resume_from: str = "", reason: str = "") -> rendering.AttemptContext:
    return rendering.AttemptContext(
        run=RUN,
        attempt=attempt,
        checkpoint_configmap="demo-checkpoint",
        resume_from=resume_from,
        failure_reason=reason,
    )


def _render(
    spec: specs.TauSpec, ctx: rendering.AttemptContext | None = None
) -> list[dict[str, Any]]:
    return rendering.render_attempt(spec, ctx or _ctx(), SETTINGS)


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "Job":
        return [obj["spec"]["template"]["spec"]]
    if obj["kind"] == "RayJob":
        cluster = obj["spec"]["rayClusterSpec"]
        return [cluster["headGroupSpec"]["template"]["spec"]] + [
            group["template"]["spec"] for group in cluster["workerGroupSpecs"]
        ]
    return []


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def _by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [obj for obj in objects if obj["kind"] == kind]
    return found


ALL_FIXTURES = pytest.mark.parametrize(
    "fixture",
    [
        pytest.param("job.yaml", id="a job"),
        pytest.param("pytorch.yaml", id="a pytorch run"),
        pytest.param("ray.yaml", id="a ray run"),
    ],
)


@pytest.mark.parametrize(
    ("fixture", "expected"),
    [
        pytest.param("job.yaml", [("batch/v1", "Job", "demo-a1")], id="a job is one Job"),
        pytest.param(
            "pytorch.yaml",
            [
                ("networking.k8s.io/v1", "NetworkPolicy", "demo-a1"),
                ("v1", "Service", "demo-a1"),
                ("batch/v1", "Job", "demo-a1"),
            ],
            id="a pytorch run is its NetworkPolicy, a headless Service, then an Indexed Job",
        ),
        pytest.param(
            "ray.yaml",
            [
                ("networking.k8s.io/v1", "NetworkPolicy", "demo-a1"),
                ("ray.io/v1", "RayJob", "demo-a1"),
            ],
            id="a ray run is its NetworkPolicy then a RayJob",
        ),
    ],
)
def test_objects_per_kind(fixture: str, expected: list[tuple[str, str, str]]) -> None:
    """Each run kind renders its objects, named `<run>-a<N>`, in creation order."""
    actual = [
        (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        for obj in _render(_fixture(fixture))
    ]
    assert expected == actual


@ALL_FIXTURES
def test_every_object_is_owned_labelled_and_hashed(fixture: str) -> None:
    """Every object carries the run labels, the owner reference and the config hash."""
    spec = _fixture(fixture)
    expected_owner = [
        {
            "apiVersion": "taugrid.dev/v1alpha1",
            "kind": "TauRun",
            "name": "demo",
            "uid": "0b5e7c1e-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    for obj in _render(spec):
        meta = obj["metadata"]
        expected = ("team-a", "demo", "1", expected_owner, specs.spec_hash(spec))
        actual = (
            meta["namespace"],
            meta["labels"][marks.RUN_LABEL],
            meta["labels"][marks.ATTEMPT_LABEL],
            meta["ownerReferences"],
            meta["annotations"][marks.CONFIG_HASH_ANNOTATION],
        )
        assert expected == actual


@pytest.mark.parametrize(
    ("fixture", "expected_labels"),
    [
        pytest.param(
            "job.yaml",
            {"kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high"},
            id="queue and priority labels when a priority is given",
        ),
        pytest.param(
            "pytorch.yaml",
            {"kueue.x-k8s.io/queue-name": "default"},
            id="only the queue label without a priority",
        ),
        pytest.param("ray.yaml", {"kueue.x-k8s.io/queue-name": "ray"}, id="a RayJob's queue"),
    ],
)
def test_kueue_sees_a_suspended_workload(fixture: str, expected_labels: dict[str, str]) -> None:
    """The Kueue-managed object is created suspended, with backoffLimit 0 and its queue labels."""
    objects = _render(_fixture(fixture))
    workload = objects[-1]
    kueue_labels = {
        key: value
        for key, value in workload["metadata"]["labels"].items()
        if key.startswith("kueue.x-k8s.io/")
    }
    expected = (True, 0, expected_labels)
    assert expected == (workload["spec"]["suspend"], workload["spec"]["backoffLimit"], kueue_labels)


@ALL_FIXTURES
def test_pods_are_plain_and_checkpoint_friendly(fixture: str) -> None:
    """Pods never restart in place, carry no tolerations or selectors (Kueue injects them) and
    get the configured grace period to save a checkpoint on SIGTERM."""
    for pod in _render(_fixture(fixture))[-1:]:
        for pod_spec in _pod_specs(pod):
            expected = ("Never", 90, False, False)
            actual = (
                pod_spec["restartPolicy"],
                pod_spec["terminationGracePeriodSeconds"],
                "tolerations" in pod_spec,
                "nodeSelector" in pod_spec,
            )
            assert expected == actual


@ALL_FIXTURES
def test_pods_carry_no_kubernetes_credential(fixture: str) -> None:
    """Every pod template runs as the namespace's default ServiceAccount without mounting its
    token, as the chart's ValidatingAdmissionPolicy requires of the controller's writes."""
    for pod in _render(_fixture(fixture))[-1:]:
        for pod_spec in _pod_specs(pod):
            expected = (False, None, None)
            actual = (
                pod_spec["automountServiceAccountToken"],
                pod_spec.get("serviceAccountName"),
                pod_spec.get("serviceAccount"),
            )
            assert expected == actual


def test_single_gpu_job() -> None:
    """A one-worker job: one pod, shell command under sh -c, resources, volumes, pull secrets."""
    spec = _fixture("job.yaml")
    job = _by_kind(_render(spec), "Job")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    actual = {
        "parallelism": job["spec"]["parallelism"],
        "completions": job["spec"]["completions"],
        "mode": job["spec"]["completionMode"],
        "command": container["command"],
        "has_args": "args" in container,
        "resources": container["resources"],
        "pod_labels": job["spec"]["template"]["metadata"]["labels"],
        "volumes": [v for v in pod["volumes"] if "persistentVolumeClaim" in v],
        "pvc_mounts": [m for m in container["volumeMounts"] if m["name"].startswith("vol-")],
    }
    expected = {
        "parallelism": 1,
        "completions": 1,
        "mode": "NonIndexed",
        "command": ["/bin/sh", "-c", "python train.py --epochs 10"],
        "has_args": False,
        "resources": {
            "requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
            "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"},
        },
        "pod_labels": {"team": "vision", "taugrid.dev/run": "demo", "taugrid.dev/attempt": "1"},
        "volumes": [
            {"name": "vol-0", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
            {"name": "vol-1", "persistentVolumeClaim": {"claimName": "scratch", "readOnly": False}},
        ],
        "pvc_mounts": [
            {"name": "vol-0", "mountPath": "/data", "readOnly": True},
            {"name": "vol-1", "mountPath": "/scratch", "readOnly": False},
        ],
    }
    assert expected == actual


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        pytest.param(1, (1, 1), id="one worker"),
        pytest.param(4, (4, 4), id="four workers run in parallel"),
    ],
)
def test_multi_worker_job(workers: int, expected: tuple[int, int]) -> None:
    """A multi-worker job sets parallelism and completions to the worker count."""
    spec = _spec(f"name: x\nimage: i{DIGEST}\ncommand: [a]\nworkers: {workers}\n")
    job = _by_kind(_render(spec), "Job")
    assert expected == (job["spec"]["parallelism"], job["spec"]["completions"])


def test_tau_env_of_a_first_attempt() -> None:
    """The TAU_* env names the run, attempt and controller, and the file of the pod's token."""
    job = _by_kind(_render(_fixture("job.yaml")), "Job")
    env = _env(job["spec"]["template"]["spec"]["containers"][0])
    expected = {
        "TAU_RUN": "demo",
        "TAU_NAMESPACE": "team-a",
        "TAU_ATTEMPT": "1",
        "TAU_WORKERS": "1",
        "TAU_URL": "http://taugrid.taugrid-system:8080",
        "TAU_TOKEN_FILE": "/var/run/secrets/taugrid.dev/run/token",
        "TAU_CHECKPOINT_DIR": "/scratch/mnist",
        "TAU_CHECKPOINT_FILE": "/var/run/taugrid/checkpoint/latest",
        "TAU_RESUME_FROM": "",
        "TAU_FAILURE_REASON": "",
        "LEARNING_RATE": "0.001",
        "EPOCHS": "10",
    }
    assert expected == env


def test_resumed_attempt_env_and_name() -> None:
    """Attempt N+1 is a new object and knows where to resume from and why."""
    ctx = _ctx(attempt=2, resume_from="/scratch/mnist/step-200", reason="NodeFailure")
    job = _by_kind(_render(_fixture("job.yaml"), ctx), "Job")
    env = _env(job["spec"]["template"]["spec"]["containers"][0])
    expected = ("demo-a2", "2", "2", "/scratch/mnist/step-200", "NodeFailure")
    actual = (
        job["metadata"]["name"],
        job["metadata"]["labels"][marks.ATTEMPT_LABEL],
        env["TAU_ATTEMPT"],
        env["TAU_RESUME_FROM"],
        env["TAU_FAILURE_REASON"],
    )
    assert expected == actual


@ALL_FIXTURES
def test_checkpoint_configmap_is_mounted_as_a_directory(fixture: str) -> None:
    """Every pod mounts the per-run ConfigMap as a directory (no subPath), so the kubelet
    keeps the `latest` file current even for a pod Kueue readmits, and /dev/shm is memory."""
    for obj in _render(_fixture(fixture)):
        for pod in _pod_specs(obj):
            volumes = {v["name"]: v for v in pod["volumes"]}
            mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
            expected = (
                {
                    "name": "demo-checkpoint",
                    "optional": True,
                    "items": [{"key": "latest", "path": "latest"}],
                },
                {
                    "name": "taugrid-checkpoint",
                    "mountPath": "/var/run/taugrid/checkpoint",
                    "readOnly": True,
                },
                "Memory",
                "/dev/shm",
            )
            actual = (
                volumes["taugrid-checkpoint"]["configMap"],
                mounts["taugrid-checkpoint"],
                volumes["dshm"]["emptyDir"]["medium"],
                mounts["dshm"]["mountPath"],
            )
            assert expected == actual


CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


@pytest.mark.parametrize(
    ("ca_pem", "expected_env", "expected_items"),
    [
        pytest.param(
            CA_PEM, "/var/run/taugrid/checkpoint/ca.crt", ["latest", "ca.crt"],
            id="a controller with a CA names the mounted file in TAU_CA_FILE",
        ),
        pytest.param("", None, ["latest"], id="a controller without a CA sets no TAU_CA_FILE"),
    ],
)  # fmt: skip
@ALL_FIXTURES
def test_run_pods_trust_the_controllers_ca_only_when_it_has_one(
    fixture: str, ca_pem: str, expected_env: str | None, expected_items: list[str]
) -> None:
    """Every pod of every kind finds the CA beside the checkpoint file when one is configured,
    and nothing points at a file that will not exist when none is."""
    settings = rendering.RenderSettings(controller_url="https://c:8080", ca_pem=ca_pem)
    for obj in rendering.render_attempt(_fixture(fixture), _ctx(), settings):
        for pod in _pod_specs(obj):
            volumes = {v["name"]: v for v in pod["volumes"]}
            items = volumes["taugrid-checkpoint"]["configMap"]["items"]
            actual = (_env(pod["containers"][0]).get("TAU_CA_FILE"), [i["key"] for i in items])
            assert (expected_env, expected_items) == actual


def test_checkpoint_configmap_carries_the_ca_when_given() -> None:
    """`ca_pem` goes under `ca.crt` beside `latest`; without it the map has no such key."""
    name = objects.checkpoint_configmap_name("demo")
    with_ca = objects.render_checkpoint_configmap(RUN, name, "", ca_pem=CA_PEM)
    without = objects.render_checkpoint_configmap(RUN, name, "")
    expected = ({"latest": "", "ca.crt": CA_PEM}, {"latest": ""})
    assert expected == (with_ca["data"], without["data"])


def test_checkpoint_claim_not_listed_is_mounted_at_dir() -> None:
    """A checkpoint volume absent from `volumes` is mounted at checkpoint.dir."""
    spec = _fixture("pytorch.yaml")
    job = _by_kind(_render(spec), "Job")
    pod = job["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "checkpoint")
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "checkpoint")
    expected = ({"claimName": "checkpoints"}, "/ckpt")
    assert expected == (volume["persistentVolumeClaim"], mount["mountPath"])


def test_pytorch_headless_service() -> None:
    """The Service is headless, publishes not-ready pods and selects only this attempt."""
    service = _by_kind(_render(_fixture("pytorch.yaml"), _ctx(attempt=3)), "Service")
    expected = {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {"taugrid.dev/run": "demo", "taugrid.dev/attempt": "3"},
        "ports": [{"name": "rendezvous", "port": 29500, "targetPort": 29500, "protocol": "TCP"}],
    }
    assert expected == service["spec"]


def test_pytorch_indexed_job_and_rendezvous_env() -> None:
    """The Indexed Job runs every worker at once, its pods resolve as `<job>-<i>.<service>`,
    and torchrun's env points at worker 0 with the node rank from the completion index."""
    objects = _render(_fixture("pytorch.yaml"))
    service, job = _by_kind(objects, "Service"), _by_kind(objects, "Job")
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = _env(container)
    rank = {
        "fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        }
    }
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    actual = {
        "mode": job["spec"]["completionMode"],
        "parallelism": job["spec"]["parallelism"],
        "completions": job["spec"]["completions"],
        "subdomain": pod["subdomain"],
        "rendezvous": {
            key: env[key]
            for key in (
                "MASTER_ADDR",
                "MASTER_PORT",
                "NNODES",
                "NPROC_PER_NODE",
                "NODE_RANK",
                "PET_MASTER_ADDR",
                "PET_MASTER_PORT",
                "PET_NNODES",
                "PET_NPROC_PER_NODE",
                "PET_NODE_RANK",
            )
        },
        "command": container["command"],
        "args": container["args"],
        "shm": shm["emptyDir"],
        "pull_secrets": pod["imagePullSecrets"],
    }
    master = "demo-a1-0.demo-a1"  # hostname of index 0, then the Service (subdomain)
    expected = {
        "mode": "Indexed",
        "parallelism": 2,
        "completions": 2,
        "subdomain": service["metadata"]["name"],
        "rendezvous": {
            "MASTER_ADDR": master,
            "MASTER_PORT": "29500",
            "NNODES": "2",
            "NPROC_PER_NODE": "8",
            "NODE_RANK": rank,
            "PET_MASTER_ADDR": master,
            "PET_MASTER_PORT": "29500",
            "PET_NNODES": "2",
            "PET_NPROC_PER_NODE": "8",
            "PET_NODE_RANK": rank,
        },
        "command": ["torchrun", "train.py"],
        "args": ["--config", "/data/ft.yaml"],
        "shm": {"medium": "Memory", "sizeLimit": "64Gi"},
        "pull_secrets": [{"name": "registry-cred"}],
    }
    assert expected == actual


def test_rayjob_shape() -> None:
    """The RayJob has the entrypoint, a head without GPUs and one fixed-size GPU worker group,
    and shuts its cluster down when the job finishes."""
    rayjob = _by_kind(_render(_fixture("ray.yaml")), "RayJob")
    cluster = rayjob["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    (group,) = cluster["workerGroupSpecs"]
    worker = group["template"]["spec"]["containers"][0]
    actual = {
        "entrypoint": rayjob["spec"]["entrypoint"],
        "shutdown": rayjob["spec"]["shutdownAfterJobFinishes"],
        "mode": rayjob["spec"]["submissionMode"],
        "autoscaling": cluster["enableInTreeAutoscaling"],
        "head_resources": head["resources"],
        "head_has_command": "command" in head,
        "group": (
            group["groupName"],
            group["replicas"],
            group["minReplicas"],
            group["maxReplicas"],
        ),
        "worker_resources": worker["resources"],
        "worker_env_run": _env(worker)["TAU_RUN"],
    }
    expected = {
        "entrypoint": "python tune.py --samples 16",
        "shutdown": True,
        "mode": "K8sJobMode",
        "autoscaling": False,
        "head_resources": {
            "requests": {"cpu": "8", "memory": "64Gi"},
            "limits": {"memory": "64Gi"},
        },
        "head_has_command": False,
        "group": ("workers", 2, 2, 2),
        "worker_resources": {
            "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"},
            "limits": {"memory": "64Gi", "nvidia.com/gpu": "2"},
        },
        "worker_env_run": "demo",
    }
    assert expected == actual


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        pytest.param(
            "[python, t.py]\nargs: [--name, 'a b']",
            "python t.py --name 'a b'",
            id="exec form is quoted",
        ),
        pytest.param(
            "python t.py | tee log\nargs: [x y]",
            "python t.py | tee log 'x y'",
            id="a shell string is kept",
        ),
    ],
)
def test_ray_entrypoint(command: str, expected: str) -> None:
    """Ray runs the entrypoint through a shell: exec-form words are quoted, shell text is not."""
    spec = _spec(f"kind: ray\nname: x\nimage: i{DIGEST}\ncommand: {command}\n")
    assert expected == rendering.ray_entrypoint(spec)


def test_cpu_only_run_asks_for_no_gpu() -> None:
    """A run without GPUs and without cpu/memory renders no resource requests at all."""
    job = _by_kind(_render(_spec(f"name: x\nimage: i{DIGEST}\ncommand: [a]\n")), "Job")
    expected: dict[str, Any] = {}
    assert expected == job["spec"]["template"]["spec"]["containers"][0]["resources"]


def test_rendering_is_deterministic() -> None:
    """The same inputs give equal objects (no clock, no randomness)."""
    spec = _fixture("pytorch.yaml")
    assert _render(spec) == _render(spec)


def test_config_hash_follows_the_spec() -> None:
    """A different spec gives a different config-hash annotation."""
    one = _render(_spec(f"name: x\nimage: i{DIGEST}\ncommand: [a]\n"))[0]
    two = _render(_spec(f"name: x\nimage: i{DIGEST}\ncommand: [b]\n"))[0]
    key = marks.CONFIG_HASH_ANNOTATION
    assert one["metadata"]["annotations"][key] != two["metadata"]["annotations"][key]


def test_job_ttl_and_ray_version_come_from_settings() -> None:
    """Optional settings appear only when set."""
    settings = rendering.RenderSettings(
        controller_url="http://c", job_ttl_after_finished_s=600, ray_version="2.52.0"
    )
    job = rendering.render_attempt(_fixture("job.yaml"), _ctx(), settings)[0]
    rayjob = _by_kind(rendering.render_attempt(_fixture("ray.yaml"), _ctx(), settings), "RayJob")
    expected = (600, "2.52.0", False)
    actual = (
        job["spec"]["ttlSecondsAfterFinished"],
        rayjob["spec"]["rayClusterSpec"]["rayVersion"],
        "ttlSecondsAfterFinished" in _render(_fixture("job.yaml"))[0]["spec"],
    )
    assert expected == actual


def test_attempt_zero_is_refused() -> None:
    """Attempts are numbered from 1."""
    with pytest.raises(ValueError, match="start at 1"):
        _render(_fixture("job.yaml"), _ctx(attempt=0))


def test_the_checkpoint_configmap() -> None:
    """The per-run ConfigMap is owned by the TauRun and holds the documented key."""
    config = objects.render_checkpoint_configmap(
        RUN, objects.checkpoint_configmap_name("demo"), "/ckpt/step-200"
    )
    expected = ("demo-checkpoint", [objects.owner_reference(RUN)], {"latest": "/ckpt/step-200"})
    actual = (config["metadata"]["name"], config["metadata"]["ownerReferences"], config["data"])
    assert expected == actual


@ALL_FIXTURES
def test_every_run_pod_gets_its_own_run_token_and_no_kubernetes_credential(
    fixture: str,
) -> None:
    """Each pod template mounts a projected token of audience taugrid-run at TAU_TOKEN_FILE
    (read-only, an hour's lifetime), automounts no ServiceAccount token, and no container
    carries a token in its env (DESIGN.md section 10: run identity)."""
    for obj in _render(_fixture(fixture)):
        for pod in _pod_specs(obj):
            (volume,) = [v for v in pod["volumes"] if v["name"] == "taugrid-run-token"]
            expected: tuple[Any, ...] = (
                [{"serviceAccountToken": {"audience": "taugrid-run",
                                          "expirationSeconds": 3600, "path": "token"}}],
                False,
                [{"name": "taugrid-run-token",
                  "mountPath": "/var/run/secrets/taugrid.dev/run", "readOnly": True}],
                "/var/run/secrets/taugrid.dev/run/token",
                [],
            )  # fmt: skip
            container = pod["containers"][0]
            actual = (
                volume["projected"]["sources"],
                pod["automountServiceAccountToken"],
                [m for m in container["volumeMounts"] if m["name"] == "taugrid-run-token"],
                _env(container)["TAU_TOKEN_FILE"],
                [e for e in container["env"] if e["name"] == "TAU_TOKEN" or ("valueFrom" in e
                 and "secretKeyRef" in e["valueFrom"])],
            )  # fmt: skip
            assert expected == actual


def test_longest_names_fit_kubernetes_limits() -> None:
    """A 40-character run at attempt 100 still gives pod hostnames within 63 characters."""
    name = "r" * specs.MAX_NAME_LENGTH
    job_name = objects.attempt_name(name, specs.MAX_ATTEMPTS)
    hostname = f"{job_name}-{specs.MAX_WORKERS - 1}"
    assert len(hostname) <= 63


DRA = rendering.RenderSettings(
    controller_url="http://taugrid.taugrid-system:8080", dra=True, dra_grace_s=45
)


@ALL_FIXTURES
def test_on_dra_an_attempt_starts_with_a_claim_template_its_gpu_pods_claim_from(
    fixture: str,
) -> None:
    """DRA: a ResourceClaimTemplate `<run>-a<N>-gpus` comes first; every pod that wants
    GPUs names it (never a named claim) and its container names the claim instead of
    asking for nvidia.com/gpu; pods without GPUs (the ray head) claim nothing."""
    spec = _fixture(fixture)
    rendered = rendering.render_attempt(spec, _ctx(), DRA)
    first = rendered[0]
    expected = ("ResourceClaimTemplate", "demo-a1-gpus", "team-a", RUN.uid)
    actual = (first["kind"], first["metadata"]["name"], first["metadata"]["namespace"],
              first["metadata"]["ownerReferences"][0]["uid"])  # fmt: skip
    assert expected == actual
    for obj in rendered[1:]:
        for pod in _pod_specs(obj):
            container = pod["containers"][0]
            wants = "claims" in container["resources"]
            assert marks.GPU_RESOURCE not in str(container["resources"])
            claims = [{"name": "gpus", "resourceClaimTemplateName": "demo-a1-gpus"}]
            assert (claims if wants else None) == pod.get("resourceClaims")


@pytest.mark.parametrize(
    ("checkpoint", "expected_seconds"),
    [
        pytest.param("", 45, id="without checkpoint.grace the controller's default counts"),
        pytest.param("checkpoint: {dir: /ckpt, grace: 2m}\n", 120,
                     id="checkpoint.grace is the run's own"),
    ],
)  # fmt: skip
def test_the_claim_request_is_kueue_countable_and_tolerates_our_evict_taint_for_the_grace(
    checkpoint: str, expected_seconds: int
) -> None:
    """One request, `exactly` NVIDIA's class with ExactCount and the run's GPU count, no
    selectors; tolerating taugrid.dev/gpu-evict NoExecute for the checkpoint grace."""
    spec = _spec(
        f"name: demo\nimage: repo/train{DIGEST}\ncommand: [python, t.py]\n"
        f"resources: {{gpus: 4}}\n{checkpoint}"
    )
    template = rendering.render_attempt(spec, _ctx(), DRA)[0]
    expected = [{"name": "gpus", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 4,
        "tolerations": [{"key": "taugrid.dev/gpu-evict", "operator": "Exists",
                         "effect": "NoExecute", "tolerationSeconds": expected_seconds}],
    }}]  # fmt: skip
    assert expected == template["spec"]["spec"]["devices"]["requests"]


def test_a_run_without_gpus_gets_no_claim_template_on_dra() -> None:
    """0 GPUs: no template, no claims (a CPU run must not wait for devices)."""
    spec = _spec(f"name: demo\nimage: repo/train{DIGEST}\ncommand: [python, t.py]\n")
    rendered = rendering.render_attempt(spec, _ctx(), DRA)
    assert [o["kind"] for o in rendered] == ["Job"]
    assert "resourceClaims" not in rendered[0]["spec"]["template"]["spec"]


# ---------------------------------------------------------------- GPU isolation (H3)
BASE = f"name: demo\nimage: registry.example/train{DIGEST}\ncommand: [python, t.py]\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(BASE + "resources: {gpus: 0}\n", {"main": "void"},
                     id="a job without GPUs sees none, whatever its image says"),
        pytest.param(BASE + "resources: {gpus: 2}\n", {"main": None},
                     id="a job with GPUs gets them from the device plugin alone"),
        pytest.param(BASE + "kind: pytorch\nworkers: 2\nresources: {gpus: 0}\n",
                     {"main": "void"}, id="a CPU-only pytorch run sees no GPU"),
        pytest.param(BASE + "kind: ray\nresources: {gpus: 1}\n",
                     {"ray-head": "void", "ray-worker": None},
                     id="a ray head asks for no GPU, so it sees none; its workers get theirs"),
        pytest.param(BASE + "kind: ray\nresources: {gpus: 0}\n",
                     {"ray-head": "void", "ray-worker": "void"},
                     id="a CPU-only ray run sees no GPU anywhere"),
    ],
)  # fmt: skip
def test_containers_without_gpus_are_rendered_with_no_visible_devices(
    text: str, expected: dict[str, str | None]
) -> None:
    """NVIDIA_VISIBLE_DEVICES=void on every container that requests no GPU (DESIGN.md
    section 10): CUDA images set it to `all`, which the toolkit would honour."""
    actual: dict[str, str | None] = {}
    for obj in _render(_spec(text)):
        for pod in _pod_specs(obj):
            for container in pod["containers"]:
                actual[container["name"]] = _env(container).get("NVIDIA_VISIBLE_DEVICES")
    assert expected == actual


def test_the_isolation_variable_comes_after_everything_the_run_sets() -> None:
    """Kubernetes lets the last of two same-named variables win; ours is last."""
    job = _render(_spec(BASE + "env: {CUDA_VISIBLE_DEVICES: '0'}\n"))[0]
    names = [item["name"] for item in job["spec"]["template"]["spec"]["containers"][0]["env"]]
    expected = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    assert expected == (names[-1], names[-2])


@pytest.mark.parametrize(
    ("kind", "field", "expected"),
    [
        pytest.param("Job", "spec.template.spec.containers[0].env[3].name", "env",
                     id="a Job's env is the spec's env"),
        pytest.param("Job", "spec.template.spec.containers[0].image", "image",
                     id="a Job's image is the spec's image"),
        pytest.param("Job", "spec.template.spec.imagePullSecrets[0].name", "imagePullSecrets",
                     id="pull secrets are the spec's"),
        pytest.param("Job", "spec.template.spec.containers[0].volumeMounts[1].mountPath",
                     "volumes", id="a mount is the spec's volumes"),
        pytest.param("RayJob", "metadata.labels", "labels", id="labels are the spec's labels"),
        pytest.param("RayJob", "spec.entrypoint", "command", id="the entrypoint is the command"),
        pytest.param("TauRun", "spec.resources.cpu", "resources.cpu",
                     id="a TauRun's spec field is the tau.yaml field"),
        pytest.param("Job", "spec.parallelism", "Job.spec.parallelism",
                     id="a field of ours keeps its object's path"),
        pytest.param("Job", "", "", id="a refusal naming no field names none"),
    ],
)  # fmt: skip
def test_an_api_server_refusal_names_the_tau_yaml_field(
    kind: str, field: str, expected: str
) -> None:
    """A 422 from the API server becomes a 422 naming what the researcher wrote."""
    assert expected == rendering.spec_field(kind, field)


@pytest.mark.parametrize("kind", ["job", "pytorch", "ray"])
def test_secret_env_renders_references_in_every_pod_never_a_value(kind: str) -> None:
    """Issue 30: each `secretEnv` variable is a `secretKeyRef` in every container of every
    pod the run has (the kubelet reads the value); `env` stays plain values beside it."""
    spec = _spec(
        f"name: demo\nkind: {kind}\nimage: r/x{DIGEST}\ncommand: [python, t.py]\nworkers: 2\n"
        "env: {LR: '0.1'}\nsecretEnv: {HF_TOKEN: {secret: hf, key: token}}\n"
    )
    pods = [p for obj in _render(spec) for p in _pod_specs(obj)]
    envs = [_env(c) for p in pods for c in p["containers"]]
    expected = [({"secretKeyRef": {"name": "hf", "key": "token"}}, "0.1")] * len(envs)
    assert expected == [(e["HF_TOKEN"], e["LR"]) for e in envs]
    assert pods
