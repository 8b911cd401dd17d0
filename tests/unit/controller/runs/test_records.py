"""The TauRun status, typed: one model for what the reconciler writes, the API reads and the
CRD declares."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from controller.runs import records

REPO = pathlib.Path(__file__).resolve().parents[4]
WRITTEN: dict[str, Any] = {
    "phase": "Running", "reason": "PodsReady", "message": "", "currentAttempt": 1,
    "tokenSHA256": "a" * 64, "startTime": "2026-01-01T00:00:00Z",
    "attempts": [{"number": 1, "objectKind": "Job", "objectName": "demo-a1", "phase": "Running",
                  "createdTime": "2026-01-01T00:00:00Z", "resumeFrom": "", "nodes": ["n0"],
                  "flavors": {"nvidia.com/gpu": "h100"},
                  "evictions": [{"reason": "Preempted", "count": 1}]}],
    "checkpoints": [{"attempt": 1, "step": 100, "path": "/c/1", "time": "2026-01-01T00:05:00Z"}],
    "conditions": [{"type": "Queued", "status": "True", "reason": "Submitted", "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    "evidence": {"specHash": "h", "image": "i", "imageID": "i@sha256:1",
                 "kueue": {"localQueue": "q", "clusterQueue": "cq"}, "spec": {"name": "demo"}},
}  # fmt: skip


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("deploy/crds/taurun.yaml", id="the CRD declares the model's status"),
        pytest.param("deploy/helm/taugrid/crds/taurun.yaml", id="the chart's CRD does too"),
    ],
)
def test_the_crd_status_schema_is_the_models(path: str) -> None:
    """The CRD's status schema is derived from RunStatus, member by member (regenerate it
    with `records.crd_status_schema()` when the model changes)."""
    crd = yaml.safe_load((REPO / path).read_text())
    declared = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert records.crd_status_schema() == declared


def test_a_written_status_reads_back_the_same() -> None:
    """What the reconciler writes is what it reads: camelCase members, whole-second times."""
    status = records.read(WRITTEN)
    assert records.read(records.wire(status)) == status
    assert records.wire(status)["checkpoints"][0]["time"] == "2026-01-01T00:05:00Z"


def test_a_patch_writes_only_what_changed_and_removes_what_went() -> None:
    """Changed members are written, removed ones set to null, equal ones left out; nested
    objects are patched member by member; lists are replaced whole."""
    old = {"phase": "Queued", "queuePosition": 3, "evidence": {"image": "i", "kind": "job"},
           "attempts": [{"number": 1}]}  # fmt: skip
    new = {"phase": "Admitted", "evidence": {"image": "i", "kind": "ray"},
           "attempts": [{"number": 1}, {"number": 2}]}  # fmt: skip
    expected = {"phase": "Admitted", "queuePosition": None, "evidence": {"kind": "ray"},
                "attempts": [{"number": 1}, {"number": 2}]}  # fmt: skip
    assert expected == records.patch_body(old, new)


def test_members_an_older_controller_wrote_are_read_past_and_never_patched() -> None:
    """Unknown members do not stop a read, and the patch computed from two model wire forms
    does not touch them."""
    older = {**WRITTEN, "observedGeneration": 4, "somethingNew": {"x": 1}}
    status = records.read(older)
    body = records.patch_body(records.wire(records.read(older)), records.wire(status))
    assert (body, str(status.phase)) == ({}, "Running")


@pytest.mark.parametrize(
    ("damage", "member"),
    [
        pytest.param({"currentAttempt": "two"}, "status.currentAttempt", id="a wrong type"),
        pytest.param({"phase": "Sleeping"}, "status.phase", id="a phase that does not exist"),
        pytest.param({"startTime": "yesterday"}, "status.startTime", id="a time that is none"),
    ],
)
def test_a_damaged_status_is_refused_naming_the_member(damage: dict[str, Any], member: str) -> None:
    """A status edited by hand into nonsense is reported, never guessed at."""
    with pytest.raises(ValueError, match=member):
        records.read({**WRITTEN, **damage})


def test_the_reconcilers_read_leaves_the_results_as_they_are() -> None:
    """Read without results (what a reconcile pass does), a status changed and patched never
    names `results`: the collector's writes of them stand."""
    raw = {**WRITTEN, "results": {"metrics": [{"name": "loss", "points": [
        {"step": 1, "value": 0.5, "time": "2026-01-01T00:05:00Z"}]}], "reports": 1}}  # fmt: skip
    seen = records.read(raw, results=False)
    assert (seen.results, records.read(raw).results is not None) == (None, True)
    changed = seen.model_copy(update={"phase": records.Phase.SUCCEEDED})
    body = records.patch_body(records.wire(seen), records.wire(changed))
    assert body == {"phase": "Succeeded"}
