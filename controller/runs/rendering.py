"""Render one attempt of a run as Kubernetes objects (plain dicts), from a validated spec.

Purely computational: no I/O, no clock, no logging; everything the objects depend on is an
argument, so the same inputs always give the same objects (and the same config hash). The
run reconciler creates what `render_attempt` returns, in the order returned.

Choices that hold for every kind (DESIGN.md sections 2, 3 and 7):

- **Created suspended** (`suspend: true`) with the `kueue.x-k8s.io/queue-name` label (and
  `kueue.x-k8s.io/priority-class` when the spec names one): Kueue's webhook would suspend it
  too, but creating it suspended means not even a webhook outage lets pods start before
  admission (anchors 2.7).
- **`backoffLimit: 0`**: the controller, not the Job controller, decides on a retry, after
  classifying the failure; a pod restarted by the Job controller would race the next
  attempt and bypass `retry.when`.
- **One object per attempt**, named `<run>-a<N>`, labelled `taugrid.dev/run` and
  `taugrid.dev/attempt`: attempts are fenced by name, and a stale pod is told apart by label.
- **Owner reference to the TauRun** (controller, blockOwnerDeletion): `kubectl delete tr`
  garbage-collects every attempt.
- **`taugrid.dev/config-hash`**: the spec hash, so evidence and resume can tell whether the
  config drifted between attempts.
- **`restartPolicy: Never`** and no tolerations or node selectors: Kueue injects the
  flavor's node selector and tolerations at admission; anything we set would fight it.
- **`terminationGracePeriodSeconds`** from settings: the window in which a workload saves a
  checkpoint on SIGTERM, before quarantine eviction or Kueue preemption kills it.
- **The per-run checkpoint ConfigMap is mounted as a directory**, not through `subPath`:
  the kubelet refreshes directory-mounted ConfigMaps, never `subPath` ones, and a Job that
  Kueue readmits keeps its original env, so the file is how it finds the newest checkpoint.
  When the controller has a CA, the same ConfigMap carries it as `ca.crt` (`TAU_CA_FILE`),
  so a pod trusts the controller's certificate without a Secret of its own.
- **The run's credential** is a projected ServiceAccount token of audience `taugrid-run`
  (`RenderSettings.run_token_audience`) at `TAU_TOKEN_FILE`, bound to the pod: no Secret, no
  token in any spec, nothing that outlives the pod. The controller maps it to the run and
  attempt through the pod it is bound to (`controller.runs.identity`).
- **Resources**: GPUs as limits (extended resources need requests == limits, and Kubernetes
  copies limits to requests); CPU as a request only (a CPU limit throttles training for no
  gain); memory as request and limit (a run cannot take its neighbours' memory).
- **`enableServiceLinks: false`**: a namespace with many Services would otherwise flood the
  environment with `*_SERVICE_HOST` variables.
- **GPUs on DRA** (`RenderSettings.dra`): a ResourceClaimTemplate per attempt, created first,
  from which each pod gets a claim of its own (never a named ResourceClaim, which Kueue 0.17
  cannot admit): one request `gpus`, `exactly` NVIDIA's DeviceClass with `allocationMode:
  ExactCount` and `count: resources.gpus` (no CEL selectors, constraints or config: Kueue
  counts only this form), tolerating our `taugrid.dev/gpu-evict` NoExecute taint for the
  run's checkpoint grace (`checkpoint.grace`, else the controller's default). The container
  names the claim instead of asking for `nvidia.com/gpu`.
- **`NVIDIA_VISIBLE_DEVICES=void` on every container that requests no GPU** (DESIGN.md section
  10): CUDA and PyTorch images carry `ENV NVIDIA_VISIBLE_DEVICES all`, and under the device
  plugin's `envvar` strategy the container toolkit would hand such a container every GPU of
  its node, outside Kueue's quota and quarantine's eviction. The pod's env beats the image's;
  a container with GPUs gets the variable from the device plugin, and tau.yaml may not set it.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from controller import marks
from controller.runs import networks, objects
from controller.runs import volumes as volumes_
from controller.settings import RunsSettings
from shared import spec as specs

CONTAINER_NAME = "main"
"""The user's container in job and pytorch pods (what `logs` streams)."""
RAY_HEAD_CONTAINER = "ray-head"
RAY_WORKER_CONTAINER = "ray-worker"
RAY_WORKER_GROUP = "workers"


