"""Runs, computed: phase, failure class, queue position, waiting message, evidence."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import importlib.machinery
import json
import pathlib
import subprocess
import types
import typing
from typing import Any

import pytest

from controller import checkpoints, leading, metrics, reconciling, rendering, runs
from controller.kube import runs as kube_runs
from shared import spec as specs

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NODES = runs.NodeFacts(existing=frozenset({"n0", "n1", "bad"}), quarantined=frozenset({"bad"}))
SPEC = specs.parse_spec(
    b"name: demo\nimage: reg/train@sha256:" + b"a" * 64 + b"\ncommand: [python, t.py]\n"
    b"resources: {gpus: 8}\nqueue: q\nexperiment: {project: p}\n"
).spec


def _ts(seconds: float) -> str:
    return runs.iso(T0 + dt.timedelta(seconds=seconds)) or ""


def _cond(kind: str, status: str = "True", reason: str = "", message: str = "", at: float = 0
          ) -> dict[str, Any]:  # fmt: skip
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": _ts(at)}  # fmt: skip


def _workload(
    *conds: dict[str, Any],
    name: str = "job-demo-a1-x",
    ns: str = "team",
    queue: str = "q",
    priority: int = 0,
    created: float = 0,
    active: bool = True,
    cq: str = "",
) -> runs.WorkloadView:
    status: dict[str, Any] = {"conditions": list(conds)}
    if cq:
        status["admission"] = {
            "clusterQueue": cq,
            "podSetAssignments": [{"name": "main", "flavors": {"nvidia.com/gpu": "h100"}}],
        }
    return runs.parse_workload(
        {
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": _ts(created),
                         "ownerReferences": [{"kind": "Job", "name": "demo-a1"}]},
            "spec": {"queueName": queue, "priority": priority, "active": active,
                     "podSets": [{"name": "main", "count": 1}]},
            "status": status,
        }
    )  # fmt: skip


def _pod(
    name: str = "demo-a1-abc",
    *,
    phase: str = "Running",
    node: str = "n0",
    exit_code: int | None = None,
    reason: str = "",
    disruption: str = "",
) -> runs.PodView:
    status: dict[str, Any] = {"phase": phase, "startTime": _ts(1), "conditions": []}
    if exit_code is not None:
        status["containerStatuses"] = [
            {"name": "main", "image": "img", "imageID": "reg/train@sha256:abc",
             "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                      "finishedAt": _ts(9)}}}
        ]  # fmt: skip
    if disruption:
        status["conditions"].append(_cond("DisruptionTarget", reason=disruption))
    return runs.parse_pod(
        {"metadata": {"name": name, "labels": {runs.LABEL_ATTEMPT: "1"}},
         "spec": {"nodeName": node, "containers": [{"name": "main"}]}, "status": status}
    )  # fmt: skip


def _job(*conds: dict[str, Any], suspended: bool = False) -> runs.AttemptObjectView:
    return runs.parse_attempt_object(
        {"kind": "Job", "metadata": {"name": "demo-a1"}, "spec": {"suspend": suspended},
         "status": {"conditions": list(conds)}}
    )  # fmt: skip


def _rayjob(job_status: str, deployment: str, reason: str = "") -> runs.AttemptObjectView:
    return runs.parse_attempt_object(
        {"kind": "RayJob", "metadata": {"name": "demo-a1"}, "spec": {"suspend": False},
         "status": {"jobStatus": job_status, "jobDeploymentStatus": deployment,
                    "reason": reason}}
    )  # fmt: skip


ADMITTED = (_cond("QuotaReserved"), _cond("Admitted"))


@pytest.mark.parametrize(
    ("obj", "workload", "pods", "expected"),
    [
        pytest.param(None, None, [], runs.Phase.QUEUED, id="no object yet is queued"),
        pytest.param(
            _job(suspended=True),
            None,
            [],
            runs.Phase.QUEUED,
            id="a job without a workload is queued",
        ),
        pytest.param(
            _job(suspended=True),
            _workload(_cond("QuotaReserved", "False", "Pending", "insufficient quota")),
            [],
            runs.Phase.QUEUED,
            id="a workload without reserved quota is queued",
        ),
        pytest.param(
            _job(),
            _workload(*ADMITTED),
            [_pod(phase="Pending")],
            runs.Phase.ADMITTED,
            id="an admitted workload with pending pods is admitted",
        ),
        pytest.param(
            _job(),
            _workload(*ADMITTED, _cond("PodsReady")),
            [],
            runs.Phase.RUNNING,
            id="pods ready means running",
        ),
        pytest.param(
            _job(),
            _workload(*ADMITTED),
            [_pod()],
            runs.Phase.RUNNING,
            id="a running pod means running even before PodsReady",
        ),
        pytest.param(
            _job(_cond("Complete")),
            _workload(*ADMITTED, _cond("Finished")),
            [_pod(phase="Succeeded", exit_code=0)],
            runs.Phase.SUCCEEDED,
            id="a complete job succeeded",
        ),
        pytest.param(
            _job(_cond("Failed", reason="BackoffLimitExceeded")),
            _workload(*ADMITTED),
            [_pod(phase="Failed", exit_code=1)],
            runs.Phase.FAILED,
            id="a failed job failed",
        ),
        pytest.param(
            _job(),
            _workload(*ADMITTED),
            [_pod(phase="Failed", exit_code=2)],
            runs.Phase.FAILED,
            id="a failed pod of an admitted job fails the attempt before the job controller does",
        ),
        pytest.param(
            _job(suspended=True),
            _workload(_cond("Evicted", reason="Preempted"), _cond("Requeued")),
            [_pod(phase="Failed", exit_code=143, disruption="PreemptionByKueue")],
            runs.Phase.QUEUED,
            id="kueue preemption suspends the job and is not a failure",
        ),
        pytest.param(
            _rayjob("SUCCEEDED", "Complete"),
            _workload(*ADMITTED),
            [],
            runs.Phase.SUCCEEDED,
            id="a succeeded rayjob succeeded",
        ),
        pytest.param(
            _rayjob("FAILED", "Failed", "AppFailed"),
            _workload(*ADMITTED),
            [],
            runs.Phase.FAILED,
            id="a failed rayjob failed",
        ),
        pytest.param(
            _rayjob("RUNNING", "Running"),
            _workload(*ADMITTED, _cond("PodsReady")),
            [],
            runs.Phase.RUNNING,
            id="a running rayjob with ready pods is running",
        ),
    ],
)
def test_attempt_phase(
    obj: runs.AttemptObjectView | None,
    workload: runs.WorkloadView | None,
    pods: list[runs.PodView],
    expected: runs.Phase,
) -> None:
    """The attempt's phase follows the Workload conditions, then the object and its pods."""
    assert expected == runs.attempt_outcome(obj, workload, pods, NODES).phase


