"""What the runs API takes and answers, as models: the OpenAPI document is generated from
them, and the path, query and body models are the ones that validate (DESIGN.md section 4).

Path and query models validate before a handler runs (`controller.serving.operation`);
names are matched in full (`shared.patterns`), so `.`, `..` or `x%2F..%2Fy` (decoded to
`x/../y`) are a 400 naming the parameter, never a TauRun collection read as a run.

The answer models describe the JSON the handlers build (`context.run_json` and friends);
they are published, not run on every answer, so a TauRun edited by hand cannot turn a read
into a 500. The OpenAPI fuzzer checks every answer against them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pydantic

from controller import wire
from controller.runs import checkpoints, records, results
from shared import patterns
from shared import spec as specs

MAX_ATTEMPT = 10_000
"""Attempts a log query may name; far beyond `retry.maxAttempts` and any number of resumes."""
MAX_TAIL_LINES = 100_000
MAX_SINCE_S = 366 * 24 * 3600
"""`sinceSeconds` of a log call: a year, beyond any pod's life; catches a unit mix-up."""


Wire = wire.Wire
Params = wire.Lenient
"""Path or query parameters: unknown ones are ignored, as HTTP clients expect."""


def _phase(value: object) -> object:
    """Phases are matched without regard to case (`?phase=running`)."""
    if isinstance(value, str):
        for phase in records.Phase:
            if phase.value.lower() == value.lower():
                return phase.value
    return value


# ---------------------------------------------------------------- parameters
MetricParam = Annotated[
    results.MetricName,
    pydantic.Field(json_schema_extra={"pattern": patterns.schema(results.METRIC_NAME_RE)}),
]
"""A metric's name as a query parameter (its pattern published in the OpenAPI document)."""


class RunPath(Params):
    """A run in the path: `/v1/runs/{namespace}/{name}`."""

    namespace: specs.DnsLabel
    """The run's namespace (a DNS-1123 label)."""
    name: specs.ObjectName
    """The run's name (a DNS-1123 subdomain, as Kubernetes requires of a TauRun)."""


class SubmitQuery(Params):
    """Query of `POST /v1/runs`."""

    namespace: specs.DnsLabel | None = None
    """The run's namespace; else the spec's `namespace`, else `default`."""
    dry_run: bool = False
    """Authorise, parse, validate and render attempt 1, and have the API server check what
    would be created (its own dry run), but create nothing; 200 with what would be created."""


class ListQuery(Params):
    """Filters of `GET /v1/runs`."""

    namespace: specs.DnsLabel | None = None
    """Only this namespace (else every namespace the caller may list)."""
    phase: Annotated[records.Phase, pydantic.BeforeValidator(_phase)] | None = None
    """Only runs in this phase (any case)."""
    queue: specs.DnsLabel | None = None
    """Only runs of this LocalQueue."""
    experiment: specs.ShortText | None = None
    """Only runs of this experiment (`experiment.name`)."""


class LogsQuery(Params):
    """Query of `GET /v1/runs/{namespace}/{name}/logs`."""

    follow: bool = False
    """Keep the stream open until the container ends."""
    attempt: Annotated[int, pydantic.Field(ge=1, le=MAX_ATTEMPT)] | None = None
    """Which attempt (default: the current one)."""
    worker: Annotated[int, pydantic.Field(ge=0, le=specs.MAX_WORKERS)] = 0
    """Which worker, from 0 (ray: 0 is the head)."""
    tail: Annotated[int, pydantic.Field(ge=0, le=MAX_TAIL_LINES)] | None = None
    """Only the last N lines."""
    since_seconds: Annotated[int, pydantic.Field(ge=1, le=MAX_SINCE_S)] | None = None
    """Only lines the container wrote in the last N seconds (`tau logs --since`). A kept tail
    (the pod is gone) has no times and is served whole."""
    kept: bool = False
    """Serve the tail the controller kept of the worker's log, even while its pod lives."""


class QueuesQuery(Params):
    """Query of `GET /v1/queues`."""

    namespace: specs.DnsLabel = "default"
    """The namespace whose LocalQueues to show."""


class ResultsQuery(Params):
    """Query of `GET /v1/runs/{namespace}/{name}/results`."""

    metric: MetricParam | None = None
    """Only this metric."""


class ExperimentsQuery(Params):
    """Query of `GET /v1/experiments`."""

    namespace: specs.DnsLabel = "default"
    """The namespace whose experiments to show."""


class CompareQuery(Params):
    """Query of `GET /v1/experiments/compare`: an experiment, or runs named one by one."""

    namespace: specs.DnsLabel = "default"
    """The namespace of the runs."""
    name: specs.ShortText | None = None
    """The experiment whose runs to compare."""
    run: Annotated[list[specs.ObjectName], pydantic.Field(max_length=50)] = []
    """Runs to compare (repeat the parameter: `run=a&run=b`), instead of an experiment."""
    metric: MetricParam | None = None
    """With it, each run's series of that metric."""