GPU_VISIBILITY_ENV = "NVIDIA_VISIBLE_DEVICES"
NO_GPUS = "void"
"""The container toolkit's value for "no GPU at all" (not even the driver's files)."""


@dataclasses.dataclass(frozen=True)
class AttemptContext:
    """What differs between attempts of one run."""

    run: objects.RunRef
    attempt: int
    """1 for the first attempt."""
    checkpoint_configmap: str
    """Name of the per-run ConfigMap holding the latest checkpoint under `latest`."""
    resume_from: str = ""
    """Checkpoint path the attempt starts from (`TAU_RESUME_FROM`); empty on a fresh start."""
    failure_reason: str = ""
    """Failure class of the previous attempt (`TAU_FAILURE_REASON`); empty on attempt 1."""
    priority_class: str | None = None
    """WorkloadPriorityClass for this attempt instead of the spec's (a resumed attempt's
    place in line, `controller.runs.resume_priority_class`); None keeps the spec's."""


@dataclasses.dataclass(frozen=True)
class RenderSettings:
    """Controller-wide inputs to rendering (from the controller's settings)."""

    controller_url: str
    """URL pods use to reach the controller (`TAU_URL`), e.g. for checkpoint reports."""
    termination_grace_period_s: int = 60
    """SIGTERM-to-SIGKILL window: the time a workload has to write a checkpoint."""
    master_port: int = 29500
    """torchrun rendezvous port on worker 0 (PyTorch's default)."""
    job_ttl_after_finished_s: int | None = None
    """`ttlSecondsAfterFinished` for Jobs; None leaves finished Jobs to the reconciler."""
    ray_version: str | None = None
    """`rayClusterSpec.rayVersion`, when the cluster's KubeRay wants it."""
    ray_operator_namespace: str = ""
    """Namespace of the KubeRay operator, whose pods may reach a ray run's dashboard port
    (`networks.render_policy`); empty: only the run's own submitter may."""
    ray_token_auth: bool = False
    """Render `authOptions: {mode: token}` on RayJobs (KubeRay 1.5.1+, Ray 2.52+): the
    dashboard and its Jobs API then ask for the cluster's token, which KubeRay keeps."""
    ca_pem: str = ""
    """PEM bundle run pods trust for `controller_url` (read by the controller at startup):
    the per-run ConfigMap carries it as `ca.crt` and `TAU_CA_FILE` names the mounted file.
    Empty: no CA file, the pods' system store decides."""
    dra: bool = False
    """Ask for GPUs through DRA claims (a ResourceClaimTemplate per attempt) instead of the
    `nvidia.com/gpu` extended resource."""
    run_token_audience: str = "taugrid-run"  # noqa: S105  (an audience name, not a secret)
    """Audience of the projected token every run pod gets (`TAU_TOKEN_FILE`)."""
    run_token_expiration_s: int = 3600
    """The lifetime that token asks for; the kubelet rotates it at 80%."""
    dra_grace_s: int = 60
    """`tolerationSeconds` for `taugrid.dev/gpu-evict` when the run sets no
    `checkpoint.grace`."""

    @classmethod
    def from_section(
        cls, runs: RunsSettings, *, controller_url: str, ca_pem: str
    ) -> RenderSettings:
        """Rendering's inputs from the runs section; `controller_url` (this replica's URL) where
        the section names none, `ca_pem` as the controller read its CA file."""
        return cls(
            controller_url=runs.run_controller_url or controller_url,
            termination_grace_period_s=runs.run_termination_grace_s,
            ray_version=runs.ray_version, ca_pem=ca_pem,
            ray_operator_namespace=runs.ray_operator_namespace, ray_token_auth=runs.ray_token_auth,
            run_token_audience=runs.run_token_audience,
            run_token_expiration_s=runs.run_token_expiration_s, dra_grace_s=runs.run_device_grace_s,
        )  # fmt: skip


