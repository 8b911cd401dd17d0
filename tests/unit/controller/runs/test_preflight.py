"""Pre-flight of a submission, computed: what must exist is an error naming the field, what
may appear later is a warning, and what could not be read is a warning that it was not."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from controller import errors
from controller.runs import preflight
from shared import spec as specs


def spec(**fields: Any) -> specs.TauSpec:
    base = {"name": "ft", "image": "reg/i@sha256:" + "a" * 64, "command": ["python"],
            "queue": "q"}  # fmt: skip
    return specs.validate_spec({**base, **fields}).spec


VOLUMES = {"volumes": [{"claim": "data", "mountPath": "/data"}],
           "checkpoint": {"dir": "/ckpt", "volume": "ckpt"}}  # fmt: skip
BOUND = preflight.Claim("Bound", ("ReadWriteMany",))
ALL_THERE = preflight.Facts(
    cluster_queue="cq", cluster_queue_active=True, claims={"data": BOUND, "ckpt": BOUND}
)


@pytest.mark.parametrize(
    ("fields", "facts", "warnings"),
    [
        pytest.param(VOLUMES, ALL_THERE, [], id="everything there: nothing to say"),
        pytest.param({}, dataclasses.replace(ALL_THERE, cluster_queue_active=False),
                     [("cluster queue 'cq' behind queue 'q' is not active: the run waits until it"
                      " is (`kubectl get clusterqueue` says why)")],
                     id="an inactive cluster queue is a warning"),
        pytest.param({}, dataclasses.replace(ALL_THERE, cluster_queue_active=None),
                     [("queue 'q' points at cluster queue 'cq', which does not exist: the run"
                      " waits until your platform team creates it")],
                     id="a missing cluster queue is a warning"),
        pytest.param(VOLUMES, dataclasses.replace(ALL_THERE, claims={
            "data": preflight.Claim("Pending"), "ckpt": BOUND}),
                     [("claim 'data' (volumes[0].claim) is Pending, not Bound: the run's pods"
                      " wait until it is")], id="an unbound claim is a warning"),
        pytest.param({**VOLUMES, "workers": 2}, dataclasses.replace(ALL_THERE, claims={
            "data": BOUND, "ckpt": preflight.Claim("Bound", ("ReadWriteOnce",))}),
                     [("checkpoint claim 'ckpt' is not ReadWriteMany but the run has 2 workers:"
                      " only rank 0 may write checkpoints")],
                     id="a ReadWriteOnce checkpoint claim for several workers is a warning"),
        pytest.param(VOLUMES, dataclasses.replace(ALL_THERE, claims={
            "data": preflight.Unknown("forbidden"), "ckpt": BOUND}),
                     ["claim 'data' (volumes[0].claim) was not checked: forbidden"],
                     id="a claim that cannot be read is not a refusal"),
    ],
)  # fmt: skip
def test_what_may_appear_later_is_a_warning(
    fields: dict[str, Any], facts: preflight.Facts, warnings: list[str]
) -> None:
    """The submission goes ahead, with these warnings in its answer."""
    assert warnings == preflight.check(spec(**fields), "team", facts)


@pytest.mark.parametrize(
    ("fields", "facts", "problems"),
    [
        pytest.param({}, dataclasses.replace(ALL_THERE, cluster_queue=None), ["queue"],
                     id="a queue that does not exist"),
        pytest.param(VOLUMES, dataclasses.replace(ALL_THERE, claims={"data": None, "ckpt": None}),
                     ["volumes[0].claim", "checkpoint.volume"],
                     id="claims that do not exist, each named"),
        pytest.param({"priority": "urgent"},
                     dataclasses.replace(ALL_THERE, priority_class=False), ["priority"],
                     id="a priority class that does not exist"),
    ],
)  # fmt: skip
def test_what_must_exist_is_refused_naming_the_field(
    fields: dict[str, Any], facts: preflight.Facts, problems: list[str]
) -> None:
    """A 422 (Invalid) naming the first field, every problem listed."""
    with pytest.raises(errors.Invalid) as err:
        preflight.check(spec(**fields), "team", facts)
    assert (problems[0], problems) == (
        err.value.field, [p["field"] for p in err.value.extra["problems"]],
    )  # fmt: skip
