"""Run identity (DESIGN.md section 10): which run, and which attempt, a run pod's token is.

A run's pods get no Secret: each has a projected ServiceAccount token of audience
`taugrid-run` (rendering), bound to the pod, rotated by the kubelet, dead with the pod. The
controller asks TokenReview about it for that audience alone, then maps the pod it is bound to
(the review's `authentication.kubernetes.io/pod-name` and `pod-uid`) to a run and attempt by
the pod's own labels. `run_pod` is that mapping (pure); `RunPods` caches it per pod UID and
shares one pod read among concurrent reports of one pod.

What this proves is the namespace boundary: a token of `default` in namespace A is never a
run of namespace B. Inside a namespace, whoever may create pods there may give one our labels
and the default ServiceAccount, as Kubernetes lets anyone who can create pods use any
ServiceAccount of their namespace (docs/security.md says so; a team that must not report for
another's runs gets its own namespace).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from controller import auth, errors, marks

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
    namespace = _namespace(identity)
    name, uid = identity.pod_name, identity.pod_uid
    if not name or not uid:
        msg = (
            "this token is not bound to a pod: a run's pods use their projected taugrid-run"
            " token (TAU_TOKEN_FILE), people their own Kubernetes token"
        )
        raise errors.Forbidden(msg, field="Authorization")
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


def _namespace(identity: auth.Identity) -> str:
    """The namespace of a ServiceAccount's identity; Forbidden for a person's."""
    rest = identity.username.removeprefix(SERVICE_ACCOUNT_PREFIX)
    namespace, _, account = rest.partition(":")
    if rest == identity.username or not namespace or not account:
        msg = f"{identity.username[:200]} is not a ServiceAccount; a run's pods are"
        raise errors.Forbidden(msg, field="Authorization")
    return namespace


ReadPod = Callable[[str, str], Awaitable[dict[str, Any] | None]]


class RunPods:
    """`run_pod` with a cache per pod UID (`auth.TTLCache`: one read per pod however many
    reports wait; a refusal is not kept)."""

    def __init__(self, read_pod: ReadPod, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._read_pod = read_pod
        self._known = auth.TTLCache(clock)

    async def resolve(
        self, identity: auth.Identity, *, before_read: Callable[[], None] | None = None
    ) -> RunPod:
        """The run pod behind `identity`; `before_read` runs before the API server is asked
        about a pod not seen (a rate limit per source)."""
        namespace = _namespace(identity)
        name, uid = identity.pod_name, identity.pod_uid
        if not name or not uid:
            return run_pod(identity, None)  # says why

        async def read() -> RunPod:
            if before_read is not None:
                before_read()
            return run_pod(identity, await self._read_pod(namespace, name))

        return await self._known.get(uid, read, lambda _: POD_TTL_S)
