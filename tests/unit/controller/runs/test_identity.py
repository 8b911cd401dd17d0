"""Run identity: which run and attempt a run pod's `taugrid-run` token is (pure mapping,
the cache in front of pod reads, the unverified audience peek that picks the review)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from controller import auth, errors
from controller.runs import identity

POD_UID = "6f1c-uid"


def _pod_identity(
    namespace: str = "team-a", pod: str | None = "mnist-a2-0-xk2", uid: str | None = POD_UID
) -> auth.Identity:
    extra: list[tuple[str, tuple[str, ...]]] = []
    if pod is not None:
        extra.append((auth.POD_NAME_EXTRA, (pod,)))
    if uid is not None:
        extra.append((auth.POD_UID_EXTRA, (uid,)))
    return auth.Identity(f"system:serviceaccount:{namespace}:default", extra=tuple(extra))


RUN_UID = "run-uid"
JOB_UID = "job-uid"


def _ref(kind: str, name: str, uid: str, *, controller: bool = True) -> dict[str, Any]:
    return {"kind": kind, "name": name, "uid": uid, "controller": controller}


def _pod(
    labels: dict[str, str] | None = None, uid: str = POD_UID,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    found = {"taugrid.dev/run": "mnist", "taugrid.dev/attempt": "2"} if labels is None else labels
    refs = [_ref("Job", "mnist-a2", JOB_UID)] if owners is None else owners
    return {"metadata": {"name": "mnist-a2-0-xk2", "namespace": "team-a", "uid": uid,
                         "labels": found, "ownerReferences": refs}}  # fmt: skip


def _job(
    name: str = "mnist-a2", uid: str = JOB_UID, owner: dict[str, Any] | None = None,
    kind: str = "Job", status: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    ref = _ref("TauRun", "mnist", RUN_UID) if owner is None else owner
    meta = {"name": name, "namespace": "team-a", "uid": uid, "ownerReferences": [ref]}
    return {"kind": kind, "metadata": meta, "status": status or {}}


def _run(uid: str = RUN_UID) -> dict[str, Any]:
    return {"kind": "TauRun", "metadata": {"name": "mnist", "namespace": "team-a", "uid": uid}}


FOUND = identity.RunPod("team-a", "mnist", 2, "mnist-a2-0-xk2")
RAYJOB = _job(kind="RayJob", uid="rayjob-uid", status={"rayClusterName": "mnist-a2-x7k"})
RAY_POD = _pod(owners=[_ref("RayCluster", "mnist-a2-x7k", "rc-uid")])


async def _read_object(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    return {"Job": _job(), "RayJob": RAYJOB}[kind] if name == "mnist-a2" else None


async def _read_run(namespace: str, name: str) -> dict[str, Any] | None:
    return _run() if name == "mnist" else None


def _pods(read: identity.ReadPod, **kw: Any) -> identity.RunPods:
    return identity.RunPods(read, _read_object, _read_run, **kw)


def test_a_pod_of_a_run_is_that_runs_attempt() -> None:
    """The pod's own labels name the run and the attempt; the review's namespace is the run's."""
    expected = identity.RunPod("team-a", "mnist", 2, "mnist-a2-0-xk2")
    assert expected == identity.run_pod(_pod_identity(), _pod())