@pytest.mark.parametrize(
    ("pods", "object_reason", "expected"),
    [
        pytest.param(
            [_pod(phase="Failed", node="bad", exit_code=143, disruption="EvictionByEvictionAPI")],
            "",
            specs.FailureClass.NODE_FAILURE,
            id="a pod evicted from a node we quarantined is a node failure",
        ),
        pytest.param(
            [_pod(phase="Failed", node="gone", exit_code=137)],
            "",
            specs.FailureClass.NODE_FAILURE,
            id="a pod whose node vanished is a node failure",
        ),
        pytest.param(
            [_pod(phase="Failed", exit_code=143, disruption="EvictionByEvictionAPI")],
            "",
            specs.FailureClass.EVICTED,
            id="an eviction from a healthy node is evicted",
        ),
        pytest.param(
            [_pod(phase="Failed", exit_code=137, reason="OOMKilled")],
            "",
            specs.FailureClass.OOM_KILLED,
            id="an OOM kill is OOMKilled",
        ),
        pytest.param(
            [_pod(phase="Failed", exit_code=3, reason="Error")],
            "",
            specs.FailureClass.APP_ERROR,
            id="a non-zero exit code is an app error",
        ),
        pytest.param(
            [],
            "DeadlineExceeded",
            specs.FailureClass.TIMEOUT,
            id="a job deadline is a timeout",
        ),
        pytest.param(
            [],
            "",
            specs.FailureClass.UNKNOWN,
            id="a failure without evidence is unknown",
        ),
    ],
)
def test_failure_class(
    pods: list[runs.PodView], object_reason: str, expected: specs.FailureClass
) -> None:
    """Infrastructure causes win over the application's exit code; no evidence is Unknown."""
    failure, message = runs.classify_failure(pods, NODES, object_reason=object_reason)
    assert expected == failure
    assert message


