"""Builders of the raw objects and views the runs tests read (a Workload, a pod, a Job)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from controller import marks, timestamps
from controller.runs import views
from shared import spec as specs

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NODES = views.NodeFacts(existing=frozenset({"n0", "n1", "bad"}), quarantined=frozenset({"bad"}))
SPEC = specs.parse_spec(
    b"name: demo\nimage: reg/train@sha256:" + b"a" * 64 + b"\ncommand: [python, t.py]\n"
    b"resources: {gpus: 8}\nqueue: q\nexperiment: {project: p}\n"
).spec


def ts(seconds: float) -> str:
    return timestamps.rfc3339(T0 + dt.timedelta(seconds=seconds))


def cond(kind: str, status: str = "True", reason: str = "", message: str = "", at: float = 0
          ) -> dict[str, Any]:  # fmt: skip
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": ts(at)}  # fmt: skip


def a_workload(
    *conds: dict[str, Any],
    name: str = "job-demo-a1-x",
    ns: str = "team",
    queue: str = "q",
    priority: int = 0,
    created: float = 0,
    active: bool = True,
    cq: str = "",
    uid: str = "",
) -> views.WorkloadView:
    status: dict[str, Any] = {"conditions": list(conds)}
    if cq:
        status["admission"] = {
            "clusterQueue": cq,
            "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "h100"}}],
        }
    return views.parse_workload(
        {
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": ts(created),
                         "uid": uid, "ownerReferences": [{"kind": "Job", "name": "demo-a1"}]},
            "spec": {"queueName": queue, "priority": priority, "active": active,
                     "podSets": [{"name": "main", "count": 1}]},
            "status": status,
        }
    )  # fmt: skip


def a_pod(
    name: str = "demo-a1-abc",
    *,
    phase: str = "Running",
    node: str = "n0",
    exit_code: int | None = None,
    reason: str = "",
    disruption: str = "",
) -> views.PodView:
    status: dict[str, Any] = {"phase": phase, "startTime": ts(1), "conditions": []}
    if exit_code is not None:
        status["containerStatuses"] = [
            {"name": "main", "image": "img", "imageID": "reg/train@sha256:abc",
             "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                      "finishedAt": ts(9)}}}
        ]  # fmt: skip
    if disruption:
        status["conditions"].append(cond("DisruptionTarget", reason=disruption))
    return views.parse_pod(
        {"metadata": {"name": name, "labels": {marks.ATTEMPT_LABEL: "1"}},
         "spec": {"nodeName": node, "containers": [{"name": "main"}]}, "status": status}
    )  # fmt: skip


def a_job(*conds: dict[str, Any], suspended: bool = False) -> views.AttemptObjectView:
    return views.parse_attempt_object(
        {"kind": "Job", "metadata": {"name": "demo-a1"}, "spec": {"suspend": suspended},
         "status": {"conditions": list(conds)}}
    )  # fmt: skip


def a_rayjob(job_status: str, deployment: str, reason: str = "") -> views.AttemptObjectView:
    return views.parse_attempt_object(
        {"kind": "RayJob", "metadata": {"name": "demo-a1"}, "spec": {"suspend": False},
         "status": {"jobStatus": job_status, "jobDeploymentStatus": deployment,
                    "reason": reason}}
    )  # fmt: skip


ADMITTED = (cond("QuotaReserved"), cond("Admitted"))


QUOTA_MSG = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu"
    " in flavor h100, 8 more needed"
)