def render_attempt(
    spec: specs.TauSpec, ctx: AttemptContext, settings: RenderSettings
) -> list[dict[str, Any]]:
    """Return the objects of one attempt, in the order to create them.

    job: `[Job]`; pytorch: `[NetworkPolicy, Service, Job]` (the Service before the Job, so
    that DNS for worker 0 exists by the time any pod resolves it); ray:
    `[NetworkPolicy, RayJob]`. The policy comes first, so no pod of the attempt runs unfenced.
    """
    if ctx.attempt < 1:
        msg = f"attempt numbers start at 1, got {ctx.attempt}"
        raise ValueError(msg)
    fence = [_render_network_policy(spec, ctx, settings)] if networks.fenced(spec) else []
    claims = [_render_claim_template(spec, ctx, settings)] if _uses_claims(spec, settings) else []
    if spec.kind == specs.RunKind.PYTORCH:
        return [*claims, *fence, _render_headless_service(spec, ctx, settings),
                _render_job(spec, ctx, settings)]  # fmt: skip
    if spec.kind == specs.RunKind.RAY:
        return [*claims, *fence, _render_rayjob(spec, ctx, settings)]
    return [*claims, _render_job(spec, ctx, settings)]


CLAIM_NAME = "gpus"
"""The pod's claim and the template's request: both are called `gpus`."""


def _uses_claims(spec: specs.TauSpec, settings: RenderSettings) -> bool:
    return settings.dra and spec.resources.gpus > 0


def grace_s(spec: specs.TauSpec, settings: RenderSettings) -> int:
    """The run's checkpoint grace on DRA: `checkpoint.grace`, else the controller's."""
    own = spec.checkpoint.grace_s if spec.checkpoint is not None else None
    return settings.dra_grace_s if own is None else own


def _render_claim_template(
    spec: specs.TauSpec, ctx: AttemptContext, settings: RenderSettings
) -> dict[str, Any]:
    """The ResourceClaimTemplate every pod of the attempt gets its GPUs from (see the
    module docstring)."""
    name = objects.claim_template_name(ctx.run.name, ctx.attempt)
    exactly = {
        "deviceClassName": marks.DRA_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": spec.resources.gpus,
        "tolerations": [
            {"key": marks.DEVICE_EVICT_KEY, "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": grace_s(spec, settings)}
        ],
    }  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": _metadata(spec, ctx, name, _run_labels(spec, ctx)),
        "spec": {
            "metadata": {"labels": _run_labels(spec, ctx)},
            "spec": {"devices": {"requests": [{"name": CLAIM_NAME, "exactly": exactly}]}},
        },
    }


def _render_network_policy(
    spec: specs.TauSpec, ctx: AttemptContext, settings: RenderSettings
) -> dict[str, Any]:
    name = objects.attempt_name(ctx.run.name, ctx.attempt)
    return networks.render_policy(
        spec, ctx.run, ctx.attempt, _metadata(spec, ctx, name, _run_labels(spec, ctx)),
        ray_operator_namespace=settings.ray_operator_namespace,
    )  # fmt: skip


# ---------------------------------------------------------------- pieces


def _run_labels(spec: specs.TauSpec, ctx: AttemptContext) -> dict[str, str]:
    """Labels on every object and pod of the attempt; ours win over the user's (validated
    not to collide, since our prefixes are reserved)."""
    return {**spec.labels, marks.RUN_LABEL: ctx.run.name, marks.ATTEMPT_LABEL: str(ctx.attempt)}


def _workload_labels(spec: specs.TauSpec, ctx: AttemptContext) -> dict[str, str]:
    """Labels of the object Kueue manages: the run labels plus queue and priority."""
    labels = {**_run_labels(spec, ctx), marks.QUEUE_NAME_LABEL: spec.queue}
    priority = ctx.priority_class or spec.priority
    if priority is not None:
        labels[marks.PRIORITY_CLASS_LABEL] = priority
    return labels


def _metadata(
    spec: specs.TauSpec, ctx: AttemptContext, name: str, labels: dict[str, str]
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": ctx.run.namespace,
        "labels": labels,
        "annotations": {marks.CONFIG_HASH_ANNOTATION: specs.spec_hash(spec)},
        "ownerReferences": [objects.owner_reference(ctx.run)],
    }


