"""Run identity (DESIGN.md section 10): which run, and which attempt, a run pod's token is.

A run's pods get no Secret: each has a projected ServiceAccount token of audience
`taugrid-run` (rendering), bound to the pod, rotated by the kubelet, dead with the pod. The
controller asks TokenReview about it for that audience alone, then maps the pod it is bound to
(the review's `authentication.kubernetes.io/pod-name` and `pod-uid`) to a run and attempt by
the pod's own labels. `run_pod` is that mapping (pure); `RunPods` caches it per pod UID and
shares one pod read among concurrent reports of one pod.

Labels are only where to look (security review 3, finding 10): anyone who may create pods in
the namespace may put our labels on one. The run and attempt they name hold only when the
pod's controller chain leads to that run (`owned`, pure, asking `owners.fault`, the rule
the reconciler, live logs and log keeping also ask): the pod is controlled by the
attempt's Job (`<run>-a<N>`, its UID), or by the RayCluster its RayJob `<run>-a<N>` names in
`status.rayClusterName` (the controller may not read RayClusters: the name is checked, not
the UID), and that object is controlled by the TauRun of that name, its UID the run's as read
now. A look-alike pod is refused 403, whatever its labels.

What this proves is the namespace boundary: a token of `default` in namespace A is never a
run of namespace B; and inside a namespace a pod that is not the run's. Kubernetes does not
check a pod's ownerReferences, so whoever may create pods there may still copy the real
chain (the Job's name and UID) onto a pod of their own, which the Job controller itself then
counts as the Job's (docs/security.md says so; a team that must not report for another's runs
gets its own namespace).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from controller import auth, errors, marks
from controller.runs import objects, owners

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
POD_TTL_S = 60.0
"""How long a pod's run and attempt are reused; a pod's labels do not change, and a new pod
has a new UID."""


@dataclasses.dataclass(frozen=True)
class RunPod:
    """A pod of attempt `attempt` of run `namespace/run`."""

    namespace: str
    run: str
    attempt: int
    pod: str


def run_pod(identity: auth.Identity, pod: Mapping[str, Any] | None) -> RunPod:
    """The run and attempt of the pod a reviewed `taugrid-run` token is bound to; Forbidden,
    saying why, for a token of anything else. `pod` is the pod as read (None: not found).

    A pod that is terminating still counts: it is reporting its last checkpoint.
    """
    namespace, name, uid = _bound_pod(identity)
    meta = (pod or {}).get("metadata") or {}
    if pod is None or meta.get("uid") != uid:
        msg = f"pod {namespace}/{name}, which this token is bound to, no longer exists"
        raise errors.Forbidden(msg, field="Authorization")
    labels = meta.get("labels") or {}
    run = labels.get(marks.RUN_LABEL)
    attempt = labels.get(marks.ATTEMPT_LABEL, "")
    if not isinstance(run, str) or not run or not isinstance(attempt, str):
        msg = f"pod {namespace}/{name} is not a TauGrid run's pod"
        raise errors.Forbidden(msg, field="Authorization")
    if not attempt.isdigit() or not 0 < len(attempt) <= 9:
        msg = f"pod {namespace}/{name} carries no attempt number"
        raise errors.Forbidden(msg, field="Authorization")
    return RunPod(namespace, run, int(attempt), name)


def attempt_kind(pod: Mapping[str, Any]) -> str:
    """The kind of the attempt object to read for a pod: a RayJob when a RayCluster controls
    the pod, else a Job (what `owned` then checks)."""
    return "RayJob" if owners.controller(pod).get("kind") == "RayCluster" else "Job"


def owned(
    found: RunPod,
    pod: Mapping[str, Any],
    attempt: Mapping[str, Any] | None,
    run: Mapping[str, Any] | None,
) -> None:
    """Forbidden, saying why, unless `pod` is controlled by attempt `found.attempt` of run
    `found.run` as read now (`owners.fault`): `attempt` (the Job or RayJob `<run>-a<N>`,
    None: none) and `run` (the TauRun, None: none). The labels named the run; this is what
    makes it the run's."""
    uid = str(((run or {}).get("metadata") or {}).get("uid") or "")
    ref = objects.RunRef(name=found.run, namespace=found.namespace, uid=uid)
    what = owners.fault(pod, attempt, run=ref, attempt=found.attempt)
    if what is not None:
        msg = (
            f"pod {found.namespace}/{found.pod} carries run {found.run!r}'s labels but is not"
            f" its pod: it is not controlled by attempt {found.attempt}'s {what} (labels alone"
            " make no pod a run's)"
        )
        raise errors.Forbidden(msg, field="Authorization")


def _bound_pod(identity: auth.Identity) -> tuple[str, str, str]:
    """The namespace, name and UID of the pod a ServiceAccount's token is bound to;
    Forbidden for a person's token, or one bound to no pod."""
    rest = identity.username.removeprefix(SERVICE_ACCOUNT_PREFIX)
    namespace, _, account = rest.partition(":")
    if rest == identity.username or not namespace or not account:
        msg = f"{identity.username[:200]} is not a ServiceAccount; a run's pods are"
        raise errors.Forbidden(msg, field="Authorization")
    if not identity.pod_name or not identity.pod_uid:
        msg = (
            "this token is not bound to a pod: a run's pods use their projected taugrid-run"
            " token (TAU_TOKEN_FILE), people their own Kubernetes token"
        )
        raise errors.Forbidden(msg, field="Authorization")
    return namespace, identity.pod_name, identity.pod_uid


ReadPod = Callable[[str, str], Awaitable[dict[str, Any] | None]]
ReadObject = Callable[[str, str, str], Awaitable[dict[str, Any] | None]]
"""(kind, namespace, name) -> the object, None when there is none."""


class RunPods:
    """`run_pod` and `owned` with a cache per pod UID (`auth.TTLCache`: one read of the pod,
    its attempt object and its TauRun however many reports wait; a refusal is not kept)."""

    def __init__(
        self, read_pod: ReadPod, read_object: ReadObject, read_run: ReadPod, *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self._read_pod = read_pod
        self._read_object = read_object
        self._read_run = read_run
        self._known = auth.TTLCache(clock)

    async def resolve(
        self, identity: auth.Identity, *, before_read: Callable[[], None] | None = None
    ) -> RunPod:
        """The run pod behind `identity`; `before_read` runs before the API server is asked
        about a pod not seen (a rate limit per source)."""
        namespace, name, uid = _bound_pod(identity)

        async def read() -> RunPod:
            if before_read is not None:
                before_read()
            pod = await self._read_pod(namespace, name) or {}
            found = run_pod(identity, pod or None)
            attempt, run = await asyncio.gather(
                self._read_object(
                    attempt_kind(pod), namespace, objects.attempt_name(found.run, found.attempt)
                ),
                self._read_run(namespace, found.run),
            )
            owned(found, pod, attempt, run)
            return found

        return await self._known.get(uid, read, lambda _: POD_TTL_S)
