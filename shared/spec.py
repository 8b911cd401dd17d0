"""`tau.yaml`: the run spec a researcher writes, its validation and its JSON Schema.

DESIGN.md section 3. The models are frozen, refuse unknown fields and speak camelCase on
the wire (snake_case in Python). `parse_spec` is the one entry for request bodies (YAML 1.2
core or JSON); `validate_spec` for data that is already parsed (a TauRun's `spec` read back
from the API server). Every problem becomes a `SpecError` listing `{field, message}` pairs,
where `field` is a path such as `retry.when[0]` and the message says what is allowed.

Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
import typing
from typing import Annotated, Any, Literal

import pydantic
from pydantic import alias_generators

from shared import jsonsafe, patterns, yamlsafe

API_VERSION = "taugrid.dev/v1alpha1"
"""The only schema version this build speaks; `apiVersion` in tau.yaml may pin it."""

MAX_SPEC_BYTES = 1024 * 1024
"""Largest accepted tau.yaml body (1 MiB, DESIGN.md section 4); a spec is a few hundred bytes."""

MAX_NAME_LENGTH = 40
"""So that `<name>-a<N>-<index>` (attempt object, pod hostname) fits Kubernetes' 63."""

MAX_WORKERS = 1000
"""Upper bound on pods per run; far beyond any real cluster queue, it catches typos (10000)."""

MAX_GPUS_PER_WORKER = 64
MAX_ATTEMPTS = 100
MAX_ENV_VALUE_BYTES = 64 * 1024
MAX_ENV_TOTAL_BYTES = 128 * 1024
"""Env limits: a Pod's whole spec must stay well below etcd's 1.5 MiB object limit."""

DEFAULT_SHM_SIZE = "16Gi"
DEFAULT_QUEUE = "default"

CHECKPOINT_MOUNT_DIR = "/var/run/taugrid/checkpoint"
"""Where the per-run checkpoint ConfigMap is mounted in every pod (shared with rendering)."""

SHM_MOUNT_PATH = "/dev/shm"  # noqa: S108 - the container's shared-memory mount, not a temp file

RENDEZVOUS_ENV_NAMES = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "NODE_RANK",
        "NNODES",
        "NPROC_PER_NODE",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "PET_NODE_RANK",
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
    }
)
"""Env that `kind: pytorch` sets for torchrun; a user value would silently break rendezvous."""

RESERVED_LABEL_DOMAINS = (
    "taugrid.dev",
    "kubernetes.io",
    "k8s.io",
    "x-k8s.io",
    "ray.io",
    "istio.io",
)
"""Label prefixes other controllers (and we) act on, refused with their subdomains: Kubernetes
(`*.kubernetes.io`, `*.k8s.io`), SIG projects such as Kueue and JobSet (`*.x-k8s.io`),
KubeRay (`ray.io/*`), Istio (`sidecar.istio.io/inject` opts a pod out of the mesh) and ours
(DESIGN.md section 10)."""

RESERVED_LABEL_NAMES = frozenset({"controller-uid", "job-name", "pod-template-hash"})
"""Unprefixed label keys the Job and ReplicaSet controllers select their pods by: a run pod
carrying one could be adopted, or counted, by another namespace object's controller."""

RESERVED_ENV_NAMES = frozenset(
    {
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "NVIDIA_IMEX_CHANNELS",
    }
)
"""Env the NVIDIA container toolkit reads to decide which GPUs (and driver capabilities, MIG
devices, IMEX channels) a container gets. Under the device plugin's default `envvar` strategy
a pod setting `NVIDIA_VISIBLE_DEVICES=all` sees every GPU of its node, outside its quota and
outside quarantine's reach (security review H3); only the device plugin may set them.
`CUDA_VISIBLE_DEVICES` stays allowed: it narrows what a process uses and grants nothing."""

RESERVED_PRIORITY_CLASSES = frozenset({"taugrid-resume"})
"""WorkloadPriorityClasses that only the controller assigns (the boost of a resumed attempt,
`controller.marks.RESUME_PRIORITY_CLASS`); a spec naming one would jump the queue."""

SERVICE_ACCOUNT_DIRS = ("/var/run/secrets", "/run/secrets")
"""Where the kubelet mounts ServiceAccount tokens (and `/var/run` is `/run` in most images)."""

RESERVED_MOUNT_PATHS = (
    SHM_MOUNT_PATH,
    CHECKPOINT_MOUNT_DIR,
    CHECKPOINT_MOUNT_DIR.removeprefix("/var"),
    *SERVICE_ACCOUNT_DIRS,
)
"""No volume may be mounted at or under these: /dev/shm and the checkpoint file are ours, and
a volume over a token directory would replace the credential the pod's programs read."""

MAX_QUANTITY_CHARS = 64
MAX_QUANTITY_VALUE = float(2**63)
"""Quantities beyond int64 base units (cores, bytes) are refused: the API server cannot hold
them, and none is a real request."""