def _tau_env(
    spec: specs.TauSpec, ctx: AttemptContext, settings: RenderSettings
) -> list[dict[str, Any]]:
    """The TAU_* env of DESIGN.md section 7, in a fixed order."""
    env: list[dict[str, Any]] = [
        {"name": "TAU_RUN", "value": ctx.run.name},
        {"name": "TAU_NAMESPACE", "value": ctx.run.namespace},
        {"name": "TAU_ATTEMPT", "value": str(ctx.attempt)},
        {"name": "TAU_WORKERS", "value": str(spec.workers)},
        {"name": "TAU_URL", "value": settings.controller_url},
        {"name": "TAU_TOKEN_FILE", "value": volumes_.RUN_TOKEN_FILE},
    ]
    if spec.checkpoint is not None:
        env.append({"name": "TAU_CHECKPOINT_DIR", "value": spec.checkpoint.dir})
    env += [
        {"name": "TAU_CHECKPOINT_FILE", "value": volumes_.CHECKPOINT_FILE},
        {"name": "TAU_RESUME_FROM", "value": ctx.resume_from},
        {"name": "TAU_FAILURE_REASON", "value": ctx.failure_reason},
    ]
    if settings.ca_pem:
        env.append({"name": "TAU_CA_FILE", "value": volumes_.CA_FILE})
    return env


def _rendezvous_env(
    spec: specs.TauSpec, job_name: str, service_name: str, settings: RenderSettings
) -> list[dict[str, Any]]:
    """torchrun's settings as env: torchrun reads `PET_<OPTION>` for every option not on its
    command line, so `command: [torchrun, train.py]` needs no flags. The unprefixed names
    serve scripts that launch their own processes.

    Worker 0 is the master: an Indexed Job's pod has the hostname `<job>-<index>`, and with
    `subdomain` equal to the headless Service's name it resolves as `<job>-0.<service>`.
    The node rank is the completion index, read from the pod's annotation.
    """
    master = f"{job_name}-0.{service_name}"
    port = str(settings.master_port)
    nnodes = str(spec.workers)
    nproc = str(spec.effective_nproc_per_node)
    index = f"metadata.annotations['{marks.JOB_COMPLETION_INDEX_ANNOTATION}']"
    env: list[dict[str, Any]] = []
    for prefix in ("", "PET_"):
        env += [
            {"name": f"{prefix}MASTER_ADDR", "value": master},
            {"name": f"{prefix}MASTER_PORT", "value": port},
            {"name": f"{prefix}NNODES", "value": nnodes},
            {"name": f"{prefix}NPROC_PER_NODE", "value": nproc},
            {"name": f"{prefix}NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": index}}},
        ]
    return env


def _user_env(spec: specs.TauSpec) -> list[dict[str, Any]]:
    """`env` as values, then `secretEnv` as references the kubelet resolves when it starts
    the pod: a Secret's value is never in anything the controller writes (the chart's
    admission policy lets a pod refer only to the Secrets the namespace lists for runs)."""
    plain = [{"name": key, "value": value} for key, value in spec.env.items()]
    secret = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}}
        for key, ref in spec.secret_env.items()
    ]
    return plain + secret


def _isolation_env(gpus: int) -> list[dict[str, Any]]:
    """`NVIDIA_VISIBLE_DEVICES=void` for a container that requests no GPU (module docstring);
    a container with GPUs, from the device plugin or a DRA claim, gets none of ours."""
    return [] if gpus > 0 else [{"name": GPU_VISIBILITY_ENV, "value": NO_GPUS}]


def _resources(spec: specs.TauSpec, settings: RenderSettings, gpus: int) -> dict[str, Any]:
    """A container's resources (see the module docstring); its `gpus` as the attempt's
    claim on DRA."""
    res = spec.resources
    requests = {k: v for k, v in (("cpu", res.cpu), ("memory", res.memory)) if v is not None}
    limits = {"memory": res.memory} if res.memory is not None else {}
    result: dict[str, Any] = {}
    if gpus > 0 and _uses_claims(spec, settings):
        result["claims"] = [{"name": CLAIM_NAME}]
    elif gpus > 0:
        requests[marks.GPU_RESOURCE] = limits[marks.GPU_RESOURCE] = str(gpus)
    if requests:
        result["requests"] = requests
    if limits:
        result["limits"] = limits
    return result


