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


# ------------------------------------------------------ told only what the caller may read
HIDDEN_CLAIMS = preflight.Readable(unreadable_claims=frozenset({"data", "ckpt"}))


@pytest.mark.parametrize(
    "claims",
    [
        pytest.param({"data": BOUND, "ckpt": BOUND}, id="both bound"),
        pytest.param({"data": None, "ckpt": None}, id="both missing"),
        pytest.param({"data": preflight.Claim("Pending"),
                      "ckpt": preflight.Claim("Bound", ("ReadWriteOnce",))}, id="pending, RWO"),
        pytest.param({}, id="not read at all"),
    ],
)  # fmt: skip
def test_a_claim_the_caller_may_not_read_is_told_the_same_whatever_it_is(
    claims: dict[str, Any],
) -> None:
    """Review 3, finding 10: existing, missing, pending or never read, a caller who may not
    get persistentvolumeclaims is told the same words, and is never refused for them."""
    facts = dataclasses.replace(ALL_THERE, claims=claims)
    said = preflight.check(spec(**VOLUMES, workers=2), "team-a", facts, HIDDEN_CLAIMS)
    assert said == [
        (
            "claim 'data' (volumes[0].claim) was not checked: you may not get"
            " persistentvolumeclaims in team-a"
        ),
        (
            "claim 'ckpt' (checkpoint.volume) was not checked: you may not get"
            " persistentvolumeclaims in team-a"
        ),
    ]


@pytest.mark.parametrize(
    ("queue", "active"),
    [("cq", True), ("cq", False), ("cq", None), (None, None), (preflight.Unknown("x"), None)],
)
def test_a_queue_the_caller_may_not_list_is_told_the_same_whatever_it_is(
    queue: str | preflight.Unknown | None, active: bool | None
) -> None:
    """No LocalQueue, no ClusterQueue or an inactive one: the same warning, no refusal, to a
    caller without the right `tau queues` needs."""
    facts = preflight.Facts(cluster_queue=queue, cluster_queue_active=active)
    said = preflight.check(spec(), "team-a", facts, preflight.Readable(queue=False))
    assert said == ["queue 'q' was not checked: you may not list tauruns.taugrid.dev in team-a"]


@pytest.mark.parametrize("exists", [True, False])
def test_a_priority_class_off_the_allow_list_is_told_only_to_who_may_read_it(exists: bool) -> None:
    """A class not on the allow-list, to a caller who may not get priority classes: the same
    warning whether it exists or not; to a caller who may, the useful answer."""
    facts = dataclasses.replace(ALL_THERE, priority_class=exists)
    hidden = preflight.Readable(priority_class=False)
    said = preflight.check(spec(priority="secret-tier"), "team-a", facts, hidden)
    assert said == [
        (
            "priority 'secret-tier' was not checked: you may not get"
            " workloadpriorityclasses.kueue.x-k8s.io, and the platform's allow-list does not"
            " name it"
        )
    ]
    if exists:
        assert preflight.check(spec(priority="secret-tier"), "team-a", facts) == []
    else:
        with pytest.raises(errors.Invalid) as err:
            preflight.check(spec(priority="secret-tier"), "team-a", facts)
        assert err.value.field == "priority"


@pytest.mark.parametrize(
    ("allowed", "may_get", "told"),
    [
        pytest.param(("low", "high"), False, True, id="allow-listed: public configuration"),
        pytest.param(("low",), False, False, id="off the list, no right: not told"),
        pytest.param((), False, False, id="no list, no right: not told"),
        pytest.param((), True, True, id="a caller who may get it is told"),
    ],
)  # fmt: skip
def test_which_priority_classes_may_be_confirmed(
    allowed: tuple[str, ...], may_get: bool, told: bool
) -> None:
    assert told == preflight.priority_readable("high", allowed, may_get)


def _name(kind: str, name: str, readable: bool, owner: str | None = None) -> preflight.Name:
    existing = None
    if owner is not None:
        refs = [{"kind": "TauRun", "name": owner, "controller": True}] if owner else []
        existing = {"metadata": {"name": name, "ownerReferences": refs}}
    return preflight.Name(kind, "team-a", name, readable, existing)


@pytest.mark.parametrize("owner", [None, "", "other"], ids=["free", "someone's", "another run's"])
def test_a_name_the_caller_may_not_read_is_told_the_same_taken_or_free(owner: str | None) -> None:
    """Review 3, finding 10 over review M4: a ConfigMap and a Job of the run's names, the
    caller may get neither: one warning naming both, the same whoever holds them."""
    names = [_name("ConfigMap", "ft-checkpoint", False, owner), _name("Job", "ft-a1", False, owner)]
    assert preflight.name_check("ft", names) == [
        (
            "whether the names run 'ft' needs are free (ConfigMap 'ft-checkpoint', Job 'ft-a1') was"
            " not checked: you may not get configmaps, jobs.batch in team-a (a run whose name is"
            " taken ends Failed NameTaken)"
        )
    ]


def test_a_name_the_caller_may_read_is_refused_when_somebody_else_holds_it() -> None:
    """A caller who may get ConfigMaps is told (409 NameTaken naming it); the run's own
    object and a free name are fine."""
    assert preflight.name_check("ft", [_name("ConfigMap", "ft-checkpoint", True)]) == []
    assert preflight.name_check("ft", [_name("ConfigMap", "ft-checkpoint", True, "ft")]) == []
    with pytest.raises(errors.NameTaken) as err:
        preflight.name_check("ft", [_name("ConfigMap", "ft-checkpoint", True, "")])
    assert "ConfigMap team-a/ft-checkpoint already exists" in err.value.message
    with pytest.raises(errors.NameTaken):
        preflight.name_check("ft", [_name("Job", "ft-a1", True, "other")])