def test_failed_attempt_records_exit_codes_and_nodes() -> None:
    """A failed attempt carries its exit codes, nodes and class into the status record."""
    outcome = runs.attempt_outcome(
        _job(), _workload(*ADMITTED, cq="cq"), [_pod(phase="Failed", exit_code=3)], NODES
    )
    record = runs.attempt_record(
        1, object_kind="Job", object_name="demo-a1", outcome=outcome,
        workload=_workload(*ADMITTED, cq="cq"),
    )  # fmt: skip
    expected = {
        "number": 1, "objectKind": "Job", "objectName": "demo-a1", "phase": "Failed",
        "nodes": ["n0"], "exitCodes": [3], "startTime": _ts(1), "endTime": _ts(9),
        "failureClass": "AppError", "message": "pod demo-a1-abc exited with code 3",
        "workload": "job-demo-a1-x", "clusterQueue": "cq", "flavors": {"nvidia.com/gpu": "h100"},
    }  # fmt: skip
    assert expected == record


@pytest.mark.parametrize(
    ("workloads", "expected"),
    [
        pytest.param(
            [_workload(name="a", created=1), _workload(name="b", created=2)],
            {"a": (0, 0), "b": (1, 1)},
            id="equal priority goes by creation",
        ),
        pytest.param(
            [_workload(name="a", created=1), _workload(name="b", created=2, priority=10)],
            {"b": (0, 0), "a": (1, 1)},
            id="higher priority goes first",
        ),
        pytest.param(
            [
                _workload(name="a", created=1),
                _workload(name="b", created=2, queue="other"),
                _workload(name="c", created=3),
            ],
            {"a": (0, 0), "b": (1, 0), "c": (2, 1)},
            id="local queue positions count only their own queue",
        ),
        pytest.param(
            [
                _workload(_cond("Evicted", reason="Preempted", at=50), name="a", created=1),
                _workload(name="b", created=2),
            ],
            {"b": (0, 0), "a": (1, 1)},
            id="a requeued workload is ordered by its eviction",
        ),
        pytest.param(
            [_workload(*ADMITTED, name="a", created=1), _workload(name="b", created=2)],
            {"b": (0, 0)},
            id="admitted workloads are not pending",
        ),
        pytest.param(
            [_workload(name="a", created=1, queue="nowhere")],
            {},
            id="a workload of an unknown queue has no position",
        ),
    ],
)
def test_computed_positions(
    workloads: list[runs.WorkloadView], expected: dict[str, tuple[int, int]]
) -> None:
    """Positions follow Kueue's order: priority, then the queue-order timestamp."""
    mapping = {("team", "q"): "cq", ("team", "other"): "cq"}
    positions = runs.compute_positions(workloads, mapping)
    actual = {name: (p.in_cluster_queue, p.in_local_queue) for (_, name), p in positions.items()}
    assert expected == actual
    assert all(p.source == runs.PositionSource.COMPUTED for p in positions.values())


def test_position_from_visibility() -> None:
    """A visibility API answer is read as is, and says where it came from."""
    items = [
        {"metadata": {"name": "x", "namespace": "team"}, "positionInClusterQueue": 4,
         "positionInLocalQueue": 1},
    ]  # fmt: skip
    expected = runs.QueuePosition(4, 1, runs.PositionSource.VISIBILITY)
    assert expected == runs.position_from_visibility(items, "team", "x")
    assert runs.position_from_visibility(items, "team", "y") is None


QUOTA_MSG = (
    "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu"
    " in flavor h100, 8 more needed"
)