def test_a_terminating_pod_still_reports() -> None:
    """A pod being evicted reports its last checkpoint in its grace period."""
    pod = _pod()
    pod["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert identity.run_pod(_pod_identity(), pod).attempt == 2


@pytest.mark.parametrize(
    ("who", "pod", "says"),
    [
        pytest.param(auth.Identity("ada"), _pod(), "is not a ServiceAccount",
                     id="a person's identity is no run pod"),
        pytest.param(auth.Identity("system:serviceaccount:team-a"), _pod(), "not a ServiceAccount",
                     id="a ServiceAccount name without its account is refused"),
        pytest.param(_pod_identity(pod=None, uid=None), _pod(), "not bound to a pod",
                     id="a token not bound to a pod is refused"),
        pytest.param(_pod_identity(uid=None), _pod(), "not bound to a pod",
                     id="a binding without the pod's uid is refused"),
        pytest.param(_pod_identity(), None, "no longer exists",
                     id="a pod that is gone is refused"),
        pytest.param(_pod_identity(), _pod(uid="another-uid"), "no longer exists",
                     id="a pod of the same name but another uid is another pod"),
        pytest.param(_pod_identity(), _pod(labels={}), "not a TauGrid run's pod",
                     id="a pod without our labels is no run's"),
        pytest.param(_pod_identity(), _pod(labels={"taugrid.dev/run": "mnist"}),
                     "carries no attempt", id="a pod without an attempt label is refused"),
        pytest.param(_pod_identity(),
                     _pod(labels={"taugrid.dev/run": "mnist", "taugrid.dev/attempt": "2\n"}),
                     "carries no attempt", id="an attempt label that is not a number is refused"),
        pytest.param(_pod_identity(),
                     _pod(labels={"taugrid.dev/run": "mnist", "taugrid.dev/attempt": "0" * 12}),
                     "carries no attempt", id="an attempt label of twelve digits is refused"),
    ],
)  # fmt: skip
def test_what_is_not_a_run_pod_is_refused_saying_why(
    who: auth.Identity, pod: dict[str, Any] | None, says: str
) -> None:
    """403 naming Authorization, with the reason in words."""
    with pytest.raises(errors.Forbidden, match=says) as caught:
        identity.run_pod(who, pod)
    assert caught.value.field == "Authorization"


async def test_concurrent_reports_of_one_pod_share_one_read_and_it_is_reused() -> None:
    """Fifty reports of one pod at once cost one pod read and one `before_read`; the next
    report within the TTL none; after the TTL one more."""
    reads: list[tuple[str, str]] = []
    taken: list[None] = []
    release = asyncio.Event()
    now = [100.0]

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append((namespace, name))
        await release.wait()
        return _pod()

    pods = _pods(read, clock=lambda: now[0])
    who = _pod_identity()
    waiting = [
        asyncio.create_task(pods.resolve(who, before_read=lambda: taken.append(None)))
        for _ in range(50)
    ]
    await asyncio.sleep(0)
    release.set()
    found = await asyncio.gather(*waiting)
    await pods.resolve(who)
    now[0] += identity.POD_TTL_S + 1
    await pods.resolve(who)
    expected = ({f.attempt for f in found}, 2, 1)
    assert expected == ({2}, len(reads), len(taken))


async def test_a_refused_pod_is_not_cached() -> None:
    """A pod read as not ours is read again next time (it may have been a race)."""
    answers = [None, _pod()]

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        return answers.pop(0)

    pods = _pods(read)
    with pytest.raises(errors.Forbidden):
        await pods.resolve(_pod_identity())
    assert (await pods.resolve(_pod_identity())).run == "mnist"


@pytest.mark.parametrize(
    ("pod", "attempt"),
    [
        pytest.param(_pod(), _job(), id="a Job's pod: the Job by name and UID, the run's"),
        pytest.param(RAY_POD, RAYJOB, id="a Ray pod: the RayCluster its RayJob names"),
    ],
)  # fmt: skip
def test_a_pod_the_runs_attempt_controls_is_the_runs(
    pod: dict[str, Any], attempt: dict[str, Any]
) -> None:
    identity.owned(FOUND, pod, attempt, _run())
    assert identity.attempt_kind(pod) == attempt["kind"]


@pytest.mark.parametrize(
    ("pod", "attempt", "run"),
    [
        pytest.param(_pod(owners=[]), _job(), _run(), id="labels and no owner at all"),
        pytest.param(_pod(owners=[_ref("Job", "mnist-a2", JOB_UID, controller=False)]), _job(),
                     _run(), id="an owner that is not the controller"),
        pytest.param(_pod(owners=[_ref("Job", "mnist-a2", "forged-uid")]), _job(), _run(),
                     id="the Job's name with another UID"),
        pytest.param(_pod(owners=[_ref("Job", "theirs", JOB_UID)]), _job(), _run(),
                     id="another Job's pod"),
        pytest.param(_pod(owners=[_ref("ReplicaSet", "mnist-a2", JOB_UID)]), _job(), _run(),
                     id="a ReplicaSet of the attempt's name"),
        pytest.param(_pod(), None, _run(), id="no attempt object"),
        pytest.param(_pod(), _job(), None, id="no TauRun"),
        pytest.param(_pod(), _job(), _run("another-run-uid"),
                     id="a Job controlled by a TauRun of the name but another UID"),
        pytest.param(_pod(), _job(owner=_ref("TauRun", "other", RUN_UID)), _run(),
                     id="a Job controlled by another run"),
        pytest.param(_pod(), _job(owner=_ref("CronJob", "mnist", RUN_UID)), _run(),
                     id="a Job controlled by something else"),
        pytest.param(_pod(), _job(owner=_ref("TauRun", "mnist", RUN_UID, controller=False)),
                     _run(), id="a Job the run owns but does not control"),
        pytest.param(_pod(), _job(name="mnist-a3"), _run(), id="another attempt's Job"),
        pytest.param(_pod(owners=[_ref("RayCluster", "other-x7k", "rc")]), RAYJOB, _run(),
                     id="a RayCluster the RayJob does not name"),
        pytest.param(RAY_POD, _job(kind="RayJob", uid="r"), _run(),
                     id="a RayJob that names no cluster yet"),
        pytest.param(RAY_POD, _job(kind="Deployment"), _run(), id="an attempt of another kind"),
    ],
)  # fmt: skip
def test_a_look_alike_pod_is_not_the_runs(
    pod: dict[str, Any], attempt: dict[str, Any] | None, run: dict[str, Any] | None
) -> None:
    """Review 3, finding 10: the run's labels on a pod the attempt does not control: 403."""
    with pytest.raises(errors.Forbidden, match="labels alone make no pod a run's") as caught:
        identity.owned(FOUND, pod, attempt, run)
    assert caught.value.field == "Authorization"


async def test_a_look_alike_pod_is_refused_through_the_cache_and_never_kept() -> None:
    """`RunPods` reads the chain: a labelled pod with no owner is refused every time."""
    reads: list[str] = []

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        reads.append(name)
        return _pod(owners=[])

    pods = _pods(read)
    for _ in range(2):
        with pytest.raises(errors.Forbidden, match="is not its pod"):
            await pods.resolve(_pod_identity())
    assert len(reads) == 2


def _jwt(claims: object) -> str:
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2ln"


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        pytest.param(_jwt({"aud": ["taugrid-run"]}), ("taugrid-run",), id="a list audience"),
        pytest.param(_jwt({"aud": "taugrid-run"}), ("taugrid-run",), id="a string audience"),
        pytest.param(_jwt({"aud": ["https://kubernetes.default.svc", "taugrid-run"]}),
                     ("https://kubernetes.default.svc", "taugrid-run"), id="two audiences"),
        pytest.param(_jwt({"sub": "x"}), (), id="no audience"),
        pytest.param(_jwt({"aud": [1, 2]}), (), id="an audience that is not strings"),
        pytest.param(_jwt(["aud"]), (), id="claims that are not an object"),
        pytest.param("not-a-jwt", (), id="an opaque token"),
        pytest.param("a.%%%.c", (), id="a payload that is not base64"),
        pytest.param("a." + "A" * 20_000 + ".c", (), id="a huge payload is not decoded"),
    ],
)  # fmt: skip
def test_the_audience_peek_reads_only_well_formed_claims(
    token: str, expected: tuple[str, ...]
) -> None:
    """The peek only picks which audience TokenReview is asked about; junk gives ()."""
    assert expected == auth.token_audiences(token)


def test_a_run_caller_names_its_run_and_attempt_and_nobody_else_does() -> None:
    """`run_of` reads what `run_caller` wrote; a person, or a forged extra, is None."""
    forged = auth.Identity("ada", extra=(("taugrid.dev/run", ("team-a/mnist",)),))
    expected = (("team-a", "mnist", 3), None)
    assert expected == (auth.run_of(auth.run_caller("team-a", "mnist", 3)), auth.run_of(forged))
