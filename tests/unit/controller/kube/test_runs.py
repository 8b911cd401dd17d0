"""The run adapter's reading of an API server's refusal: a 4xx naming the field, not a 500."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio import client

from controller import errors
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
        pytest.param(500, "etcd timeout", errors.Unavailable, "",
                     id="a 500 of the API server is retryable, not ours"),
    ],
)  # fmt: skip
def test_a_refusal_becomes_an_error_kind(
    status: int, reason: str, kind: type[errors.ControllerError], field: str
) -> None:
    """Each refusal of a create maps to an error kind (so never to a 500)."""
    err = kube_runs.refusal(client.ApiException(status=status, reason=reason), "Job")
    expected = (True, field)
    assert expected == (isinstance(err, kind), err.field)