@pytest.mark.parametrize(
    ("ctx", "workload", "expected"),
    [
        pytest.param(
            runs.WaitContext("q", "team", queue_exists=False),
            None,
            "queue 'q' does not exist in namespace team; set `queue:` to one that `tau queues`"
            " lists, or ask your platform team for one",
            id="a missing queue is named",
        ),
        pytest.param(
            runs.WaitContext(
                "q",
                "team",
                True,
                gpus_per_worker=8,
                position=runs.QueuePosition(2, 1, runs.PositionSource.COMPUTED),
            ),
            _workload(_cond("QuotaReserved", "False", "Pending", QUOTA_MSG)),
            "waiting for quota: queue 'q' has not enough free GPUs for the 8 GPUs this run asks"
            " for (8 more needed in flavor h100); 2 runs are ahead of it",
            id="missing quota is said in GPUs with the position",
        ),
        pytest.param(
            runs.WaitContext(
                "q",
                "team",
                True,
                gpus_per_worker=8,
                position=runs.QueuePosition(0, 0, runs.PositionSource.COMPUTED),
            ),
            _workload(_cond("QuotaReserved", "False", "Pending", QUOTA_MSG)),
            "waiting for quota: queue 'q' has not enough free GPUs for the 8 GPUs this run asks"
            " for (8 more needed in flavor h100); it is next in line",
            id="the first in line is told so",
        ),
        pytest.param(
            runs.WaitContext("q", "team", True),
            _workload(
                _cond(
                    "QuotaReserved",
                    "False",
                    "Pending",
                    "couldn't assign flavors to pod set main: insufficient quota for"
                    " nvidia.com/gpu in flavor h100, request > maximum capacity"
                    " (16 > 8)",
                )
            ),
            "waiting forever unless the queue grows: it asks for 16 GPUs but queue 'q' can never"
            " give more than 8 (flavor h100)",
            id="a run larger than the queue is told it can never fit",
        ),
        pytest.param(
            runs.WaitContext("q", "team", True),
            dataclasses.replace(
                _workload(_cond("QuotaReserved"), _cond("Admitted", "False")),
                admission_checks=(("taugrid-gpu-health", "Retry", "no healthy node"),),
            ),
            "quota reserved; waiting for admission checks (taugrid-gpu-health: no healthy node)",
            id="pending admission checks are named with their message",
        ),
        pytest.param(
            runs.WaitContext("q", "team", True),
            None,
            "submitted to queue 'q'; waiting for Kueue to pick it up",
            id="no workload yet says so",
        ),
    ],
)
def test_waiting_message(
    ctx: runs.WaitContext, workload: runs.WorkloadView | None, expected: str
) -> None:
    """Why a run waits is said in words a researcher uses, with Kueue's numbers."""
    assert expected == runs.waiting_message(ctx, workload)


def test_evidence_names_where_and_what_ran() -> None:
    """Evidence holds the spec hash, image and ID, cluster queue, flavors and nodes."""
    pod = _pod(phase="Succeeded", exit_code=0)
    workload = _workload(*ADMITTED, cq="cq")
    outcome = runs.attempt_outcome(_job(_cond("Complete")), workload, [pod], NODES)
    record = runs.attempt_record(1, object_kind="Job", object_name="demo-a1", outcome=outcome,
                                 workload=workload)  # fmt: skip
    ev = runs.evidence(SPEC, "team", attempts=[record], pods=[pod], workload=workload)
    assert specs.spec_hash(SPEC) == ev["specHash"]
    assert SPEC.image == ev["image"]
    assert ev["imageID"] == "reg/train@sha256:abc"
    assert ev["kueue"] == {"localQueue": "q", "workload": "job-demo-a1-x", "clusterQueue": "cq",
            "flavors": {"nvidia.com/gpu": "h100"}}  # fmt: skip
    assert ev["nodes"] == ["n0"]
    assert ev["experiment"] == {"project": "p", "tags": []}


def test_evidence_keeps_what_its_sources_no_longer_show() -> None:
    """Once pods are gone, the image ID and flavors recorded earlier remain."""
    first = runs.evidence(SPEC, "team", attempts=[], pods=[_pod(exit_code=0)],
                          workload=_workload(*ADMITTED, cq="cq"))  # fmt: skip
    later = runs.evidence(SPEC, "team", attempts=[], pods=[], workload=None, previous=first)
    assert first["imageID"] == later["imageID"]
    assert later["kueue"]["clusterQueue"] == "cq"


@pytest.mark.parametrize(
    ("failure", "attempt", "expected"),
    [
        pytest.param(specs.FailureClass.NODE_FAILURE, 1, True, id="a node failure is retried"),
        pytest.param(specs.FailureClass.NODE_FAILURE, 3, False, id="not past maxAttempts"),
        pytest.param(specs.FailureClass.APP_ERROR, 1, False, id="an app error is not by default"),
        pytest.param(specs.FailureClass.UNKNOWN, 1, False, id="unknown is never retried"),
    ],
)
def test_should_retry(failure: specs.FailureClass, attempt: int, expected: bool) -> None:
    """Retry follows `retry.when` and `retry.maxAttempts` (default: NodeFailure, 3)."""
    assert expected == runs.should_retry(SPEC, failure, attempt)