def _container_command(spec: specs.TauSpec) -> tuple[list[str], list[str]]:
    """Return (command, args): exec form as given; a string under `/bin/sh -c`."""
    argv = spec.argv
    if isinstance(spec.command, str):
        return argv[:3], argv[3:]
    return list(spec.command), list(spec.args)


def _pod_spec(
    spec: specs.TauSpec,
    ctx: AttemptContext,
    settings: RenderSettings,
    container: dict[str, Any],
    *,
    gpus: int = 0,
) -> dict[str, Any]:
    volumes, mounts = volumes_.volumes_and_mounts(
        spec, configmap=ctx.checkpoint_configmap, with_ca=bool(settings.ca_pem),
        token_audience=settings.run_token_audience,
        token_expiration_s=settings.run_token_expiration_s,
    )  # fmt: skip
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": settings.termination_grace_period_s,
        "enableServiceLinks": False,
        # A run needs no Kubernetes credential (its projected taugrid-run token reaches our
        # API), and the chart's ValidatingAdmissionPolicy refuses a pod template that would
        # mount one.
        "automountServiceAccountToken": False,
        "containers": [{**container, "volumeMounts": mounts}],
        "volumes": volumes,
    }
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    if gpus > 0 and _uses_claims(spec, settings):
        template = objects.claim_template_name(ctx.run.name, ctx.attempt)
        pod["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimTemplateName": template}]
    return pod


# ---------------------------------------------------------------- kinds


def _render_job(
    spec: specs.TauSpec, ctx: AttemptContext, settings: RenderSettings
) -> dict[str, Any]:
    """A batch/v1 Job: `workers` pods in parallel (Indexed for pytorch).

    A multi-worker `job` is NonIndexed with parallelism = completions = workers: Kueue
    admits the pods as one pod set, and the Job succeeds when every worker has.
    """
    name = objects.attempt_name(ctx.run.name, ctx.attempt)
    command, args = _container_command(spec)
    env = _tau_env(spec, ctx, settings)
    pytorch = spec.kind == specs.RunKind.PYTORCH
    if pytorch:
        env += _rendezvous_env(spec, name, name, settings)
    env += _user_env(spec) + _isolation_env(spec.resources.gpus)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "command": command,
        "env": env,
        "resources": _resources(spec, settings, spec.resources.gpus),
    }
    if args:
        container["args"] = args
    pod = _pod_spec(spec, ctx, settings, container, gpus=spec.resources.gpus)
    if pytorch:
        pod["subdomain"] = name
    job_spec: dict[str, Any] = {
        "suspend": True,
        "backoffLimit": 0,
        "parallelism": spec.workers,
        "completions": spec.workers,
        "completionMode": "Indexed" if pytorch else "NonIndexed",
        "template": {"metadata": {"labels": _run_labels(spec, ctx)}, "spec": pod},
    }
    if settings.job_ttl_after_finished_s is not None:
        job_spec["ttlSecondsAfterFinished"] = settings.job_ttl_after_finished_s
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(spec, ctx, name, _workload_labels(spec, ctx)),
        "spec": job_spec,
    }