# ---------------------------------------------------------------- bodies
class RerunRequest(Wire):
    """Body of `POST …/rerun` (optional): the new run's name."""

    name: specs.RunName | None = None
    """The new run's name (default: `<name>-r<N>`)."""


class ResumeRequest(Wire):
    """Body of `POST …/resume` (optional): the checkpoint to resume from."""

    checkpoint: checkpoints.CheckpointPath | None = None
    """A checkpoint path (default: the latest one reported)."""


# ---------------------------------------------------------------- answers
Record = dict[str, Any]
"""A record the controller keeps in the TauRun's status (an attempt, a condition)."""


class RunSummary(Wire):
    """A run as `GET /v1/runs` lists it."""

    name: str
    namespace: str
    kind: str
    """job, pytorch or ray."""
    queue: str
    phase: str
    """Pending, Queued, Admitted, Running, Resuming, Succeeded, Failed or Cancelled."""
    reason: str
    message: str
    attempt: int
    """The current attempt (0 before the first)."""
    queue_position: int | None
    queue_position_in_local_queue: int | None
    queue_position_source: str | None
    gpus: int
    """GPUs of all workers together."""
    created_at: str | None
    start_time: str | None
    end_time: str | None
    attempts: list[Record]
    conditions: list[Record]
    checkpoints: list[Record]
    experiment: dict[str, Any] | None
    """The spec's `experiment` (name, project, tags)."""
    rerun_of: dict[str, Any] | None
    """The run this one reran, when it is a rerun."""


class RunView(RunSummary):
    """One run, with its spec (the validated tau.yaml as stored)."""

    spec: dict[str, Any]


class RunCreated(RunView):
    """A run just submitted, with advice about its spec."""

    warnings: list[str]


class RunRerun(RunCreated):
    """A run just submitted as the rerun of another."""

    rerun_of: dict[str, Any]


class RunList(Wire):
    """Runs the caller may list."""

    items: list[RunSummary]


class DryRun(Wire):
    """What `POST /v1/runs?dryRun=true` would have created; nothing was."""

    dry_run: Literal[True]
    run: dict[str, Any]
    """The TauRun, as it would be created."""
    objects: list[dict[str, Any]]
    """The run's own objects and those of attempt 1, in the order the reconciler creates them."""
    warnings: list[str]


class Evidence(Wire):
    """Enough to reproduce a run and see where it ran (more members as the run recorded)."""

    model_config = pydantic.ConfigDict(extra="allow")
    name: str | None
    namespace: str | None
    uid: str | None
    phase: str
    attempts: list[Record]
    kept_logs: list[Record]
    """The workers' logs the controller kept."""


class CheckpointRecord(Wire):
    """One checkpoint as the run's status keeps it."""

    attempt: int
    step: int
    path: str
    time: str


class CheckpointList(Wire):
    """The checkpoints the run's status keeps, oldest first."""

    items: list[CheckpointRecord]


class QueueResource(Wire):
    """Quota and usage of one resource of one flavor of a ClusterQueue."""

    flavor: str
    resource: str
    quota: str
    used: str


class QueueWaiting(Wire):
    """A run waiting in a LocalQueue."""

    name: str
    gpus: int
    queue_position: int | None
    queue_position_source: str | None
    message: str


class Queue(Wire):
    """A LocalQueue: its ClusterQueue's quota and usage, and who waits."""

    name: str
    namespace: str
    cluster_queue: str
    pending_workloads: int
    admitted_workloads: int
    resources: list[QueueResource]
    waiting: list[QueueWaiting]


class QueueList(Wire):
    """The namespace's LocalQueues."""

    namespace: str
    items: list[Queue]


class ResultsAccepted(Wire):
    """A results report taken in."""

    accepted: dict[str, int | bool]
    """How many metrics and artifacts, and whether a summary, the report carried."""
    pending: int
    """Reports of the run waiting to be written."""
    written_within_s: float


class ResultsView(Wire):
    """A run's results: metrics over steps (each with its last point), artifacts, summary."""

    model_config = pydantic.ConfigDict(extra="allow")
    name: str
    namespace: str
    phase: str
    attempt: int
    experiment: dict[str, Any] | None
    metrics: list[Record] = []
    artifacts: list[Record] = []


class ExperimentView(Wire):
    """One experiment of a namespace."""

    name: str
    projects: list[str]
    tags: list[str]
    runs: int
    phases: dict[str, int]
    """Its runs by phase."""
    latest: str | None
    """When its newest run was created."""


class ExperimentList(Wire):
    """The namespace's experiments, newest first."""

    namespace: str
    items: list[ExperimentView]


class Comparison(Wire):
    """Runs side by side: each run's final metrics, and with `metric` its series."""

    namespace: str
    experiment: str | None
    metric: str | None
    metrics: list[str]
    """Every metric name any of the runs reported."""
    runs: list[Record]