def test_phase_conditions_keep_the_first_time_reached() -> None:
    """Reaching a phase again changes nothing; a new phase adds a condition."""
    conditions: list[dict[str, Any]] = []
    assert runs.set_phase_condition(conditions, runs.Phase.QUEUED, "", "", T0)
    later = T0 + dt.timedelta(seconds=5)
    assert not runs.set_phase_condition(conditions, runs.Phase.QUEUED, "", "", later)
    assert runs.set_phase_condition(conditions, runs.Phase.ADMITTED, "Admitted", "", later)
    assert [("Queued", _ts(0)), ("Admitted", _ts(5))] == [
        (c["type"], c["lastTransitionTime"]) for c in conditions
    ]


@pytest.mark.parametrize(
    ("ended", "ttl", "expected"),
    [
        pytest.param(None, 60.0, False, id="a run that has not ended keeps its objects"),
        pytest.param(T0, None, False, id="no ttl keeps them forever"),
        pytest.param(T0, 60.0, True, id="past the ttl they go"),
        pytest.param(T0, 600.0, False, id="within the ttl they stay"),
    ],
)
def test_ttl(ended: dt.datetime | None, ttl: float | None, expected: bool) -> None:
    """Finished runs' objects are deleted once the TTL has passed since they ended."""
    assert expected == runs.ttl_expired(ended, ttl, T0 + dt.timedelta(seconds=120))


def _tau_client() -> Any:
    """Load the `tau` script (a file without .py) as a module."""
    path = pathlib.Path(__file__).resolve().parents[2] / "controller" / "assets" / "tau"
    loader = importlib.machinery.SourceFileLoader("tau_client", str(path))
    module = types.ModuleType(loader.name)
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(["list", "--url", "ftp://x"], 2, id="a non-http URL is a usage error"),
        pytest.param(["list", "--url", ""], 2, id="no URL is a usage error"),
        pytest.param(
            ["run", "--url", "http://127.0.0.1:9", "--image", "i"], 2,
            id="an image without a command is a usage error",
        ),
        pytest.param(
            ["status", "x", "--url", "http://127.0.0.1:9"], 7,
            id="an unreachable controller is exit 7",
        ),
    ],
)  # fmt: skip
def test_tau_exit_codes(argv: list[str], expected: int, capsys: pytest.CaptureFixture[str]) -> None:
    """The client's exit codes are the documented ones, with a message on stderr."""
    assert expected == _tau_client().main(argv)
    assert capsys.readouterr().err.startswith("tau: ")


def _self_signed(d: pathlib.Path) -> pathlib.Path:
    """A throwaway self-signed certificate (PEM) made with the openssl command."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", "/CN=tau-test-ca", "-keyout", str(d / "ca.key"),
         "-out", str(d / "ca.crt")],
        check=True, capture_output=True,
    )  # fmt: skip
    return d / "ca.crt"


@pytest.mark.parametrize("how", ["env", "flag"], ids=["from TAU_CA_FILE", "from --ca-file"])
def test_tau_trusts_the_ca_file_it_is_given(
    how: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TAU_CA_FILE (or --ca-file) goes into the SSL context the client verifies the controller
    with; without either the client uses the system store (None)."""
    tau = _tau_client()
    ca = _self_signed(tmp_path)
    monkeypatch.delenv("TAU_CA_FILE", raising=False)
    plain = tau.parser().parse_args(["list", "--url", "https://c"])
    if how == "env":
        monkeypatch.setenv("TAU_CA_FILE", str(ca))
        args = tau.parser().parse_args(["list", "--url", "https://c"])
    else:
        args = tau.parser().parse_args(["list", "--url", "https://c", "--ca-file", str(ca)])
    context = tau.Client(args.url, "", ca_file=args.ca_file).context
    expected = (None, True)
    actual = (
        tau.Client(plain.url, "", ca_file=plain.ca_file).context,
        {"commonName": "tau-test-ca"}
        in [dict(field[0] for field in c["subject"]) for c in context.get_ca_certs()],
    )
    assert expected == actual


