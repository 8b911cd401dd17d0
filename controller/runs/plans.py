"""The run decision's input and output (pure): what the reconciler read of one run
(`RunInput`), with the settings every decision depends on (`RunSettings`), and what to write
(`RunPlan`). `controller.runs.policy.decide_run` maps one to the other."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from controller.runs import objects, positions, records, rendering, views


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """What every run's decisions depend on besides the run itself."""

    render: rendering.RenderSettings
    ttl_after_finished_s: float | None
    """A finished run's objects are deleted this long after it ended; None keeps them."""
    pod_annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Annotations added to every pod of every run (cluster tooling)."""
    resume_priority_class: str = ""
    """The class a run resumed after an infrastructure failure gets; '' gives none."""
    pods_ready_timeout_s: float | None = None
    """Kueue's `waitForPodsReady.timeout` as the platform configured it (None: not enabled):
    what an admitted run whose pods do not run is told about its quota."""
    allowed_priority_classes: tuple[str, ...] = ()
    """The platform's allowlist of WorkloadPriorityClasses a spec may name (empty: any but
    the resume class). Checked here, where every run passes, not only on the HTTP API: a
    TauRun made with kubectl is held to it too (security review 3, finding 5)."""


@dataclasses.dataclass(frozen=True)
class RunInput:
    """Everything one run's decision reads, as the reconciler found it."""

    ref: objects.RunRef
    spec: Mapping[str, Any]
    """The TauRun's spec as stored (validated here: a TauRun may come from kubectl)."""
    status: records.RunStatus
    cancel_requested: bool = False
    observed: bool = True
    """False on the fast path (right after a submission): the attempt's object, Workload
    and pods below were not read, so only what needs none of them is decided."""
    attempt_object: views.AttemptObjectView | None = None
    workload: views.WorkloadView | None = None
    pods: tuple[views.PodView, ...] = ()
    nodes: views.NodeFacts = dataclasses.field(
        default_factory=lambda: views.NodeFacts(frozenset(), frozenset())
    )
    position: positions.QueuePosition | None = None
    """Its Workload's place in line (Kueue's visibility API, else computed)."""
    reason_ahead: str = ""
    """What Kueue said of the Workload ahead of its own, when it said nothing of its own."""
    cluster_queue: str | None = None
    """The ClusterQueue behind its LocalQueue; None when the LocalQueue does not exist."""
    held: str | None = None
    """Why our admission gate holds its Workload back, when it does."""
    priority_classes: frozenset[str] | None = None
    """The WorkloadPriorityClasses that exist; None when they could not be listed."""
    rerun_of: records.RerunSource | None = None
    """The run this one reruns (its `taugrid.dev/rerun-of` annotation), for the evidence."""


@dataclasses.dataclass(frozen=True)
class ObjectRef:
    """An object to delete."""

    kind: str
    namespace: str
    name: str


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What to write for one run, in order, and what to count."""

    status: records.RunStatus
    annotations: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    """Annotations of the TauRun to set (None removes one), written first."""
    deletes: tuple[ObjectRef, ...] = ()
    creates: tuple[dict[str, Any], ...] = ()
    """Objects to create, in order (a Secret is written: created, or its data replaced)."""
    requeue_at: dt.datetime | None = None
    """The earliest time the decision would change with nothing else changing."""
    started: tuple[int, ...] = ()
    """Attempts created by this plan."""
    ended: str | None = None
    """How the current attempt ended, when it did now (`Succeeded` or a failure class)."""
    resumed: str | None = None
    """The failure class a retry follows, when this plan starts one."""
    queue_wait_s: float | None = None
    """Seconds the run waited in line, when it was admitted just now."""
    keep_logs: tuple[int, ...] = ()
    """Attempts whose workers' logs are kept now, before the deletes: those the plan deletes
    and the one that ended (their pods may be gone by the next look)."""
