"""The run reconciler over an in-memory store: submission, phases, failures, resume."""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import json
import typing
from typing import Any

import pytest

from controller import leading, marks, metrics
from controller.kube import runs as kube_runs
from controller.runs import checkpoints, reconciling, rendering
from shared import spec as specs
from tests.unit.controller.runs.builders import (
    ADMITTED,
    QUOTA_MSG,
    SPEC,
    T0,
    cond,
    ts,
)

# ---------------------------------------------------------------- the reconciler, in memory


class FakeStore:
    """An in-memory API server holding what the reconciler reads and writes."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str], dict[str, Any]] = {}
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.workloads: list[dict[str, Any]] = []
        self.pods: list[dict[str, Any]] = []
        self.nodes: list[dict[str, Any]] = [
            {"metadata": {"name": "n0"}},
            {
                "metadata": {
                    "name": "bad",
                    "annotations": {marks.QUARANTINED_BY_ANNOTATION: "x"},
                }
            },
        ]
        self.local_queues = [{"metadata": {"name": "q", "namespace": "team"},
                              "spec": {"clusterQueue": "cq"}}]  # fmt: skip
        self.priority_classes = ["taugrid-resume"]
        self.lists: list[tuple[str, str, str]] = []
        self.rv = 1

    def admit(self, *conds: dict[str, Any]) -> None:
        """What Kueue does on admission: the Workload is admitted, the Job unsuspended."""
        self.workloads = [_raw_workload(*ADMITTED, *conds)]
        for (_, kind, _), obj in self.objects.items():
            if kind == "Job":
                obj["spec"]["suspend"] = False

    def add_run(self, spec: specs.TauSpec, annotations: dict[str, str] | None = None) -> None:
        self.runs[("team", spec.name)] = {
            "metadata": {"name": spec.name, "namespace": "team", "uid": "u1",
                         "resourceVersion": "1", "annotations": annotations or {}},
            "spec": specs.spec_to_wire(spec),
        }  # fmt: skip

    async def list_runs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(r) for r in self.runs.values()]

    async def get_run(self, namespace: str, name: str) -> dict[str, Any] | None:
        run = self.runs.get((namespace, name))
        return copy.deepcopy(run) if run else None

    async def patch_run_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any] | None:
        run = self.runs[(namespace, name)]
        self.rv += 1
        run["status"] = json.loads(json.dumps({k: v for k, v in status.items() if v is not None}))
        run["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(run)

    async def create(self, obj: dict[str, Any]) -> bool:
        key = (obj["metadata"]["namespace"], obj["kind"], obj["metadata"]["name"])
        if key in self.objects:
            return False
        self.objects[key] = copy.deepcopy(obj)
        return True

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        return self.objects.pop((namespace, kind, name), None) is not None

    async def list_labelled(
        self, kind: str, selector: str, *, field_selector: str = ""
    ) -> list[dict[str, Any]]:
        self.lists.append((kind, selector, field_selector))
        if kind == "Pod":
            node = field_selector.removeprefix("spec.nodeName=")
            return [copy.deepcopy(p) for p in self.pods
                    if not field_selector or p["spec"]["nodeName"] == node]  # fmt: skip
        return [copy.deepcopy(o) for (_, k, _), o in self.objects.items() if k == kind]

    async def list_kueue(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        if plural == "workloadpriorityclasses":
            return [{"metadata": {"name": n}} for n in self.priority_classes]
        return copy.deepcopy(self.workloads if plural == "workloads" else self.local_queues)

    async def list_nodes(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        return [n for n in self.nodes if names is None or n["metadata"]["name"] in names]

    async def pending_workloads(self, namespace: str, queue: str) -> None:
        return None

    async def annotate_run(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> dict[str, Any] | None:
        meta = self.runs[(namespace, name)]["metadata"]
        for key, value in annotations.items():
            if value is None:
                meta["annotations"].pop(key, None)
            else:
                meta["annotations"][key] = value
        return copy.deepcopy(self.runs[(namespace, name)])

    async def write_secret(self, body: dict[str, Any]) -> None:
        key = (body["metadata"]["namespace"], "Secret", body["metadata"]["name"])
        self.objects[key] = copy.deepcopy(body)

    async def write_configmap(self, body: dict[str, Any]) -> None:
        key = (body["metadata"]["namespace"], "ConfigMap", body["metadata"]["name"])
        self.objects.setdefault(key, copy.deepcopy(body))["data"].update(body["data"])


class FakeElector:
    """Always the leader."""

    def is_leader(self) -> bool:
        return True

    def ensure_leader(self) -> None:
        return None


def _reconciler(
    store: FakeStore, now: dt.datetime = T0, ca_pem: str = ""
) -> reconciling.Reconciler:
    return reconciling.Reconciler(
        typing.cast("kube_runs.RunStore", store),
        typing.cast("leading.Elector", FakeElector()),
        metrics.make_metrics(),
        rendering.RenderSettings(controller_url="http://taugrid:8080", ca_pem=ca_pem),
        pass_interval_s=1.0,
        ttl_after_finished_s=60.0,
        pod_annotations={"kwok.taugrid.dev/run-for": "5s"},
        resume_priority_class="taugrid-resume",
        clock=lambda: now,
    )


def _raw_workload(
    *conds: dict[str, Any], job: str = "demo-a1", msg_cq: str = "cq"
) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conds)}
    if any(c["type"] == "Admitted" for c in conds):
        status["admission"] = {"clusterQueue": msg_cq, "podSetAssignments": [
            {"name": "main", "flavors": {"nvidia.com/gpu": "h100"}}]}  # fmt: skip
    return {"metadata": {"name": f"job-{job}", "namespace": "team", "creationTimestamp": ts(0),
                         "ownerReferences": [{"kind": "Job", "name": job}]},
            "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 1}]},
            "status": status}  # fmt: skip


def _raw_pod(phase: str, *, node: str = "n0", exit_code: int | None = None, attempt: int = 1
             ) -> dict[str, Any]:  # fmt: skip
    status: dict[str, Any] = {"phase": phase, "startTime": ts(2)}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "main", "imageID": "img@sha256:1", "state": {
            "terminated": {"exitCode": exit_code, "finishedAt": ts(8)}}}]  # fmt: skip
    labels = {marks.RUN_LABEL: "demo", marks.ATTEMPT_LABEL: str(attempt)}
    return {
        "metadata": {"name": f"demo-a{attempt}-x", "namespace": "team", "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main"}]},
        "status": status,
    }


async def test_submission_creates_secret_configmap_and_a_suspended_job() -> None:
    """Reconciling a new run creates its per-run objects and attempt 1, and says Queued."""
    store = FakeStore()
    store.add_run(SPEC)
    run = await _reconciler(store).reconcile_now("team", "demo")
    assert run is not None
    assert {("Secret", "demo-token"), ("ConfigMap", "demo-checkpoint"), ("Job", "demo-a1")} == {
        (k, n) for (_, k, n) in store.objects
    }
    job = store.objects[("team", "Job", "demo-a1")]
    assert job["spec"]["suspend"] is True
    assert job["spec"]["template"]["metadata"]["annotations"] == {"kwok.taugrid.dev/run-for": "5s"}
    assert (run["status"]["phase"], run["status"]["currentAttempt"]) == ("Queued", 1)


async def test_a_run_goes_from_queued_to_succeeded_and_its_job_goes_after_the_ttl() -> None:
    """Pass by pass: waiting with a position and reason, running, succeeded, cleaned up."""
    store = FakeStore()
    store.add_run(SPEC)
    await _reconciler(store).reconcile_now("team", "demo")
    store.workloads = [_raw_workload(cond("QuotaReserved", "False", "Pending", QUOTA_MSG))]
    await _reconciler(store).pass_once()
    status = store.runs[("team", "demo")]["status"]
    assert (
        status["phase"],
        status["queuePosition"],
        status["queuePositionSource"],
    ) == ("Queued", 0, "computed")
    assert status["message"].startswith("waiting for quota")

    store.admit(cond("PodsReady", at=3))
    store.pods = [_raw_pod("Running")]
    await _reconciler(store, T0 + dt.timedelta(seconds=4)).pass_once()
    status = store.runs[("team", "demo")]["status"]
    assert (status["phase"], status["message"]) == ("Running", "")
    assert "queuePosition" not in status

    job = store.objects[("team", "Job", "demo-a1")]
    job["status"] = {"conditions": [cond("Complete")]}
    store.pods = [_raw_pod("Succeeded", exit_code=0)]
    await _reconciler(store, T0 + dt.timedelta(seconds=10)).pass_once()
    status = store.runs[("team", "demo")]["status"]
    assert [c["type"] for c in status["conditions"]] == [
        "Queued",
        "Admitted",
        "Running",
        "Succeeded",
    ]
    assert (
        status["evidence"]["kueue"]["clusterQueue"], status["evidence"]["nodes"],
        status["evidence"]["imageID"],
    ) == ("cq", ["n0"], "img@sha256:1")  # fmt: skip
    await _reconciler(store, T0 + dt.timedelta(seconds=100)).pass_once()
    assert ("team", "Job", "demo-a1") not in store.objects
    assert store.runs[("team", "demo")]["status"]["phase"] == "Succeeded"


async def test_a_node_failure_ends_the_attempt_and_starts_the_next() -> None:
    """A pod lost with a quarantined node: attempt 1 is deleted, attempt 2 created with
    the failure reason in its env."""
    store = FakeStore()
    store.add_run(SPEC)
    await _reconciler(store).reconcile_now("team", "demo")
    store.admit()
    store.pods = [_raw_pod("Failed", node="bad", exit_code=143)]
    await _reconciler(store).pass_once()
    status = store.runs[("team", "demo")]["status"]
    assert (status["currentAttempt"], status["phase"]) == (2, "Queued")
    assert status["attempts"][0]["failureClass"] == "NodeFailure"
    assert ("team", "Job", "demo-a1") not in store.objects
    env = store.objects[("team", "Job", "demo-a2")]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "TAU_FAILURE_REASON", "value": "NodeFailure"} in env["env"]


async def test_an_app_error_is_final_by_default() -> None:
    """A non-zero exit code is not retried unless retry.when lists AppError."""
    store = FakeStore()
    store.add_run(SPEC)
    await _reconciler(store).reconcile_now("team", "demo")
    store.admit()
    store.pods = [_raw_pod("Failed", exit_code=3)]
    await _reconciler(store).pass_once()
    status = store.runs[("team", "demo")]["status"]
    assert (
        status["phase"],
        status["reason"],
        status["attempts"][0]["exitCodes"],
    ) == ("Failed", "AppError", [3])


async def test_cancel_deletes_the_attempt_and_keeps_the_run() -> None:
    """The cancel annotation deletes the Job (freeing quota) and ends the run Cancelled."""
    store = FakeStore()
    store.add_run(SPEC)
    await _reconciler(store).reconcile_now("team", "demo")
    store.runs[("team", "demo")]["metadata"]["annotations"][marks.CANCEL_ANNOTATION] = "me"
    run = await _reconciler(store).reconcile_now("team", "demo")
    assert run is not None
    assert run["status"]["phase"] == "Cancelled"
    assert ("team", "Job", "demo-a1") not in store.objects


async def test_a_reconciler_leaves_runs_of_another_manager_alone() -> None:
    """Runs stamped with another manager's name are not touched (a canary or a test)."""
    store = FakeStore()
    store.add_run(SPEC, annotations={marks.MANAGED_BY_ANNOTATION: "someone-else"})
    await _reconciler(store).pass_once()
    await _reconciler(store).reconcile_now("team", "demo")
    assert "status" not in store.runs[("team", "demo")]
    assert store.objects == {}