def test_tau_refuses_a_ca_file_it_cannot_load(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing CA file is a usage error naming the file, not an unreachable controller."""
    missing = tmp_path / "nope.crt"
    code = _tau_client().main(["list", "--url", "https://c", "--ca-file", str(missing)])
    expected = (2, True)
    assert expected == (code, str(missing) in capsys.readouterr().err)


@pytest.mark.parametrize(
    ("status", "body", "code", "message"),
    [
        pytest.param(
            422,
            b'{"error": {"code": "Invalid", "message": "is required", "field": "image"}}',
            3, "image: is required", id="a refused spec names the field",
        ),
        pytest.param(
            403, b'{"error": {"code": "Forbidden", "message": "u may not create"}}', 4,
            "u may not create", id="forbidden is exit 4",
        ),
        pytest.param(409, b"{}", 6, "HTTP 409: {}", id="a conflict without a body is exit 6"),
    ],
)  # fmt: skip
def test_tau_reads_api_errors(status: int, body: bytes, code: int, message: str) -> None:
    """API errors become the documented exit code and a message naming the field."""
    err = _tau_client().Client._error(status, body)
    assert (code, message) == (err.code, str(err))


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
            {"metadata": {"name": "bad", "annotations": {runs.QUARANTINED_BY_ANNOTATION: "x"}}},
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
    return {"metadata": {"name": f"job-{job}", "namespace": "team", "creationTimestamp": _ts(0),
                         "ownerReferences": [{"kind": "Job", "name": job}]},
            "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 1}]},
            "status": status}  # fmt: skip


def _raw_pod(phase: str, *, node: str = "n0", exit_code: int | None = None, attempt: int = 1
             ) -> dict[str, Any]:  # fmt: skip
    status: dict[str, Any] = {"phase": phase, "startTime": _ts(2)}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "main", "imageID": "img@sha256:1", "state": {
            "terminated": {"exitCode": exit_code, "finishedAt": _ts(8)}}}]  # fmt: skip
    labels = {runs.LABEL_RUN: "demo", runs.LABEL_ATTEMPT: str(attempt)}
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
    store.workloads = [_raw_workload(_cond("QuotaReserved", "False", "Pending", QUOTA_MSG))]
    await _reconciler(store).pass_once()
    status = store.runs[("team", "demo")]["status"]
    assert (
        status["phase"],
        status["queuePosition"],
        status["queuePositionSource"],
    ) == ("Queued", 0, "computed")
    assert status["message"].startswith("waiting for quota")

    store.admit(_cond("PodsReady", at=3))
    store.pods = [_raw_pod("Running")]
    await _reconciler(store, T0 + dt.timedelta(seconds=4)).pass_once()
    status = store.runs[("team", "demo")]["status"]
    assert (status["phase"], status["message"]) == ("Running", "")
    assert "queuePosition" not in status

    job = store.objects[("team", "Job", "demo-a1")]
    job["status"] = {"conditions": [_cond("Complete")]}
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
    store.runs[("team", "demo")]["metadata"]["annotations"][reconciling.CANCEL_ANNOTATION] = "me"
    run = await _reconciler(store).reconcile_now("team", "demo")
    assert run is not None
    assert run["status"]["phase"] == "Cancelled"
    assert ("team", "Job", "demo-a1") not in store.objects


async def test_a_reconciler_leaves_runs_of_another_manager_alone() -> None:
    """Runs stamped with another manager's name are not touched (a canary or a test)."""
    store = FakeStore()
    store.add_run(SPEC, annotations={reconciling.MANAGED_BY_ANNOTATION: "someone-else"})
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


def test_a_running_pod_on_a_node_whose_gpu_failed_ends_the_attempt() -> None:
    """The node was quarantined Failed: the attempt is a NodeFailure now, before eviction;
    a Degraded quarantine lets it run, and a suspended (preempted) Job is never failed."""
    by = runs.QUARANTINED_BY_ANNOTATION
    record = runs.QUARANTINE_ANNOTATION
    facts = runs.node_facts([
        {"metadata": {"name": "dead", "annotations": {by: "t", record: '{"failed":true}'}}},
        {"metadata": {"name": "sick", "annotations": {by: "t", record: '{"x":1}'}}},
    ])  # fmt: skip
    assert (facts.failed, facts.quarantined) == (frozenset({"dead"}), frozenset({"dead", "sick"}))
    admitted = _workload(_cond("QuotaReserved"), _cond("Admitted"), cq="cq")
    lost = runs.attempt_outcome(_job(), admitted, [_pod(node="dead"), _pod(node="n0")], facts)
    assert (lost.phase, lost.failure_class) == (runs.Phase.FAILED, specs.FailureClass.NODE_FAILURE)
    assert "dead" in lost.message
    degraded = runs.attempt_outcome(_job(), admitted, [_pod(node="sick")], facts)
    assert degraded.phase == runs.Phase.RUNNING
    preempted = runs.attempt_outcome(_job(suspended=True), admitted, [_pod(node="dead")], facts)
    assert preempted.phase != runs.Phase.FAILED


@pytest.mark.parametrize(
    ("attempt", "budget_from", "expected"), [(2, 0, True), (3, 0, False), (3, 1, True)]
)
def test_a_manual_resume_grants_a_fresh_attempt_budget(
    attempt: int, budget_from: int, expected: bool
) -> None:
    """maxAttempts (3 by default) counts the attempts since the last manual resume."""
    node = specs.FailureClass.NODE_FAILURE
    assert runs.should_retry(SPEC, node, attempt, budget_from=budget_from) is expected


def test_the_backoff_doubles_per_retry_up_to_an_hour() -> None:
    """retry.backoff, 2x, 4x... capped; 0s stays 0 (a node failure resumes at once)."""
    spec = specs.parse_spec(
        b"name: d\nimage: i\ncommand: [x]\nretry: {when: [AppError], backoff: 30s}\n"
    ).spec
    assert [runs.retry_backoff_s(spec, n) for n in range(4)] == [30, 60, 120, 240]
    assert runs.retry_backoff_s(spec, 20) == runs.MAX_BACKOFF_S
    assert runs.retry_backoff_s(SPEC, 3) == 0


@pytest.mark.parametrize(
    ("priority", "failure", "expected"),
    [
        (None, "NodeFailure", "taugrid-resume"),
        (None, "Evicted", "taugrid-resume"),
        (None, "AppError", None),
        (None, "OOMKilled", None),
        ("high", "NodeFailure", None),
    ],
)
def test_only_infrastructure_failures_keep_their_place_in_line(
    priority: str | None, failure: str, expected: str | None
) -> None:
    """The resume class applies after NodeFailure/Evicted to runs without their own class."""
    spec = SPEC.model_copy(update={"priority": priority})
    assert runs.resume_priority_class(spec, failure, "taugrid-resume") == expected
    assert runs.resume_priority_class(spec, failure, "") is None


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
    assert labels[rendering.LABEL_PRIORITY] == "taugrid-resume"
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
    assert rendering.LABEL_PRIORITY not in labels


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
    store.runs[("team", "demo")]["metadata"]["annotations"][reconciling.CANCEL_ANNOTATION] = "me"
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
                    runs.QUARANTINED_BY_ANNOTATION: "t",
                    runs.QUARANTINE_ANNOTATION: '{"failed":true}',
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
    assert ("Pod", runs.LABEL_RUN, "spec.nodeName=n0") in store.lists
    assert all(sel != runs.LABEL_RUN or field for _, sel, field in store.lists), store.lists


@pytest.mark.parametrize(
    ("phase", "words"),
    [("Failed", ""), ("Cancelled", ""), ("Running", "cancel it first"),
     ("Succeeded", "only a Failed or Cancelled run")],
)  # fmt: skip
def test_only_failed_or_cancelled_runs_resume_by_hand(phase: str, words: str) -> None:
    """A running run must be cancelled first; a succeeded one has nothing to resume."""
    refusal = runs.resume_refusal("demo", phase)
    assert (refusal == "") == (words == ""), refusal
    assert words in refusal


def test_a_reopened_status_forgets_its_end_and_counts_attempts_afresh() -> None:
    """End conditions turn False with who resumed; the original status is not touched."""
    ended: dict[str, Any] = {"phase": "Failed", "currentAttempt": 2, "endTime": _ts(9),
             "objectsDeleted": True,
             "conditions": [_cond("Queued"), _cond("Failed", reason="AppError")]}  # fmt: skip
    status = runs.reopened(ended, by="ada", now=T0)
    failed = status["conditions"][1]
    assert (failed["status"], failed["reason"], failed["message"]) == (
        "False", "Resumed", "resumed by ada",
    )  # fmt: skip
    assert status["conditions"][0]["status"] == "True"
    assert (status["attemptBudgetFrom"], status["endTime"], status["objectsDeleted"]) == (
        2, None, None,
    )  # fmt: skip
    assert ended["conditions"][1]["status"] == "True"