_DNS1035 = r"[a-z]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_DNS1035_RE = patterns.compile_full(_DNS1035)
_DNS1123_LABEL_RE = patterns.compile_full(_DNS1123_LABEL)
_DNS1123_SUBDOMAIN_RE = patterns.compile_full(_DNS1123_SUBDOMAIN)
_ENV_NAME_RE = patterns.compile_full(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRET_KEY_RE = patterns.compile_full(r"[-._a-zA-Z0-9]+")
"""A key of a Secret's data (Kubernetes' IsConfigMapKey)."""
MAX_SECRET_ENV = 64
_LABEL_NAME_RE = patterns.compile_full(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_LABEL_VALUE_RE = patterns.compile_full(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_QUANTITY_RE = patterns.compile_full(
    r"([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?"
)
_DURATION_RE = patterns.compile_full(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_IMAGE_RE = patterns.compile_full(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
_DIGEST_RE = re.compile(r"@sha256:[0-9a-f]{64}\Z")

_QUANTITY_SUFFIX = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}

MAX_DURATION_S = 366 * 24 * 3600
MAX_DURATION_CHARS = 32
MAX_PATH_CHARS = 1024
MAX_PLAIN_INT = 10**jsonsafe.MAX_INT_DIGITS - 1
"""Largest whole number taken as text in `command`, `args` and `env`; quote a longer one."""


class RunKind(enum.StrEnum):
    """The run type (not a Kubernetes kind). Lower case because researchers type it."""

    JOB = "job"
    PYTORCH = "pytorch"
    RAY = "ray"


class FailureClass(enum.StrEnum):
    """Why an attempt ended badly (DESIGN.md section 7); PascalCase like condition reasons."""

    NODE_FAILURE = "NodeFailure"
    EVICTED = "Evicted"
    OOM_KILLED = "OOMKilled"
    APP_ERROR = "AppError"
    TIMEOUT = "Timeout"
    UNKNOWN = "Unknown"


RETRYABLE_CLASSES: tuple[FailureClass, ...] = (
    FailureClass.NODE_FAILURE,
    FailureClass.EVICTED,
    FailureClass.OOM_KILLED,
    FailureClass.APP_ERROR,
    FailureClass.TIMEOUT,
)
"""What `retry.when` may list; `Unknown` is never retried (we cannot tell it would help)."""

RetryClass = Literal["NodeFailure", "Evicted", "OOMKilled", "AppError", "Timeout"]


# ---------------------------------------------------------------- scalar validators


def parse_duration(text: str) -> int:
    """Return the seconds in `90s`, `30m`, `2h`, `1h30m`, `2d`; raise ValueError otherwise."""
    match = _DURATION_RE.fullmatch(text) if len(text) <= MAX_DURATION_CHARS else None
    if not text or match is None:
        msg = (
            f"{_short(text)} is not a duration; write a number with a unit: 90s, 30m, 2h, 1h30m, 2d"
        )
        raise ValueError(msg)
    days, hours, minutes, seconds = (int(part) if part else 0 for part in match.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total > MAX_DURATION_S:
        msg = f"{text!r} is longer than a year"
        raise ValueError(msg)
    return total


def parse_quantity(text: str) -> float:
    """Return the value of a Kubernetes quantity (`500m`, `4`, `16Gi`) as a float."""
    match = _QUANTITY_RE.fullmatch(text) if len(text) <= MAX_QUANTITY_CHARS else None
    if match is None:
        msg = (
            f"{_short(text)} is not a Kubernetes quantity; write a number with an optional unit:"
            " 500m, 4, 1.5, 512Mi, 16Gi, 1Ti"
        )
        raise ValueError(msg)
    value = float(match.group(1)) * _QUANTITY_SUFFIX[match.group(3) or ""]
    if value > MAX_QUANTITY_VALUE:
        msg = f"{text!r} is too large: a quantity is at most 8Ei (2^63 in base units)"
        raise ValueError(msg)
    return value


def _check_duration(value: object) -> object:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        msg = f"{_short(value)} has no unit; write it as a string with one: 90s, 30m, 2h, 1h30m"
        raise ValueError(msg)
    if isinstance(value, str):
        parse_duration(value)
    return value


def _check_quantity(value: object) -> object:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        if not math.isfinite(value) or abs(value) > MAX_QUANTITY_VALUE:
            msg = f"{_short(value)} is not a quantity: a quantity is at most 8Ei"
            raise ValueError(msg)
        value = format(value, "g")
    if isinstance(value, str) and parse_quantity(value) <= 0:
        msg = f"{value!r} must be more than zero"
        raise ValueError(msg)
    return value


def _coerce_plain_text(value: object) -> object:
    """Accept integers and booleans where a string is meant (`args: [--epochs, 10]`).

    A float is refused: YAML would read `0.10` as 0.1 and lose the spelling the program
    expects, so the message asks for quotes instead of guessing. So is an integer longer than
    `MAX_INT_DIGITS`: quoted, it is text of any length.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if abs(value) > MAX_PLAIN_INT:
            msg = (
                f"a number of more than {jsonsafe.MAX_INT_DIGITS} digits; quote it so it is"
                " passed as text"
            )
            raise ValueError(msg)
        return str(value)
    if isinstance(value, float):
        msg = f"{value!r} is a number; quote it ('{value}') so it is passed exactly as written"
        raise ValueError(msg)
    return value


def _check_name(value: str) -> str:
    if len(value) > MAX_NAME_LENGTH or not _DNS1035_RE.fullmatch(value):
        msg = (
            f"{_short(value)} is not a valid run name: use at most {MAX_NAME_LENGTH} lower-case"
            " letters, digits and '-', starting with a letter and ending with a letter or digit"
        )
        raise ValueError(msg)
    return value


def _check_dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS1123_LABEL_RE.fullmatch(value):
        msg = (
            f"{_short(value)} is not a valid name: use at most 63 lower-case letters, digits"
            " and '-', starting and ending with a letter or digit"
        )
        raise ValueError(msg)
    return value


def _check_dns_subdomain(value: str) -> str:
    if len(value) > 253 or not _DNS1123_SUBDOMAIN_RE.fullmatch(value):
        msg = (
            f"{_short(value)} is not a valid Kubernetes object name: use at most 253 lower-case"
            " letters, digits, '-' and '.', starting and ending with a letter or digit"
        )
        raise ValueError(msg)
    return value


def _check_priority(value: str) -> str:
    _check_dns_label(value)
    if value in RESERVED_PRIORITY_CLASSES:
        msg = f"{value!r} is the controller's own priority class (resumed attempts); choose another"
        raise ValueError(msg)
    return value


def _check_abs_path(value: str) -> str:
    if (
        not value.startswith("/")
        or len(value) > MAX_PATH_CHARS
        or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value)
    ):
        msg = (
            f"{_short(value)} must be an absolute path such as /data or /checkpoints/run, of at"
            f" most {MAX_PATH_CHARS} characters and without control characters"
        )
        raise ValueError(msg)
    if any(part == ".." for part in value.split("/")):
        msg = f"{value!r} must not contain '..'"
        raise ValueError(msg)
    return value


def _check_image(value: str) -> str:
    if len(value) > 1024 or not _IMAGE_RE.fullmatch(value):
        msg = (
            f"{_short(value)} is not an image reference; write registry/repository:tag or,"
            " better, registry/repository@sha256:<digest>"
        )
        raise ValueError(msg)
    return value


def _string_schema(pattern: re.Pattern[str], max_length: int) -> dict[str, Any]:
    """The JSON Schema of a name checked by `pattern` in full (DESIGN.md section 10)."""
    return {"type": "string", "pattern": patterns.schema(pattern), "maxLength": max_length}


Duration = Annotated[
    str,
    pydantic.BeforeValidator(_check_duration),
    pydantic.Field(
        json_schema_extra={
            "pattern": patterns.schema(_DURATION_RE),
            "maxLength": MAX_DURATION_CHARS,
            "examples": ["90s", "30m", "1h30m"],
        }
    ),
]
Quantity = Annotated[
    str,
    pydantic.BeforeValidator(_check_quantity),
    pydantic.WithJsonSchema(
        {
            "anyOf": [
                {
                    "type": "string",
                    "pattern": patterns.schema(_QUANTITY_RE),
                    "maxLength": MAX_QUANTITY_CHARS,
                },
                {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_QUANTITY_VALUE},
            ]
        }
    ),
]
PlainText = Annotated[
    str,
    pydantic.BeforeValidator(_coerce_plain_text),
    pydantic.StringConstraints(max_length=MAX_ENV_VALUE_BYTES),
    pydantic.WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "maxLength": MAX_ENV_VALUE_BYTES},
                {"type": "integer", "minimum": -MAX_PLAIN_INT, "maximum": MAX_PLAIN_INT},
                {"type": "boolean"},
            ]
        }
    ),
]
DnsLabel = Annotated[
    str,
    pydantic.AfterValidator(_check_dns_label),
    pydantic.Field(json_schema_extra=_string_schema(_DNS1123_LABEL_RE, 63)),
]
ObjectName = Annotated[
    str,
    pydantic.AfterValidator(_check_dns_subdomain),
    pydantic.Field(json_schema_extra=_string_schema(_DNS1123_SUBDOMAIN_RE, 253)),
]
RunName = Annotated[
    str,
    pydantic.AfterValidator(_check_name),
    pydantic.Field(json_schema_extra=_string_schema(_DNS1035_RE, MAX_NAME_LENGTH)),
]
PriorityClass = Annotated[
    str,
    pydantic.AfterValidator(_check_priority),
    pydantic.Field(
        json_schema_extra={
            **_string_schema(_DNS1123_LABEL_RE, 63),
            "not": {"enum": sorted(RESERVED_PRIORITY_CLASSES)},
        }
    ),
]
Image = Annotated[
    str,
    pydantic.AfterValidator(_check_image),
    pydantic.Field(json_schema_extra=_string_schema(_IMAGE_RE, 1024)),
]
AbsPath = Annotated[
    str,
    pydantic.AfterValidator(_check_abs_path),
    pydantic.Field(
        json_schema_extra={
            "type": "string",
            "pattern": patterns.schema(r"/[^\x00-\x1f\x7f]*"),
            "maxLength": MAX_PATH_CHARS,
        }
    ),
]
ShortText = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=256)]
StrictInt = Annotated[int, pydantic.Strict()]
StrictBool = Annotated[bool, pydantic.Strict()]


class SpecModel(pydantic.BaseModel):
    """Frozen, unknown fields refused, camelCase on the wire, docstrings as descriptions."""

    model_config = pydantic.ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=alias_generators.to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )


class Resources(SpecModel):
    """What each worker (pod) asks for; Kueue counts it against the queue's quota."""

    gpus: Annotated[StrictInt, pydantic.Field(ge=0, le=MAX_GPUS_PER_WORKER)] = 0
    """GPUs per worker (`nvidia.com/gpu`). 0 runs on CPU only; ask explicitly for GPUs so a
    typo never takes a GPU node."""
    cpu: Quantity | None = None
    """CPU cores per worker as a Kubernetes quantity (`4`, `500m`); a request, never a limit,
    so the job is not throttled."""
    memory: Quantity | None = None
    """Memory per worker (`64Gi`); request and limit both, so one job cannot starve a node."""


class Volume(SpecModel):
    """A PersistentVolumeClaim in the run's namespace, mounted into every worker."""

    claim: ObjectName
    """Name of the PersistentVolumeClaim."""
    mount_path: AbsPath
    """Where it appears inside the container (`/data`)."""
    read_only: StrictBool = False
    """Mount read-only; datasets should be."""


class Checkpoint(SpecModel):
    """Where the run writes checkpoints; exported to it as `TAU_CHECKPOINT_DIR`."""

    dir: AbsPath
    """Directory for checkpoints, inside the container."""
    volume: ObjectName | None = None
    """PersistentVolumeClaim holding `dir`, so checkpoints outlive a pod. If it is not also
    listed in `volumes`, it is mounted at `dir`. Multi-worker runs need a ReadWriteMany
    claim, or only rank 0 may write."""
    grace: Duration | None = None
    """How long the run may keep its GPUs after one of them is fenced for a fault that
    leaves work running (on DRA clusters: the `tolerationSeconds` of its claims), to reach
    its next checkpoint; default: the controller's `runDeviceGraceS`."""

    @property
    def grace_s(self) -> int | None:
        """The grace in seconds, None for the controller's default."""
        return None if self.grace is None else parse_duration(self.grace)


class Retry(SpecModel):
    """When the controller starts a new attempt by itself, from the latest checkpoint."""

    max_attempts: Annotated[StrictInt, pydantic.Field(ge=1, le=MAX_ATTEMPTS)] = 3
    """Attempts in all, the first included (1 = never retry)."""
    when: Annotated[list[RetryClass], pydantic.Field(max_length=5)] = ["NodeFailure"]
    """Failure classes to retry: NodeFailure, Evicted, OOMKilled, AppError, Timeout.
    Unknown is never retried. Kueue preemption is not a failure and needs no entry."""
    backoff: Duration = "0s"
    """Wait before the next attempt, doubled for each retry already made (at most an hour).
    0s by default: a node failure is not the run's fault, and resuming at once is the point;
    set one when retrying AppError."""

    @pydantic.field_validator("when", mode="before")
    @classmethod
    def _no_unknown(cls, value: object) -> object:
        if isinstance(value, list) and "Unknown" in value:
            msg = "Unknown is never retried; allowed: " + ", ".join(RETRYABLE_CLASSES)
            raise ValueError(msg)
        return value

    @pydantic.field_validator("when")
    @classmethod
    def _unique(cls, value: list[RetryClass]) -> list[RetryClass]:
        if len(set(value)) != len(value):
            msg = "each failure class may appear once"
            raise ValueError(msg)
        return value

    @property
    def backoff_s(self) -> int:
        """The backoff in seconds."""
        return parse_duration(self.backoff)


def _check_secret_key(value: str) -> str:
    if len(value) > 253 or not _SECRET_KEY_RE.fullmatch(value):
        msg = f"{_short(value)} is not a Secret key: use letters, digits, '-', '_' and '.'"
        raise ValueError(msg)
    return value


SecretKeyName = Annotated[
    str,
    pydantic.AfterValidator(_check_secret_key),
    pydantic.Field(json_schema_extra=_string_schema(_SECRET_KEY_RE, 253)),
]


class SecretRef(SpecModel):
    """One key of a Secret in the run's namespace, given to every worker as a variable.

    Only the names travel: the TauRun, its evidence and the API hold `secret` and `key`,
    never the value, which the kubelet reads when it starts the pod."""

    secret: ObjectName
    """Name of the Secret in the run's namespace. You must be allowed to `get` it, and the
    platform team must list it in the namespace's `taugrid.dev/run-secrets` annotation."""
    key: SecretKeyName
    """The key in the Secret's data."""


class Experiment(SpecModel):
    """Free-form tracking metadata, copied into the run's evidence."""

    project: ShortText | None = None
    """Project the run belongs to."""
    name: ShortText | None = None
    """Experiment name; several runs may share one."""
    tags: Annotated[list[ShortText], pydantic.Field(max_length=32)] = []
    """Free-form tags."""


class TauSpec(SpecModel):
    """One run: what to execute, on how many workers, with which resources and policy."""

    api_version: Literal["taugrid.dev/v1alpha1"] | None = None
    """Optional schema pin; the only version is taugrid.dev/v1alpha1."""
    kind: RunKind = RunKind.JOB
    """job (one or more identical pods), pytorch (torchrun across workers: Indexed Job and
    headless Service) or ray (a RayJob with a head and `workers` worker pods)."""
    name: RunName
    """Run name: at most 40 lower-case letters, digits and '-', starting with a letter."""
    namespace: DnsLabel | None = None
    """Kubernetes namespace; the request's `?namespace=` wins, then this, then `default`."""
    image: Image
    """Container image, best pinned by digest (`repo@sha256:...`); a tag gets a warning."""
    command: (
        Annotated[str, pydantic.StringConstraints(max_length=MAX_ENV_VALUE_BYTES)]
        | Annotated[list[PlainText], pydantic.Field(min_length=1, max_length=256)]
    )
    """A list runs as is (exec form); a string runs under `/bin/sh -c`."""
    args: Annotated[list[PlainText], pydantic.Field(max_length=1024)] = []
    """Arguments appended to `command`."""
    env: Annotated[
        dict[str, PlainText],
        pydantic.Field(
            json_schema_extra={
                "propertyNames": {
                    "pattern": patterns.schema(r"(?!TAU_)[A-Za-z_][A-Za-z0-9_]*"),
                    "not": {"enum": sorted(RESERVED_ENV_NAMES)},
                }
            }
        ),
    ] = {}
    """Environment variables, stored as plain text in the run: anyone who may read runs in the
    namespace reads them, so put tokens and keys in `secretEnv`. Names starting TAU_ are
    reserved for TauGrid, and the NVIDIA
    container toolkit's device variables (`NVIDIA_VISIBLE_DEVICES`,
    `NVIDIA_DRIVER_CAPABILITIES`, `NVIDIA_MIG_CONFIG_DEVICES`, `NVIDIA_MIG_MONITOR_DEVICES`,
    `NVIDIA_IMEX_CHANNELS`) for the device plugin."""
    secret_env: Annotated[
        dict[str, SecretRef],
        pydantic.Field(
            max_length=MAX_SECRET_ENV,
            json_schema_extra={
                "propertyNames": {
                    "pattern": patterns.schema(r"(?!TAU_)[A-Za-z_][A-Za-z0-9_]*"),
                    "not": {"enum": sorted(RESERVED_ENV_NAMES)},
                }
            },
        ),
    ] = {}
    """Environment variables read from Secrets of the run's namespace
    (`HF_TOKEN: {secret: hf, key: token}`): only the names are stored, never the value. Use
    it for tokens and keys; `env` is plain text that anyone who may read runs can read. The
    same names as `env` are refused, and a name may not be in both."""
    workers: Annotated[StrictInt, pydantic.Field(ge=1, le=MAX_WORKERS)] = 1
    """Number of pods (for ray: worker pods besides the head)."""
    resources: Resources = Resources()
    """Per-worker resources."""
    nproc_per_node: Annotated[StrictInt, pydantic.Field(ge=1, le=MAX_GPUS_PER_WORKER)] | None = None
    """kind: pytorch only. Processes per worker for torchrun; default: `resources.gpus`
    (1 when that is 0)."""
    shm_size: Quantity = DEFAULT_SHM_SIZE
    """Size of the memory-backed /dev/shm (PyTorch data loaders and NCCL need more than the
    64Mi container default). It counts against the worker's memory when used."""
    volumes: Annotated[list[Volume], pydantic.Field(max_length=32)] = []
    """PersistentVolumeClaims to mount, e.g. datasets."""
    image_pull_secrets: Annotated[list[ObjectName], pydantic.Field(max_length=16)] = []
    """Secrets in the namespace for pulling `image` from a private registry."""
    queue: DnsLabel = DEFAULT_QUEUE
    """Kueue LocalQueue in the run's namespace."""
    priority: PriorityClass | None = None
    """Kueue WorkloadPriorityClass. The controller's own `taugrid-resume` is refused, and a
    platform may allow only some classes (`TAUGRID_CONTROLLER_ALLOWED_PRIORITY_CLASSES`)."""
    checkpoint: Checkpoint | None = None
    """Where checkpoints go; needed for resume after a failure to continue, not restart."""
    retry: Retry = Retry()
    """Automatic retry policy."""
    timeout: Duration | None = None
    """Wall-clock limit for the whole run, measured by the controller (a Job's deadline
    restarts on each suspend)."""
    experiment: Experiment | None = None
    """Tracking metadata."""
    labels: Annotated[
        dict[
            str,
            Annotated[
                str,
                pydantic.BeforeValidator(_coerce_plain_text),
                pydantic.Field(json_schema_extra=_string_schema(_LABEL_VALUE_RE, 63)),
            ],
        ],
        pydantic.Field(
            max_length=32, json_schema_extra={"propertyNames": {"maxLength": 253 + 1 + 63}}
        ),
    ] = {}
    """Extra Kubernetes labels on the run's objects and pods. Keys in the domains other
    controllers act on are refused (`*.kubernetes.io`, `*.k8s.io`, `*.x-k8s.io`, `ray.io`,
    `*.istio.io`, `taugrid.dev`), and so are `controller-uid`, `job-name` and
    `pod-template-hash`."""

    @pydantic.field_validator("command")
    @classmethod
    def _command_not_blank(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, str) and not value.strip():
            msg = "must not be empty: give a list (exec form) or a shell command string"
            raise ValueError(msg)
        if isinstance(value, list) and not value[0]:
            msg = "the first element (the program) must not be empty"
            raise ValueError(msg)
        return value

    @pydantic.field_validator("secret_env")
    @classmethod
    def _secret_env_names(cls, value: dict[str, SecretRef]) -> dict[str, SecretRef]:
        _check_env_names(value, "secretEnv")
        return value

    @pydantic.field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        _check_env_names(value, "env")
        total = sum(len(k) + len(v.encode()) for k, v in value.items())
        if total > MAX_ENV_TOTAL_BYTES:
            msg = f"environment is {total} bytes; the limit is {MAX_ENV_TOTAL_BYTES}"
            raise ValueError(msg)
        return value

    @pydantic.field_validator("labels")
    @classmethod
    def _label_pairs(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label_value in value.items():
            _check_label_key(key)
            if len(label_value) > 63 or not _LABEL_VALUE_RE.fullmatch(label_value):
                msg = (
                    f"value {_short(label_value)} must be at most 63 letters, digits, '-', '_'"
                    " or '.', starting and ending with a letter or digit"
                )
                raise _FieldError(f"labels.{key}", msg)
        return value

    @pydantic.model_validator(mode="after")
    def _cross_field(self) -> TauSpec:
        if self.nproc_per_node is not None and self.kind != RunKind.PYTORCH:
            msg = "nprocPerNode applies only to kind: pytorch"
            raise _FieldError("nprocPerNode", msg)
        if self.kind == RunKind.PYTORCH:
            for field, names in (("env", self.env), ("secretEnv", self.secret_env)):
                clash = sorted(RENDEZVOUS_ENV_NAMES & set(names))
                if clash:
                    verb = "is" if len(clash) == 1 else "are"
                    msg = f"{', '.join(clash)} {verb} set by TauGrid for torchrun rendezvous"
                    raise _FieldError(f"{field}.{clash[0]}", msg)
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            msg = f"{both[0]!r} is in env too; give each variable once"
            raise _FieldError(f"secretEnv.{both[0]}", msg)
        seen: dict[str, int] = {}
        for index, volume in enumerate(self.volumes):
            path = _clean_path(volume.mount_path)
            if path == "/" or any(_is_under(path, reserved) for reserved in RESERVED_MOUNT_PATHS):
                msg = (
                    f"{volume.mount_path!r} is reserved (the root, /dev/shm, the checkpoint file"
                    " and the ServiceAccount token directories); choose another mountPath"
                )
                raise _FieldError(f"volumes[{index}].mountPath", msg)
            if path in seen:
                msg = f"{volume.mount_path!r} is already used by volumes[{seen[path]}]"
                raise _FieldError(f"volumes[{index}].mountPath", msg)
            seen[path] = index
        if self.checkpoint is not None and self.checkpoint.volume is not None:
            listed = [v for v in self.volumes if v.claim == self.checkpoint.volume]
            if listed and not any(_is_under(self.checkpoint.dir, v.mount_path) for v in listed):
                msg = (
                    f"{self.checkpoint.dir!r} is not under the mountPath of volume"
                    f" {self.checkpoint.volume!r} ({listed[0].mount_path})"
                )
                raise _FieldError("checkpoint.dir", msg)
            if not listed and (
                _clean_path(self.checkpoint.dir) in seen
                or any(_is_under(self.checkpoint.dir, r) for r in RESERVED_MOUNT_PATHS)
            ):
                msg = (
                    f"volume {self.checkpoint.volume!r} would be mounted at"
                    f" {self.checkpoint.dir!r}, which is already in use; list it in volumes"
                    " and put dir under its mountPath"
                )
                raise _FieldError("checkpoint.dir", msg)
            if listed and all(v.read_only for v in listed):
                msg = f"volume {self.checkpoint.volume!r} is mounted readOnly"
                raise _FieldError("checkpoint.volume", msg)
        return self

    @property
    def timeout_s(self) -> int | None:
        """The run's wall-clock limit in seconds, or None."""
        return None if self.timeout is None else parse_duration(self.timeout)

    @property
    def effective_nproc_per_node(self) -> int:
        """Processes per worker for torchrun: the given value, else the GPUs, else 1."""
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        return max(self.resources.gpus, 1)

    @property
    def argv(self) -> list[str]:
        """The container's full argv: exec form as given, shell form under /bin/sh -c.

        For the shell form, `args` (if any) become the positional parameters `$1...` after
        `$0`, which is set to the run name, as `sh -c` defines.
        """
        if isinstance(self.command, str):
            positional = [self.name, *self.args] if self.args else []
            return ["/bin/sh", "-c", self.command, *positional]
        return [*self.command, *self.args]


def _check_env_names(names: typing.Iterable[str], field: str) -> None:
    """Refuse a variable name that is not one, is TauGrid's (`TAU_*`) or the device plugin's."""
    for key in names:
        if not _ENV_NAME_RE.fullmatch(key):
            msg = (
                f"{_short(key)} is not a valid variable name: use letters, digits and '_',"
                " not starting with a digit"
            )
            raise _FieldError(_key_field(field, key), msg)
        if key.startswith("TAU_"):
            msg = f"{key!r}: names starting TAU_ are reserved for TauGrid"
            raise _FieldError(f"{field}.{key}", msg)
        if key in RESERVED_ENV_NAMES:
            msg = (
                f"{key!r} decides which GPUs a container gets and is set by the device plugin"
                " alone; ask for GPUs with resources.gpus (CUDA_VISIBLE_DEVICES is allowed)"
            )
            raise _FieldError(f"{field}.{key}", msg)


class _FieldError(ValueError):
    """A cross-field problem that belongs to one particular field path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _clean_path(path: str) -> str:
    """The path as the kubelet mounts it: no empty or `.` segments (`..` is refused)."""
    return "/" + "/".join(part for part in path.split("/") if part not in {"", "."})


def _is_under(path: str, root: str) -> bool:
    path, root = _clean_path(path), _clean_path(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _key_field(parent: str, key: str) -> str:
    """The field path of a mapping key; a key too long to be one is named by its parent."""
    return f"{parent}.{key}" if len(key) <= 253 else parent


def _check_label_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    ok = bool(name) and len(name) <= 63 and bool(_LABEL_NAME_RE.fullmatch(name))
    if prefix:
        ok = ok and len(prefix) <= 253 and bool(_DNS1123_SUBDOMAIN_RE.fullmatch(prefix))
    if not ok:
        msg = (
            f"{_short(key)} is not a valid label key: an optional DNS prefix and '/', then at"
            " most 63 letters, digits, '-', '_' or '.'"
        )
        raise _FieldError(_key_field("labels", key), msg)
    if prefix and any(
        prefix == domain or prefix.endswith("." + domain) for domain in RESERVED_LABEL_DOMAINS
    ):
        msg = (
            f"label prefix {prefix!r} is reserved: Kubernetes, Kueue, KubeRay, Istio and TauGrid"
            " act on labels in it"
        )
        raise _FieldError(f"labels.{key}", msg)
    if not prefix and name in RESERVED_LABEL_NAMES:
        msg = f"label {name!r} is reserved: the Job and ReplicaSet controllers select pods by it"
        raise _FieldError(f"labels.{key}", msg)


# ---------------------------------------------------------------- errors and parsing


class SpecErrorKind(enum.StrEnum):
    """What kind of problem, so the HTTP layer can choose 413, 415, 400 or 422."""

    TOO_LARGE = "TooLarge"
    UNSUPPORTED_MEDIA_TYPE = "UnsupportedMediaType"
    MALFORMED = "Malformed"
    INVALID = "Invalid"


@dataclasses.dataclass(frozen=True)
class FieldProblem:
    """One problem: `field` is a path like `retry.when[0]` ("" for the whole document)."""

    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        """Return the wire form `{"field", "message"}`."""
        return {"field": self.field, "message": self.message}


class SpecError(Exception):
    """The spec cannot be accepted; `problems` lists every field at fault."""

    def __init__(self, problems: list[FieldProblem], kind: SpecErrorKind) -> None:
        self.problems = problems
        self.kind = kind
        super().__init__(
            "; ".join(f"{p.field}: {p.message}" if p.field else p.message for p in problems)
        )

    @property
    def field(self) -> str:
        """The first field at fault, for single-field error bodies."""
        return self.problems[0].field if self.problems else ""


@dataclasses.dataclass(frozen=True)
class ParsedSpec:
    """A valid spec and the warnings the response should carry (e.g. an unpinned image)."""

    spec: TauSpec
    warnings: tuple[str, ...]


_YAML_TYPES = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain"}
)
_JSON_TYPES = frozenset({"application/json"})


def parse_spec(data: bytes, content_type: str | None = None) -> ParsedSpec:
    """Decode, parse and validate a request body holding a tau.yaml (YAML or JSON).

    `content_type` may carry parameters (`application/yaml; charset=utf-8`); None or an
    empty string means YAML, which also reads JSON documents. The caller should refuse a
    body over `MAX_SPEC_BYTES` before reading it all; this checks again.
    """
    if len(data) > MAX_SPEC_BYTES:
        msg = f"body is {len(data)} bytes; the limit is {MAX_SPEC_BYTES} (1 MiB)"
        raise SpecError([FieldProblem("", msg)], SpecErrorKind.TOO_LARGE)
    media_type, charset = _media_type(content_type)
    if media_type not in _YAML_TYPES | _JSON_TYPES | {""}:
        msg = f"content type {media_type!r} is not supported; send application/yaml or JSON"
        raise SpecError([FieldProblem("", msg)], SpecErrorKind.UNSUPPORTED_MEDIA_TYPE)
    if charset not in {"", "utf-8", "utf8"}:
        msg = f"charset {charset!r} is not supported; send UTF-8"
        raise SpecError([FieldProblem("", msg)], SpecErrorKind.UNSUPPORTED_MEDIA_TYPE)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        msg = f"the body is not UTF-8 (invalid byte at offset {err.start}); send UTF-8 text"
        raise SpecError([FieldProblem("", msg)], SpecErrorKind.MALFORMED) from err
    text = text.removeprefix("\ufeff")
    document = _load_json(text) if media_type in _JSON_TYPES else _load_yaml(text)
    return validate_spec(document)


_DECLARED_NAMESPACE_RE = re.compile(
    rb"(?:^|[{,])[ \t]*[\"']?namespace[\"']?[ \t]*:[ \t]*[\"']?"
    rb"([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)[\"']?[ \t]*(?=[,}#\r\n]|\Z)",
    re.MULTILINE,
)
MAX_DECLARED_NAMESPACES = 4


def declared_namespaces(data: bytes) -> list[str]:
    """The namespaces a body may declare, found without parsing it: the values of lines (or
    JSON members) `namespace: NAME`, distinct, in order, at most MAX_DECLARED_NAMESPACES.

    One linear scan, no parse (security review M3): the controller authorises the caller on
    one of these before it spends any CPU on the document, then checks the namespace the
    parsed spec really names. A nested key of the same name (a label) can be among them;
    that costs a second check, never a parse for someone who may not create runs at all.
    """
    found: list[str] = []
    for match in _DECLARED_NAMESPACE_RE.finditer(data):
        name = match.group(1).decode("ascii")
        if name not in found:
            found.append(name)
            if len(found) == MAX_DECLARED_NAMESPACES:
                break
    return found


def validate_spec(document: object) -> ParsedSpec:
    """Validate already-parsed data (a dict from YAML/JSON or a TauRun's `spec`)."""
    if not isinstance(document, dict):
        got = "an empty document" if document is None else f"a {_json_type(document)}"
        msg = f"the document must be a mapping of tau.yaml fields (name, image, ...), not {got}"
        raise SpecError([FieldProblem("", msg)], SpecErrorKind.INVALID)
    key_problems = _non_string_keys(document, "")
    if key_problems:
        raise SpecError(key_problems, SpecErrorKind.INVALID)
    try:
        spec = TauSpec.model_validate(document)
    except pydantic.ValidationError as err:
        raise SpecError(_problems(err), SpecErrorKind.INVALID) from err
    return ParsedSpec(spec=spec, warnings=tuple(spec_warnings(spec)))


def _non_string_keys(value: object, path: str) -> list[FieldProblem]:
    """Find mapping keys YAML typed as numbers, booleans or null (`1:`, `true:`, `null:`)."""
    problems: list[FieldProblem] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                shown = json.dumps(key)
                msg = f"key {shown} must be a string; quote it ('{shown}') if it is meant"
                problems.append(FieldProblem(path, msg))
                continue
            problems += _non_string_keys(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            problems += _non_string_keys(item, f"{path}[{index}]")
    return problems


def spec_warnings(spec: TauSpec) -> list[str]:
    """Return advice about a valid spec: things that work but will hurt later."""
    warnings: list[str] = []
    if not _DIGEST_RE.search(spec.image):
        warnings.append(
            f"image {spec.image!r} is not pinned by digest; a retry or resume may run different"
            " code if the tag moves. Pin it as repository@sha256:<digest>."
        )
    if spec.checkpoint is not None and spec.checkpoint.volume is None:
        warnings.append(
            f"checkpoint.dir {spec.checkpoint.dir!r} is on the pod's own disk and is lost with"
            " the pod; set checkpoint.volume to a PersistentVolumeClaim so resume can use it."
        )
    if spec.checkpoint is not None and spec.checkpoint.volume is not None and spec.workers > 1:
        warnings.append(
            f"{spec.workers} workers share checkpoint volume {spec.checkpoint.volume!r}: it must"
            " be ReadWriteMany, or only rank 0 may write checkpoints."
        )
    if spec.retry.max_attempts > 1 and spec.checkpoint is None:
        warnings.append(
            "no checkpoint is configured, so a retried attempt starts from the beginning."
        )
    return warnings


def _media_type(content_type: str | None) -> tuple[str, str]:
    if not content_type:
        return "", ""
    media_type, *params = (part.strip() for part in content_type.split(";"))
    charset = ""
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
    return media_type.lower(), charset


def _load_yaml(text: str) -> object:
    try:
        return yamlsafe.load(text)
    except yamlsafe.YamlError as err:
        message = err.message if err.line is None else f"{err.message} (line {err.line})"
        raise SpecError([FieldProblem(err.path, message)], SpecErrorKind.MALFORMED) from err


def _load_json(text: str) -> object:
    try:
        return jsonsafe.load(text)
    except jsonsafe.JsonError as err:
        raise SpecError([FieldProblem(err.path, str(err))], SpecErrorKind.MALFORMED) from err


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    if value is None:
        return "null"
    return type(value).__name__


def _format_loc(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path = f"{path}.{part}" if path else part
    return path


def _problems(err: pydantic.ValidationError) -> list[FieldProblem]:
    problems: list[FieldProblem] = []
    for item in err.errors():
        loc = _strip_union_branches(item["loc"])
        context = item.get("ctx") or {}
        original = context.get("error")
        if isinstance(original, _FieldError):
            problems.append(FieldProblem(original.field, original.message))
            continue
        field = _format_loc(loc)
        kind = item["type"]
        if kind == "missing":
            message = "is required"
        elif kind == "extra_forbidden":
            allowed = _allowed_fields(loc[:-1])
            message = "unknown field" + (f"; allowed here: {', '.join(allowed)}" if allowed else "")
        elif isinstance(original, ValueError):
            message = str(original)
        else:
            message = _friendly_message(kind, context, item["input"], item["msg"])
        problems.append(FieldProblem(field, message))
    return _dedupe_union_noise(problems)


_TYPE_WORDS = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def _friendly_message(kind: str, context: dict[str, Any], value: object, fallback: str) -> str:
    """Say what is allowed, and what was given, in words a researcher uses."""
    if kind in _TYPE_WORDS:
        return f"must be {_TYPE_WORDS[kind]}, not {_json_type(value)} {_short(value)}"
    if kind == "greater_than_equal":
        return f"must be at least {context['ge']}, not {_short(value)}"
    if kind == "less_than_equal":
        return f"must be at most {context['le']}, not {_short(value)}"
    if kind == "too_long":
        return f"must have at most {context['max_length']} entries"
    if kind == "too_short":
        return f"must have at least {context['min_length']} entries"
    if kind in {"enum", "literal_error"}:
        expected = str(context.get("expected", "")).replace("'", "")
        return f"must be one of {expected}, not {_short(value)}"
    return fallback


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _strip_union_branches(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """Drop pydantic's union branch tags (`str`, `list[...]`, `function-after[...]`)."""
    return tuple(
        part
        for part in loc
        if not (
            isinstance(part, str)
            and ("[" in part or part in {"str", "int", "bool"} or part.startswith("constrained-"))
        )
    )


def _dedupe_union_noise(problems: list[FieldProblem]) -> list[FieldProblem]:
    """Keep one problem per field when a union (command: string or list) failed both ways."""
    if any(problem.field.startswith("command[") for problem in problems):
        # A list was given, so the string branch's complaint is noise.
        problems = [problem for problem in problems if problem.field != "command"]
    by_field: dict[str, list[FieldProblem]] = {}
    for problem in problems:
        by_field.setdefault(problem.field, []).append(problem)
    result: list[FieldProblem] = []
    for field, group in by_field.items():
        if field == "command" and len(group) > 1:
            result.append(
                FieldProblem(
                    "command",
                    "must be a list of strings (exec form) or one string (run by /bin/sh -c)",
                )
            )
        else:
            result.extend(group)
    return result


def _allowed_fields(loc: tuple[int | str, ...]) -> list[str]:
    """Return the wire names of the fields of the model found at `loc`, if any."""
    model: type[pydantic.BaseModel] | None = TauSpec
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        target = next(
            (f for name, f in model.model_fields.items() if part in {name, f.alias}), None
        )
        model = None if target is None else _model_in(target.annotation)
    if model is None:
        return []
    return [f.alias or name for name, f in model.model_fields.items()]


def _model_in(annotation: object) -> type[pydantic.BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------- schema and hash


def spec_json_schema() -> dict[str, Any]:
    """Return the JSON Schema of tau.yaml (served at `/v1/schema/run`), wire names."""
    schema = TauSpec.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://taugrid.dev/schemas/v1alpha1/run.json"
    schema["title"] = "tau.yaml"
    return schema


def spec_to_wire(spec: TauSpec) -> dict[str, Any]:
    """Return the spec as camelCase JSON-ready data (what goes into a TauRun's `spec`)."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def spec_hash(spec: TauSpec) -> str:
    """Return `sha256:<hex>` of the canonical JSON of the validated spec, defaults included.

    Canonical: wire names, sorted keys, no whitespace, unset optional fields left out (so a
    new optional field in a later release does not change the hash of existing specs).
    """
    canonical = json.dumps(
        spec_to_wire(spec), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
