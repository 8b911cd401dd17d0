"""The run reconciler over an in-memory store: submission, phases, failures, resume."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import json
import typing
from typing import Any

import pytest

from controller import errors, leading, marks, metrics
from controller.kube import informer
from controller.kube import runs as kube_runs
from controller.runs import checkpoints, plans, policy, reconciling, rendering, snapshots, views
from shared import spec as specs
from tests import support
from tests.unit.controller.runs.builders import (
    ADMITTED,
    SPEC,
    T0,
    ts,
)

# ---------------------------------------------------------------- the reconciler, in memory


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386), as the API server applies one to a status."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _uid(kind: str, name: str) -> str:
    """The UID the fake API server gives an object it creates."""
    return f"uid-{kind}-{name}"


def _owner(obj: dict[str, Any]) -> str | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return next((str(r["uid"]) for r in refs if r.get("controller")), None)


class ApiStore:
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
        run["status"] = _merge(run.get("status") or {}, json.loads(json.dumps(status)))
        run["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(run)

    async def create(self, obj: dict[str, Any]) -> bool:
        key = (obj["metadata"]["namespace"], obj["kind"], obj["metadata"]["name"])
        if key in self.objects:
            if _owner(self.objects[key]) != _owner(obj):  # as kube.runs.RunStore.create does
                raise errors.NameTaken(f"{key} is not this run's", field="name")
            return False
        self.objects[key] = copy.deepcopy(obj)
        self.objects[key]["metadata"]["uid"] = _uid(*key[1:])  # as the API server assigns one
        return True

    async def delete(self, kind: str, namespace: str, name: str, *, owner_uid: str) -> bool:
        found = self.objects.get((namespace, kind, name))
        if found is None or _owner(found) != owner_uid:
            return False
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

    async def write_configmap(self, body: dict[str, Any]) -> None:
        key = (body["metadata"]["namespace"], "ConfigMap", body["metadata"]["name"])
        self.objects.setdefault(key, copy.deepcopy(body))["data"].update(body["data"])


class FakeStore(ApiStore):
    """The in-memory store, read as the watch caches serve it (`informer.Informer`): an object
    comes back as the same dict while it stays unchanged, and as a new one once it changed;
    each change (and each object gone from a whole list) is told to the subscribers, as the
    caches tell theirs. The changes are found when a pass lists, which is before it takes its
    queue, as a watch's would have come."""

    def __init__(self) -> None:
        super().__init__()
        self._served: dict[tuple[str, ...], tuple[str, dict[str, Any], Any]] = {}
        self._handlers: list[typing.Callable[[str, informer.Change[Any]], None]] = []
        self._parse: dict[str, typing.Callable[[dict[str, Any]], Any]] = {}
        self.synced = True

    def subscribe(self, handler: typing.Callable[[str, informer.Change[Any]], None]) -> None:
        self._handlers.append(handler)

    def parse_workloads_with(self, view: typing.Callable[[dict[str, Any]], Any]) -> None:
        self._parse["workloads"] = view

    def workload_views(self) -> list[Any] | None:
        return None  # parsed from the list, as before a cache syncs

    def _serve(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        key = (kind, ns, name)
        text = json.dumps(obj, sort_keys=True)
        hit = self._served.get(key)
        if hit is None or hit[0] != text:
            served = copy.deepcopy(obj)
            parse = self._parse.get(kind)
            view = parse(served) if parse is not None else served
            self._tell(kind, f"{ns}/{name}" if ns else name, hit[2] if hit else None, view)
            hit = text, served, view
            self._served[key] = hit
        return hit[1]

    def _tell(self, kind: str, key: str, old: Any, new: Any) -> None:
        for handler in self._handlers:
            handler(kind, informer.Change(key, old, new))

    def _whole(self, kind: str, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Serve a whole list of a kind, telling those gone since the last one."""
        out = [self._serve(kind, o) for o in listed]
        here = {(kind, *snapshots.key(o)) for o in listed}
        for key in [k for k in self._served if k[0] == kind and k not in here]:
            _, _, old = self._served.pop(key)
            self._tell(kind, f"{key[1]}/{key[2]}" if key[1] else key[2], old, None)
        return out

    async def list_runs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        listed = await super().list_runs(namespace)
        if namespace is None:
            return self._whole("TauRun", listed)
        return [self._serve("TauRun", r) for r in listed]

    async def list_labelled(
        self, kind: str, selector: str, *, field_selector: str = ""
    ) -> list[dict[str, Any]]:
        listed = await super().list_labelled(kind, selector, field_selector=field_selector)
        if selector == marks.RUN_LABEL and not field_selector:
            return self._whole(kind, listed)
        return [self._serve(kind, o) for o in listed]

    async def list_kueue(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        listed = await super().list_kueue(plural, namespace)
        if namespace is None:
            return self._whole(plural, listed)
        return [self._serve(plural, o) for o in listed]

    async def list_nodes(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        listed = await super().list_nodes(names)
        if names is None:
            return self._whole("Node", listed)
        return [self._serve("Node", o) for o in listed]


def _reconciler(
    store: FakeStore,
    now: dt.datetime = T0,
    ca_pem: str = "",
    clock: typing.Callable[[], dt.datetime] | None = None,
) -> reconciling.Reconciler:
    return reconciling.Reconciler(
        typing.cast("kube_runs.RunStore", store),
        typing.cast("leading.Elector", support.AlwaysLeading()),
        metrics.make_metrics(),
        rendering.RenderSettings(controller_url="http://taugrid:8080", ca_pem=ca_pem),
        pass_interval_s=1.0,
        ttl_after_finished_s=60.0,
        pod_annotations={"kwok.taugrid.dev/run-for": "5s"},
        resume_priority_class="taugrid-resume",
        clock=clock or (lambda: now),
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
    job = f"demo-a{attempt}"  # the Job controller's pod: controlled by the attempt's Job
    owner = {"kind": "Job", "name": job, "uid": _uid("Job", job), "controller": True}
    return {
        "metadata": {
            "name": f"demo-a{attempt}-x",
            "namespace": "team",
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {"nodeName": node, "containers": [{"name": "main"}]},
        "status": status,
    }


async def test_submission_creates_its_configmap_and_a_suspended_job() -> None:
    """Reconciling a new run creates its checkpoint ConfigMap (no token Secret: run pods get
    projected tokens) and attempt 1, and says Queued."""
    store = FakeStore()
    store.add_run(SPEC)
    run = await _reconciler(store).reconcile_now("team", "demo")
    assert run is not None
    assert {("ConfigMap", "demo-checkpoint"), ("Job", "demo-a1")} == {
        (k, n) for (_, k, n) in store.objects
    }
    job = store.objects[("team", "Job", "demo-a1")]
    assert job["spec"]["suspend"] is True
    assert job["spec"]["template"]["metadata"]["annotations"] == {"kwok.taugrid.dev/run-for": "5s"}
    assert (run["status"]["phase"], run["status"]["currentAttempt"]) == ("Queued", 1)


async def test_a_name_held_by_somebody_elses_object_ends_the_run_and_leaves_it_alone() -> None:
    """A Job `demo-a1` made by someone else (review M4): the run ends Failed NameTaken naming
    it, and the Job is neither written into nor, after the TTL, deleted."""
    store = FakeStore()
    store.add_run(SPEC)
    theirs = {"kind": "Job", "metadata": {"name": "demo-a1", "namespace": "team",
                                          "labels": {"app": "theirs"}}}  # fmt: skip
    store.objects[("team", "Job", "demo-a1")] = copy.deepcopy(theirs)
    run = await _reconciler(store).reconcile_now("team", "demo")
    assert run is not None
    later = _reconciler(store, now=T0 + dt.timedelta(seconds=600))  # past the 60 s TTL
    await later.pass_once()
    assert store.runs[("team", "demo")]["status"]["objectsDeleted"] is True
    expected = ("Failed", "NameTaken", True, theirs)
    actual = (run["status"]["phase"], run["status"]["reason"],
              "is not this run's" in run["status"]["message"],
              store.objects[("team", "Job", "demo-a1")])  # fmt: skip
    assert expected == actual


class RefusingStore(FakeStore):
    """The API server's admission denies every Job (as the chart's policy denies one that
    reads a Secret its namespace does not list)."""

    async def create(self, obj: dict[str, Any]) -> bool:
        if obj["kind"] == "Job":
            msg = (
                "the cluster's admission refused the Job: … denied request: run pods read a Secret"
            )
            raise errors.AdmissionRefused(msg)
        return await super().create(obj)


async def test_a_run_the_clusters_admission_refuses_ends_saying_why() -> None:
    """A kubectl-made run whose Job the admission policy denies ends Failed
    `AdmissionRefused` with the policy's words, instead of asking again on every pass."""
    store = RefusingStore()
    store.add_run(SPEC)
    run = await _reconciler(store).reconcile_now("team", "demo")
    assert run is not None
    expected = ("Failed", "AdmissionRefused", True)
    actual = (run["status"]["phase"], run["status"]["reason"],
              "run pods read a Secret" in run["status"]["message"])  # fmt: skip
    assert expected == actual


async def test_a_checkpoint_outside_the_runs_directory_is_refused_and_not_kept() -> None:
    """A report of `/etc/passwd` or one climbing out with `..` is a 422 naming `path`;
    `/c/./x/../200` is kept as `/c/200`."""
    store = FakeStore()
    await _running_attempt_1(store)
    rec = _reconciler(store)
    refused = []
    for path in ("/etc/passwd", "/c/../etc/passwd", "/cx/1"):
        with pytest.raises(errors.Invalid) as caught:
            await rec.record_checkpoint("team", "demo", checkpoints.Report(1, 1, path))
        refused.append(caught.value.field)
    kept = await rec.record_checkpoint("team", "demo", checkpoints.Report(1, 200, "/c/./x/../200"))
    expected = (["path"] * 3, "/c/200", ["/c/200"])
    actual = (
        refused,
        kept["path"],
        [c["path"] for c in store.runs[("team", "demo")]["status"]["checkpoints"]],
    )
    assert expected == actual


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
        + b"], maxAttempts: " + str(max_attempts).encode() + b"}\ncheckpoint: {dir: /c}\n"
    ).spec  # fmt: skip