# ---------------------------------------------------------------- resilience


def _env(store: FakeStore, job: str) -> dict[str, str]:
    container = store.objects[("team", "Job", job)]["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _retrying(when: str, max_attempts: int = 3) -> specs.TauSpec:
    return specs.parse_spec(
        b"name: demo\nimage: reg/train@sha256:" + b"a" * 64 + b"\ncommand: [python, t.py]\n"
        b"resources: {gpus: 8}\nqueue: q\nretry: {when: [" + when.encode()
        + b"], maxAttempts: " + str(max_attempts).encode() + b"}\n"
    ).spec  # fmt: skip


async def _running_attempt_1(store: FakeStore, spec: specs.TauSpec = SPEC) -> None:
    store.add_run(spec)
    await _reconciler(store).reconcile_now("team", "demo")
    store.admit()
    store.pods = [_raw_pod("Running")]
    await _reconciler(store).pass_once()


async def test_checkpoints_are_kept_and_written_to_the_file_the_pods_read() -> None:
    """A report lands in status.checkpoints and in the ConfigMap mounted into the pods."""
    store = FakeStore()
    await _running_attempt_1(store)
    rec = _reconciler(store)
    for step in (100, 200):
        await rec.record_checkpoint("team", "demo", checkpoints.Report(1, step, f"/c/{step}"))
    status = store.runs[("team", "demo")]["status"]
    assert [c["step"] for c in status["checkpoints"]] == [100, 200]
    assert store.objects[("team", "ConfigMap", "demo-checkpoint")]["data"]["latest"] == "/c/200"
    with pytest.raises(checkpoints.FencedError):
        await rec.record_checkpoint("team", "demo", checkpoints.Report(2, 300, "/c/300"))


CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


async def test_the_checkpoint_configmap_carries_the_controllers_ca_through_reports() -> None:
    """With a CA, the per-run ConfigMap is created holding it under `ca.crt` (the file the
    Job's TAU_CA_FILE names); a checkpoint's patch keeps it, and a map deleted meanwhile is
    re-created with it."""
    store = FakeStore()
    store.add_run(SPEC)
    rec = _reconciler(store, ca_pem=CA_PEM)
    await rec.reconcile_now("team", "demo")
    key = ("team", "ConfigMap", "demo-checkpoint")
    created = dict(store.objects[key]["data"])
    await rec.record_checkpoint("team", "demo", checkpoints.Report(1, 100, "/c/100"))
    patched = dict(store.objects[key]["data"])
    del store.objects[key]
    await rec.record_checkpoint("team", "demo", checkpoints.Report(1, 200, "/c/200"))
    recreated = store.objects[key]["data"]
    expected = ({"latest": "", "ca.crt": CA_PEM}, (CA_PEM, "/c/100"), (CA_PEM, "/c/200"),
                "/var/run/taugrid/checkpoint/ca.crt")  # fmt: skip
    actual = (
        created,
        (patched["ca.crt"], patched["latest"]),
        (recreated["ca.crt"], recreated["latest"]),
        _env(store, "demo-a1")["TAU_CA_FILE"],
    )
    assert expected == actual


async def test_without_a_ca_the_run_objects_name_none() -> None:
    """No CA configured: no `ca.crt` key and no TAU_CA_FILE (the pods' system store)."""
    store = FakeStore()
    store.add_run(SPEC)
    await _reconciler(store).reconcile_now("team", "demo")
    expected = ({"latest": ""}, False)
    actual = (store.objects[("team", "ConfigMap", "demo-checkpoint")]["data"],
              "TAU_CA_FILE" in _env(store, "demo-a1"))  # fmt: skip
    assert expected == actual


async def test_after_a_node_failure_the_next_attempt_resumes_ahead_in_line() -> None:
    """Attempt 2 gets TAU_RESUME_FROM = the latest checkpoint and the resume priority class;
    attempt 1's late reports are refused from then on."""
    store = FakeStore()
    await _running_attempt_1(store)
    await _reconciler(store).record_checkpoint("team", "demo", checkpoints.Report(1, 200, "/c/2"))
    store.pods = [_raw_pod("Failed", node="bad", exit_code=143)]
    await _reconciler(store).pass_once()
    env = _env(store, "demo-a2")
    assert (env["TAU_RESUME_FROM"], env["TAU_ATTEMPT"], env["TAU_FAILURE_REASON"]) == (
        "/c/2", "2", "NodeFailure",
    )  # fmt: skip
    labels = store.objects[("team", "Job", "demo-a2")]["metadata"]["labels"]
    assert labels[marks.PRIORITY_CLASS_LABEL] == "taugrid-resume"
    with pytest.raises(checkpoints.FencedError) as err:
        await _reconciler(store).record_checkpoint("team", "demo", checkpoints.Report(1, 250, "/x"))
    assert err.value.reason == "StaleAttempt"


async def test_a_missing_resume_class_leaves_the_priority_alone() -> None:
    """Naming a WorkloadPriorityClass that does not exist would strand the Job: skip it."""
    store = FakeStore()
    store.priority_classes = []
    await _running_attempt_1(store)
    store.pods = [_raw_pod("Failed", node="bad", exit_code=143)]
    await _reconciler(store).pass_once()
    labels = store.objects[("team", "Job", "demo-a2")]["metadata"]["labels"]
    assert marks.PRIORITY_CLASS_LABEL not in labels


@pytest.mark.parametrize(
    ("when", "exit_code", "node", "phase"),
    [
        ("AppError", 3, "n0", "Queued"),
        ("NodeFailure", 3, "n0", "Failed"),
        ("AppError", 143, "gone", "Failed"),
    ],
)
async def test_the_retry_policy_decides_by_failure_class(
    when: str, exit_code: int, node: str, phase: str
) -> None:
    """AppError is retried only when retry.when lists it; a pod on a vanished node is a
    NodeFailure, which a `when` without NodeFailure does not retry."""
    store = FakeStore()
    spec = _retrying(when)
    await _running_attempt_1(store, spec)
    store.pods = [_raw_pod("Failed", node=node, exit_code=exit_code)]
    await _reconciler(store).pass_once()
    status = store.runs[("team", "demo")]["status"]
    assert status["phase"] == phase, status["message"]
    if phase == "Failed":
        assert "not retried" in status["message"]


async def test_max_attempts_is_honoured() -> None:
    """With maxAttempts 2 the second NodeFailure ends the run, saying why."""
    store = FakeStore()
    await _running_attempt_1(store, _retrying("NodeFailure", max_attempts=2))
    store.pods = [_raw_pod("Failed", node="bad", exit_code=143)]
    await _reconciler(store).pass_once()
    store.admit()
    for (_, kind, name), obj in store.objects.items():
        if kind == "Job" and name == "demo-a2":
            obj["spec"]["suspend"] = False
    store.workloads = [_raw_workload(*ADMITTED, job="demo-a2")]
    store.pods = [_raw_pod("Failed", node="bad", exit_code=143, attempt=2)]
    await _reconciler(store).pass_once()
    status = store.runs[("team", "demo")]["status"]
    assert (status["phase"], status["currentAttempt"]) == ("Failed", 2)
    assert "all 2 of retry.maxAttempts=2 used" in status["message"]


async def test_a_failed_run_resumes_by_hand_from_a_named_checkpoint() -> None:
    """`tau resume demo --checkpoint P`: attempt 2 starts from P; a running run refuses."""
    store = FakeStore()
    await _running_attempt_1(store)
    rec = _reconciler(store)
    with pytest.raises(reconciling.ResumeRefusedError):
        await rec.request_resume("team", "demo", checkpoint=None, by="ada")
    store.pods = [_raw_pod("Failed", exit_code=3)]
    await rec.pass_once()
    assert store.runs[("team", "demo")]["status"]["phase"] == "Failed"
    run = await rec.request_resume("team", "demo", checkpoint="/c/100", by="ada")
    status = run["status"]
    assert (status["phase"], status["currentAttempt"], status["attemptBudgetFrom"]) == (
        "Queued", 2, 1,
    )  # fmt: skip
    assert "endTime" not in status
    assert _env(store, "demo-a2")["TAU_RESUME_FROM"] == "/c/100"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("False", "Resumed")


async def test_a_cancelled_run_resumes_and_stays_resumed() -> None:
    """Resuming clears the cancel request, so the next pass does not cancel it again."""
    store = FakeStore()
    store.add_run(SPEC)
    await _reconciler(store).reconcile_now("team", "demo")
    store.runs[("team", "demo")]["metadata"]["annotations"][marks.CANCEL_ANNOTATION] = "me"
    await _reconciler(store).reconcile_now("team", "demo")
    await _reconciler(store).request_resume("team", "demo", checkpoint=None, by="ada")
    await _reconciler(store).pass_once()
    status = store.runs[("team", "demo")]["status"]
    assert (status["phase"], status["currentAttempt"]) == ("Queued", 2)
    assert _env(store, "demo-a2")["TAU_FAILURE_REASON"] == "Cancelled"


async def test_a_quarantined_node_resumes_its_runs_without_a_full_pass() -> None:
    """`urgent(node)` reconciles just the runs with pods on that node, from their own
    snapshot (no cluster-wide list), and the next attempt exists when it returns."""
    store = FakeStore()
    await _running_attempt_1(store)
    store.nodes.append(
        {
            "metadata": {
                "name": "n0",
                "annotations": {
                    marks.QUARANTINED_BY_ANNOTATION: "t",
                    marks.QUARANTINE_ANNOTATION: '{"failed":true}',
                },
            }
        }
    )
    store.nodes = store.nodes[1:]  # n0 is now the quarantined one
    store.lists.clear()
    rec = _reconciler(store)
    rec.urgent("n0")
    await asyncio.gather(*rec._urgent)  # wait for the background reconcile
    status = store.runs[("team", "demo")]["status"]
    assert (status["currentAttempt"], status["attempts"][0]["failureClass"]) == (2, "NodeFailure")
    assert ("team", "Job", "demo-a2") in store.objects
    assert ("Pod", marks.RUN_LABEL, "spec.nodeName=n0") in store.lists
    assert all(sel != marks.RUN_LABEL or field for _, sel, field in store.lists), store.lists