def _render_headless_service(
    spec: specs.TauSpec, ctx: AttemptContext, settings: RenderSettings
) -> dict[str, Any]:
    """The headless Service that gives each pytorch worker a DNS name.

    `clusterIP: None` makes per-pod records; `publishNotReadyAddresses` publishes them
    before readiness, because rendezvous happens before any pod could be called ready.
    The selector is the attempt's labels, so a stale attempt's pods never answer.
    """
    name = objects.attempt_name(ctx.run.name, ctx.attempt)
    port = settings.master_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, ctx, name, _run_labels(spec, ctx)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {marks.RUN_LABEL: ctx.run.name, marks.ATTEMPT_LABEL: str(ctx.attempt)},
            "ports": [{"name": "rendezvous", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def ray_entrypoint(spec: specs.TauSpec) -> str:
    """Return the RayJob entrypoint: Ray runs it through a shell on the head.

    Exec form is quoted word by word; a shell string is kept as written, with `args`
    appended quoted.
    """
    if isinstance(spec.command, str):
        return " ".join([spec.command, *(shlex.quote(arg) for arg in spec.args)])
    return shlex.join([*spec.command, *spec.args])


def _render_rayjob(
    spec: specs.TauSpec, ctx: AttemptContext, settings: RenderSettings
) -> dict[str, Any]:
    """A ray.io/v1 RayJob: a head plus one worker group of `workers` pods.

    - `shutdownAfterJobFinishes: true`: Kueue requires it, and the quota is freed when
      the job ends.
    - `submissionMode: K8sJobMode`: a submitter Job runs `ray job submit` (KubeRay's default,
      written out so a changed default cannot surprise us).
    - `enableInTreeAutoscaling: false` and min = max = replicas: Kueue admits a fixed size.
    - `backoffLimit: 0`: each KubeRay retry would build a new RayCluster outside our
      attempt fencing; the controller retries instead.
    - Containers carry no command: KubeRay generates `ray start`; the user's command is the
      entrypoint. The head gets the CPU and memory of a worker but no GPUs.
    """
    name = objects.attempt_name(ctx.run.name, ctx.attempt)
    env = _tau_env(spec, ctx, settings) + _user_env(spec)
    pod_labels = _run_labels(spec, ctx)

    def template(container_name: str, gpus: int) -> dict[str, Any]:
        container = {
            "name": container_name,
            "image": spec.image,
            "env": env + _isolation_env(gpus),
            "resources": _resources(spec, settings, gpus),
        }
        return {
            "metadata": {"labels": pod_labels},
            "spec": _pod_spec(spec, ctx, settings, container, gpus=gpus),
        }

    cluster: dict[str, Any] = {
        "enableInTreeAutoscaling": False,
        "headGroupSpec": {
            # The submitter Job reaches the dashboard over the pod network.
            "rayStartParams": {"dashboard-host": "0.0.0.0"},  # noqa: S104
            "template": template(RAY_HEAD_CONTAINER, 0),
        },
        "workerGroupSpecs": [
            {
                "groupName": RAY_WORKER_GROUP,
                "replicas": spec.workers,
                "minReplicas": spec.workers,
                "maxReplicas": spec.workers,
                "rayStartParams": {},
                "template": template(RAY_WORKER_CONTAINER, spec.resources.gpus),
            }
        ],
    }
    if settings.ray_version is not None:
        cluster["rayVersion"] = settings.ray_version
    if settings.ray_token_auth:
        cluster["authOptions"] = {"mode": "token"}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _metadata(spec, ctx, name, _workload_labels(spec, ctx)),
        "spec": {
            "suspend": True,
            "backoffLimit": 0,
            "shutdownAfterJobFinishes": True,
            "submissionMode": "K8sJobMode",
            "entrypoint": ray_entrypoint(spec),
            "rayClusterSpec": cluster,
        },
    }


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a rendered attempt object (a Job's one, a RayJob's head's and
    workers'), so settings can add to every pod."""
    if obj["kind"] == "Job":
        return [obj["spec"]["template"]]
    if obj["kind"] == "RayJob":
        cluster = obj["spec"]["rayClusterSpec"]
        return [cluster["headGroupSpec"]["template"]] + [
            group["template"] for group in cluster["workerGroupSpecs"]
        ]
    return []


# ---------------------------------------------------------------- refusals

_SPEC_FIELDS = (
    ("imagePullSecrets", "imagePullSecrets"),
    ("volumeMounts", "volumes"),
    ("volumes", "volumes"),
    (".env", "env"),
    (".image", "image"),
    (".resources", "resources"),
    (".command", "command"),
    (".args", "args"),
    ("entrypoint", "command"),
    ("labels", "labels"),
    ("metadata.name", "name"),
    ("metadata.namespace", "namespace"),
)
"""Where the fields of a rendered object come from in tau.yaml (first match wins)."""


def spec_field(kind: str, field: str) -> str:
    """The tau.yaml field behind a field of an object rendered from it, as the API server
    names it in a refusal (`spec.template.spec.containers[0].env[3].name` → `env`); a field
    of the TauRun's spec is its own (`spec.resources.cpu` → `resources.cpu`); others keep
    their object's path, prefixed with its kind; "" when the API server named none (an
    admission policy's refusal)."""
    if not field:
        return ""
    if kind == "TauRun" and field.startswith("spec."):
        return field.removeprefix("spec.")
    for fragment, spec_name in _SPEC_FIELDS:
        if fragment in field:
            return spec_name
    return f"{kind}.{field}"