CKPT_SPEC = specs.validate_spec({**specs.spec_to_wire(SPEC), "checkpoint": {"dir": "/c"}}).spec
"""SPEC with a checkpoint directory: reports must lie under it (DESIGN.md section 10)."""


async def _running_attempt_1(store: FakeStore, spec: specs.TauSpec = CKPT_SPEC) -> None:
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
    store.add_run(CKPT_SPEC)
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


def _look_alike(name: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
    """A pod somebody else made in the run's namespace with attempt 1's labels: Failed with
    a SIGTERM on the quarantined node (what a node failure looks like), its image another."""
    pod = _raw_pod("Failed", node="bad", exit_code=143)
    pod["metadata"].update(name=name, ownerReferences=owners)
    pod["status"]["containerStatuses"][0]["imageID"] = "theirs@sha256:2"
    return pod


def _controlled_by(kind: str, name: str, uid: str) -> list[dict[str, Any]]:
    return [{"kind": kind, "name": name, "uid": uid, "controller": True}]


LOOK_ALIKES = [
    _look_alike("labels-only", []),
    _look_alike("owned-by-the-taurun", _controlled_by("TauRun", "demo", "u1")),
    _look_alike("forged-job-uid", _controlled_by("Job", "demo-a1", "forged")),
    _look_alike("another-job", _controlled_by("Job", "theirs", _uid("Job", "demo-a1"))),
]


async def test_a_look_alike_pod_counts_in_neither_status_nor_failure_nor_evidence() -> None:
    """Review 3, finding 10: pods with the run's labels that attempt 1's Job does not
    control (bare, owned by the TauRun, the Job's name with another UID, another Job),
    Failed on a quarantined node, change nothing: the run stays Running on attempt 1, no
    attempt 2, and the evidence names only the real pod's node and image."""
    store = FakeStore()
    await _running_attempt_1(store)
    store.pods = [_raw_pod("Running"), *LOOK_ALIKES]
    rec = _reconciler(store)
    await rec.pass_once()
    urgent = await rec.snapshot_of_run("team", "demo")
    status = store.runs[("team", "demo")]["status"]
    evidence = status["evidence"]
    seen = rec.run_input(store.runs[("team", "demo")], urgent, None).pods
    expected: tuple[Any, ...] = ("Running", 1, False, ["n0"], ["n0"], [], ["demo-a1-x"])
    actual = (
        status["phase"],
        status["currentAttempt"],
        ("team", "Job", "demo-a2") in store.objects,
        evidence["nodes"],
        evidence["attempts"][0]["nodes"],
        evidence["attempts"][0].get("exitCodes", []),
        [p.name for p in seen],
    )
    assert expected == actual
    # The same pods, the real one Failed there too: now it is a node failure, attempt 2.
    store.pods = [_raw_pod("Failed", node="bad", exit_code=143), *LOOK_ALIKES]
    await _reconciler(store).pass_once()
    assert store.runs[("team", "demo")]["status"]["currentAttempt"] == 2


async def test_a_failed_run_resumes_by_hand_from_a_named_checkpoint() -> None:
    """`tau resume demo --checkpoint P`: attempt 2 starts from P; a running run refuses."""
    store = FakeStore()
    await _running_attempt_1(store)
    rec = _reconciler(store)
    with pytest.raises(errors.Conflict):
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


async def test_an_event_and_a_timer_tick_decide_alike() -> None:
    """Level-triggered: the input a full pass reads (timer) and the one an urgent reconcile
    reads (event: a quarantined node) agree on everything the run's pods touch, so their
    plans are the same."""
    store = FakeStore()
    await _running_attempt_1(store)
    await _reconciler(store).record_checkpoint("team", "demo", checkpoints.Report(1, 200, "/c/2"))
    store.pods = [_raw_pod("Failed", node="bad", exit_code=143)]
    rec = _reconciler(store)
    item = await store.get_run("team", "demo")
    assert item is not None
    classes = frozenset(store.priority_classes)
    on_timer = rec.run_input(item, await rec.snapshot(), classes)
    on_event = rec.run_input(item, await rec.snapshot_of_run("team", "demo"), classes)
    # The event reads only the nodes its pods are on; the rest of the input is the same.
    on_node = {p.node for p in on_timer.pods}
    none = views.NodeFacts(frozenset())
    assert dataclasses.replace(on_timer, nodes=none) == dataclasses.replace(on_event, nodes=none)
    assert on_node <= on_event.nodes.existing
    timer_plan = policy.decide_run(on_timer, rec.settings, T0)
    event_plan = policy.decide_run(on_event, rec.settings, T0)
    assert (timer_plan.status, timer_plan.creates, timer_plan.deletes) == (
        event_plan.status, event_plan.creates, event_plan.deletes,
    )  # fmt: skip
    assert (
        timer_plan.status.current_attempt, (timer_plan.deletes[0].kind, timer_plan.deletes[0].name)
    ) == (2, ("Job", "demo-a1"))  # fmt: skip


async def test_a_finished_run_is_decided_again_only_when_its_taurun_changes_or_its_ttl_comes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass skips a settled run (`policy.settled`: finished, nothing to write) while its
    TauRun keeps its resourceVersion; a change to the TauRun, or its TTL coming, gets it
    decided again, and after the TTL its objects go as before."""
    store = FakeStore()
    await _running_attempt_1(store)
    store.objects[("team", "Job", "demo-a1")]["status"] = {"conditions": [
        {"type": "Complete", "status": "True", "lastTransitionTime": ts(8)}]}  # fmt: skip
    store.pods = [_raw_pod("Succeeded", exit_code=0)]
    clock = [T0 + dt.timedelta(seconds=10)]
    rec = _reconciler(store, clock=lambda: clock[0])
    decided: list[str] = []
    real = policy.decide_run

    def counting(run: plans.RunInput, *args: Any) -> plans.RunPlan:
        decided.append(str(run.status.phase))
        return real(run, *args)

    monkeypatch.setattr(policy, "decide_run", counting)
    seen = []
    for step in ("ends it", "settles it", "skips", "skips", "changed", "skips", "ttl"):
        if step == "changed":
            store.runs[("team", "demo")]["metadata"]["resourceVersion"] = "900"
        if step == "ttl":
            clock[0] = T0 + dt.timedelta(seconds=200)
        decided.clear()
        await rec.pass_once()
        seen.append((step, len(decided)))
    status = store.runs[("team", "demo")]["status"]
    expected = [("ends it", 1), ("settles it", 1), ("skips", 0), ("skips", 0), ("changed", 1),
                ("skips", 0), ("ttl", 1)]  # fmt: skip
    assert expected == seen
    assert (status["phase"], status.get("objectsDeleted")) == ("Succeeded", True)
    assert ("team", "Job", "demo-a1") not in store.objects
