"""Which pods are a run's (review 3, finding 10): the labels say where to look, the controller
chain decides (`owners`), the same rule for live logs (`logs.attempt_pods`) and log keeping
(`keeping.LogKeeper`) as for run tokens and the reconciler's snapshot."""

from __future__ import annotations

import datetime as dt
import typing
from typing import Any

import pytest

from controller import leading, marks, metrics
from controller.runs import keeping, logs, objects, owners
from tests import support

RUN = objects.RunRef(name="mnist", namespace="team", uid="run-uid")
JOB_UID = "job-uid"
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _ref(kind: str, name: str, uid: str, *, controller: bool = True) -> dict[str, Any]:
    return {"kind": kind, "name": name, "uid": uid, "controller": controller}


def _pod(name: str, owners_: list[dict[str, Any]], *, namespace: str = "team",
         container: str = "main") -> dict[str, Any]:  # fmt: skip
    """A running pod with attempt 2 of run mnist's labels."""
    labels = {marks.RUN_LABEL: "mnist", marks.ATTEMPT_LABEL: "2"}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "ownerReferences": owners_, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": "n0", "containers": [{"name": container}]},
        "status": {"phase": "Running", "startTime": "2026-01-01T00:00:01Z"},
    }  # fmt: skip


def _attempt(kind: str = "Job", *, uid: str = JOB_UID, owner: dict[str, Any] | None = None,
             status: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    ref = _ref("TauRun", "mnist", RUN.uid) if owner is None else owner
    return {"kind": kind, "metadata": {"name": "mnist-a2", "namespace": "team", "uid": uid,
                                       "labels": {marks.RUN_LABEL: "mnist"},
                                       "ownerReferences": [ref]},
            "status": status or {}}  # fmt: skip


REAL = _pod("mnist-a2-real", [_ref("Job", "mnist-a2", JOB_UID)])
LOOK_ALIKES = [
    _pod("bare", []),
    _pod("by-the-taurun", [_ref("TauRun", "mnist", RUN.uid)]),
    _pod("forged-uid", [_ref("Job", "mnist-a2", "forged")]),
    _pod("not-controller", [_ref("Job", "mnist-a2", JOB_UID, controller=False)]),
    _pod("another-namespace", [_ref("Job", "mnist-a2", JOB_UID)], namespace="elsewhere"),
]
RAYJOB = _attempt("RayJob", uid="rayjob-uid", status={"rayClusterName": "mnist-a2-rc"})
RAY_HEAD = _pod("mnist-a2-head", [_ref("RayCluster", "mnist-a2-rc", "rc-uid")])
SUBMITTER = _attempt("Job", uid="submitter-uid", owner=_ref("RayJob", "mnist-a2", "rayjob-uid"))
"""KubeRay's submitter Job, named as the RayJob and controlled by it: no attempt of the run."""


@pytest.mark.parametrize(
    ("pods", "attempt_objects", "expected"),
    [
        pytest.param([*LOOK_ALIKES, REAL], [_attempt()], ["mnist-a2-real"],
                     id="only the pod the attempt's Job controls"),
        pytest.param([REAL, *LOOK_ALIKES], [], [], id="no attempt object: no pod"),
        pytest.param([REAL], [_attempt(owner=_ref("TauRun", "mnist", "old-uid"))], [],
                     id="a Job of an earlier run of the name owns no pod of this one"),
        pytest.param([RAY_HEAD, REAL, *LOOK_ALIKES], [SUBMITTER, RAYJOB], ["mnist-a2-head"],
                     id="ray: the RayCluster its RayJob names; the submitter Job is not it"),
        pytest.param([RAY_HEAD], [_attempt("RayJob", uid="rayjob-uid")], [],
                     id="ray: a RayJob naming no cluster yet owns no pod"),
    ],
)  # fmt: skip
def test_only_pods_the_attempt_controls_are_the_runs(
    pods: list[dict[str, Any]], attempt_objects: list[dict[str, Any]], expected: list[str]
) -> None:
    found = owners.owned_pods(pods, attempt_objects, run=RUN, attempt=2)
    assert [p["metadata"]["name"] for p in found] == expected


def test_fault_names_what_the_pod_is_not_controlled_by() -> None:
    """None for the run's pod; the attempt's Job for a look-alike; the object itself when
    the attempt has none that is the run's."""
    expected = (None, "Job mnist-a2", "object mnist-a2")
    actual = (
        owners.fault(REAL, _attempt(), run=RUN, attempt=2),
        owners.fault(LOOK_ALIKES[0], _attempt(), run=RUN, attempt=2),
        owners.fault(REAL, None, run=RUN, attempt=2),
    )
    assert expected == actual


# ---------------------------------------------------------------- live logs


class PodStore:
    """The pods and attempt objects the logs handler reads, counting the reads."""

    def __init__(self, pods: list[dict[str, Any]], attempt: dict[str, Any] | None) -> None:
        self.pods = pods
        self.attempt = attempt
        self.reads: list[tuple[str, str, str]] = []

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        assert selector == f"{marks.RUN_LABEL}=mnist,{marks.ATTEMPT_LABEL}=2"
        return [p for p in self.pods if p["metadata"]["namespace"] == namespace]

    async def read_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append((kind, namespace, name))
        found = self.attempt
        return found if found is not None and found["kind"] == kind else None


TAURUN = {"kind": "TauRun", "metadata": {"name": "mnist", "namespace": "team", "uid": RUN.uid},
          "spec": {"kind": "job"}}  # fmt: skip


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([*LOOK_ALIKES, REAL], ["mnist-a2-real"], id="the real pod, not the others"),
        pytest.param(LOOK_ALIKES, [], id="look-alikes only: no pod (kept log, else 404 NoPod)"),
    ],
)  # fmt: skip
async def test_live_logs_are_read_only_from_the_attempts_own_pods(
    pods: list[dict[str, Any]], expected: list[str]
) -> None:
    """Whatever pods carry the labels, the worker picked is one the attempt's Job controls;
    one read of the Job for the request, not one per pod."""
    store = PodStore(pods, _attempt())
    found = await logs.attempt_pods(store, TAURUN, 2)
    assert ([p["metadata"]["name"] for p in found], store.reads) == (
        expected, [("Job", "team", "mnist-a2")],
    )  # fmt: skip


