"""The run adapter's reading of an API server's refusal: a 4xx naming the field, not a 500."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client

from controller import errors, marks
from controller.kube import refusals as kube_refusals
from controller.kube import runs as kube_runs

STATUS_422 = json.dumps({
    "kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
    "message": 'Job.batch "demo-a1" is invalid: metadata.labels: Invalid value: "a\\n"',
    "details": {"causes": [{"reason": "FieldValueInvalid", "field": "metadata.labels",
                            "message": 'Invalid value: "a\\n"'}]},
})  # fmt: skip


@pytest.mark.parametrize(
    ("status", "reason", "kind", "field"),
    [
        pytest.param(422, STATUS_422, errors.Invalid, "metadata.labels",
                     id="a 422 names the field the Status names"),
        pytest.param(400, "not json at all", errors.Invalid, "",
                     id="a 400 without a Status is still a refusal"),
        pytest.param(403, '{"message": "forbidden"}', errors.Forbidden, "",
                     id="a 403 says the controller may not create there"),
        pytest.param(403, '{"message": "jobs.batch \\"r-a1\\" is forbidden:'
                     " ValidatingAdmissionPolicy 'p' with binding 'p' denied request: no\"}",
                     errors.AdmissionRefused, "",
                     id="a 403 of an admission policy is a permanent refusal"),
        pytest.param(403, '{"message": "admission webhook \\"w\\" denied the request: no"}',
                     errors.AdmissionRefused, "",
                     id="a 403 of an admission webhook is a permanent refusal"),
        pytest.param(500, "etcd timeout", errors.Unavailable, "",
                     id="a 500 of the API server is retryable, not ours"),
    ],
)  # fmt: skip
def test_a_refusal_becomes_an_error_kind(
    status: int, reason: str, kind: type[errors.ControllerError], field: str
) -> None:
    """Each refusal of a create maps to an error kind (so never to a 500)."""
    err = kube_refusals.refusal(client.ApiException(status=status, reason=reason), "Job")
    expected = (True, field)
    assert expected == (isinstance(err, kind), err.field)


RUN = {
    "apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRun",
    "metadata": {"name": "demo", "namespace": "ns", "resourceVersion": "7",
                 "managedFields": [{"manager": "m"}],
                 "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}",
                                 "taugrid.dev/cancel-requested": "me"}},
    "spec": {"image": "x"},
    "status": {"phase": "Running", "currentAttempt": 1, "results": {"metrics": {"a": []}}},
}  # fmt: skip


def test_a_cached_run_keeps_what_the_passes_read_and_drops_the_rest() -> None:
    """The TauRun cache drops managedFields, kubectl's last-applied copy and the results
    (never read by a pass); everything else, the resourceVersion included, is kept."""
    expected = {
        "apiVersion": "taugrid.dev/v1alpha1", "kind": "TauRun",
        "metadata": {"name": "demo", "namespace": "ns", "resourceVersion": "7",
                     "annotations": {"taugrid.dev/cancel-requested": "me"}},
        "spec": {"image": "x"},
        "status": {"phase": "Running", "currentAttempt": 1},
    }  # fmt: skip
    assert expected == kube_runs.trim_run(RUN)
    assert "results" in RUN["status"]  # the input is left as it was


def test_a_cached_node_keeps_its_name_and_quarantine_annotations_only() -> None:
    """The node cache keeps what `views.node_facts` reads, so other node changes (status,
    labels, other annotations) change nothing a reader sees."""
    raw = {"metadata": {"name": "n1", "labels": {"a": "1"}, "resourceVersion": "9",
                        "annotations": {marks.QUARANTINED_BY_ANNOTATION: "c",
                                        marks.QUARANTINE_ANNOTATION: "{}", "other": "x"}},
           "status": {"conditions": []}}  # fmt: skip
    expected = {"metadata": {"name": "n1", "annotations": {
        marks.QUARANTINED_BY_ANNOTATION: "c", marks.QUARANTINE_ANNOTATION: "{}"}}}  # fmt: skip
    assert expected == kube_runs.trim_node(raw)