async def test_live_logs_read_no_attempt_object_when_no_pod_carries_the_labels() -> None:
    store = PodStore([], _attempt())
    assert (await logs.attempt_pods(store, TAURUN, 2), store.reads) == ([], [])


# ---------------------------------------------------------------- log keeping


class LogStore:
    """What the keeper reads and writes, in memory (`keeping.LogStore`)."""

    def __init__(self, pods: list[dict[str, Any]], attempts: list[dict[str, Any]]) -> None:
        run = {**TAURUN, "status": {"phase": "Running", "currentAttempt": 2}}
        self.runs = [run]
        self.pods = pods
        self.attempts = attempts
        self.written: dict[str, dict[str, Any]] = {}
        self.tails: list[str] = []

    async def list_runs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.runs

    async def list_labelled(
        self, kind: str, selector: str, *, field_selector: str = ""
    ) -> list[dict[str, Any]]:
        if kind == "Pod":
            return self.pods
        if kind == "RayJob":
            msg = "the server could not find the requested resource"  # no KubeRay
            raise RuntimeError(msg)
        return [a for a in self.attempts if a["kind"] == kind]

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["metadata"]["namespace"] == namespace]

    async def read_log_tail(
        self, namespace: str, pod: str, container: str, *, tail_lines: int, limit_bytes: int,
        timeout_s: float,
    ) -> bytes:  # fmt: skip
        self.tails.append(pod)
        return f"the log of {pod}\n".encode()

    async def get_run_log(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.written.get(name)

    async def create_run_log(self, body: dict[str, Any]) -> bool:
        name = body["metadata"]["name"]
        if name in self.written:
            return False
        self.written[name] = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
        return True

    async def replace_run_log(self, body: dict[str, Any], resource_version: str) -> bool:
        self.written[body["metadata"]["name"]] = body
        return True


def _keeper(store: LogStore) -> keeping.LogKeeper:
    return keeping.LogKeeper(
        typing.cast("keeping.LogStore", store),
        typing.cast("leading.Elector", support.AlwaysLeading()),
        metrics.make_metrics(),
        manages=lambda _: True,
        clock=lambda: NOW,
    )


def _kept(store: LogStore) -> dict[str, tuple[str, str]]:
    return {n: (o["spec"]["pod"], o["spec"]["log"]) for n, o in store.written.items()}


@pytest.mark.parametrize("final", [False, True], ids=["while running", "at the end"])
async def test_a_look_alike_pods_log_is_never_kept_as_the_runs(final: bool) -> None:
    """A pod with the run's labels made earlier than the run's own (so it would be worker 0)
    is not read and not kept, in the keeper's pass as in `keep_final`: worker 0 is the
    attempt Job's pod."""
    alike = {
        **LOOK_ALIKES[1],
        "metadata": {**LOOK_ALIKES[1]["metadata"], "creationTimestamp": "2025-01-01T00:00:00Z"},
    }
    store = LogStore([alike, REAL], [_attempt()])
    keeper = _keeper(store)
    if final:
        await keeper.keep_final(RUN, [2])
    else:
        await keeper.pass_once()
    expected = ({"mnist-a2-w0": ("mnist-a2-real", "the log of mnist-a2-real\n")},
                ["mnist-a2-real"])  # fmt: skip
    assert expected == (_kept(store), store.tails)


async def test_look_alikes_alone_keep_nothing() -> None:
    """Without the attempt's own pods (or without its Job) nothing is read or kept."""
    outcomes = []
    for attempts in ([_attempt()], []):
        store = LogStore([*LOOK_ALIKES, *([] if attempts else [REAL])], attempts)
        await _keeper(store).pass_once()
        await _keeper(store).keep_final(RUN, [2])
        outcomes.append((_kept(store), store.tails))
    assert outcomes == [({}, []), ({}, [])]
