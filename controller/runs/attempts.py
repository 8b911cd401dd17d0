"""A run's objects on the cluster: the one writer of attempts and per-run objects.

Creates the run's token Secret and checkpoint ConfigMap, renders and creates each attempt's
Job or RayJob (and headless Service), deletes an attempt that ended, and deletes a finished
run's objects after its TTL. Every write checks that the lease is still held; creates
tolerate a 409 and deletes a 404, so a repeated write is harmless (level-triggered).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets
from collections.abc import Mapping
from typing import Any

import structlog

from controller import leading, metrics, timestamps
from controller.kube import runs as kube_runs
from controller.runs import checkpoints, lifecycle, objects, rendering
from shared import spec as specs

log = structlog.get_logger()

RUN_TOKEN_PREFIX = "tau_"  # noqa: S105  (a prefix that marks run-scoped tokens, not a secret)
"""Run-scoped tokens start with this, so the API tells them from Kubernetes tokens at once."""
TOKEN_DIGEST_FIELD = "tokenSHA256"  # noqa: S105  (a field name, not a secret)
"""Status field with the SHA-256 of the run-scoped token (the token itself is in the Secret)."""


def token_digest(token: str) -> str:
    """The hex SHA-256 of a run-scoped token, as kept in the run's status."""
    return hashlib.sha256(token.encode()).hexdigest()


class Attempts:
    """Write a run's objects; see the module docstring."""

    def __init__(
        self,
        store: kube_runs.RunStore,
        elector: leading.Elector,
        metrics_: metrics.ControllerMetrics,
        settings: rendering.RenderSettings,
        *,
        ttl_after_finished_s: float | None,
        pod_annotations: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.elector = elector
        self.metrics = metrics_
        self.settings = settings
        self.ttl_after_finished_s = ttl_after_finished_s
        self.pod_annotations = dict(pod_annotations or {})
        self._priority_classes: set[str] | None = None

    async def priority_class_exists(self, name: str) -> bool:
        """Whether a WorkloadPriorityClass exists (a Job naming a missing one would never get
        a Workload); looked up once per controller, then cached."""
        if self._priority_classes is None or name not in self._priority_classes:
            try:
                found = {
                    str((c.get("metadata") or {}).get("name", ""))
                    for c in await self.store.list_kueue("workloadpriorityclasses")
                }
            except Exception as err:  # noqa: BLE001  (no Kueue class API: resume unboosted)
                log.warning("cannot list WorkloadPriorityClasses", error=repr(err))
                return False
            self._priority_classes = found
            if name not in found:
                log.warning("resume priority class missing; resumed attempts queue normally",
                            priority_class=name)  # fmt: skip
        return name in self._priority_classes

    async def ensure_run_objects(self, ref: objects.RunRef, status: dict[str, Any]) -> None:
        """Create the run's token Secret (once: its digest is kept in the status, so the
        controller checks a report without ever reading a Secret) and its ConfigMap (with
        the CA the pods trust for the controller, when it has one)."""
        self.elector.ensure_leader()
        if not status.get(TOKEN_DIGEST_FIELD):
            token = RUN_TOKEN_PREFIX + secrets.token_urlsafe(32)
            await self.store.write_secret(
                objects.render_token_secret(ref, objects.token_secret_name(ref.name), token)
            )
            status[TOKEN_DIGEST_FIELD] = token_digest(token)
        await self.store.create(
            objects.render_checkpoint_configmap(
                ref, objects.checkpoint_configmap_name(ref.name), "", ca_pem=self.settings.ca_pem
            )
        )

    def render(
        self, spec: specs.TauSpec, ref: objects.RunRef, attempt: int, status: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """Render attempt `attempt`; what differs between attempts is read back from the
        status (its attempt record), so re-creating a lost object renders it the same."""
        record = next((a for a in status.get("attempts") or [] if a.get("number") == attempt),
                      None)  # fmt: skip
        if record is not None and "resumeFrom" in record:
            resume_from = str(record.get("resumeFrom") or "")
        else:
            latest = checkpoints.latest(status) if attempt > 1 else None
            resume_from = str(latest.get("path", "")) if latest else ""
        previous: Mapping[str, Any] = next((a for a in status.get("attempts") or []
                         if a.get("number") == attempt - 1), {})  # fmt: skip
        failure = str(previous.get("failureClass") or previous.get("phase") or "")
        ctx = rendering.AttemptContext(
            run=ref, attempt=attempt,
            token_secret=objects.token_secret_name(ref.name),
            checkpoint_configmap=objects.checkpoint_configmap_name(ref.name),
            resume_from=resume_from,
            failure_reason=failure if attempt > 1 else "",
            priority_class=(record or {}).get("priorityClass"),
        )  # fmt: skip
        rendered = rendering.render_attempt(spec, ctx, self.settings)
        if self.pod_annotations:
            for obj in rendered:
                for template in _pod_templates(obj):
                    meta = template.setdefault("metadata", {})
                    meta["annotations"] = {**self.pod_annotations, **meta.get("annotations", {})}
        return rendered

    async def create(
        self, spec: specs.TauSpec, ref: objects.RunRef, attempt: int, status: Mapping[str, Any]
    ) -> None:
        for obj in self.render(spec, ref, attempt, status):
            self.elector.ensure_leader()
            await self.store.create(obj)

    async def start(
        self,
        spec: specs.TauSpec,
        ref: objects.RunRef,
        status: dict[str, Any],
        attempt: int,
        now: dt.datetime,
        *,
        priority_class: str | None = None,
        resume_from: str | None = None,
    ) -> None:
        """Create attempt `attempt` and record it; it resumes from `resume_from`, else from
        the latest checkpoint (attempts after the first)."""
        kind = "RayJob" if spec.kind == specs.RunKind.RAY else "Job"
        if resume_from is None:
            latest = checkpoints.latest(status) if attempt > 1 else None
            resume_from = str(latest.get("path", "")) if latest else ""
        entry: dict[str, Any] = {
            "number": attempt,
            "objectKind": kind,
            "phase": lifecycle.Phase.QUEUED,
            "objectName": objects.attempt_name(ref.name, attempt),
            "createdTime": timestamps.rfc3339(now),
            "resumeFrom": resume_from,
        }
        if priority_class:
            entry["priorityClass"] = priority_class
        status["attempts"].append(entry)
        await self.create(spec, ref, attempt, status)
        status.update(currentAttempt=attempt, phase=lifecycle.Phase.QUEUED, reason="Submitted",
                      message=f"submitted to queue {spec.queue!r}; waiting for Kueue")  # fmt: skip
        status.setdefault("startTime", timestamps.rfc3339(now))
        lifecycle.set_phase_condition(status["conditions"], lifecycle.Phase.QUEUED, "Submitted",
                                 f"attempt {attempt} created", now)  # fmt: skip
        self.metrics.run_attempts.labels("started").inc()
        log.info("attempt started", run=f"{ref.namespace}/{ref.name}", attempt=attempt)

    async def delete(self, spec: specs.TauSpec, ref: objects.RunRef, attempt: int) -> None:
        if attempt < 1:
            return
        name = objects.attempt_name(ref.name, attempt)
        self.elector.ensure_leader()
        if spec.kind == specs.RunKind.RAY:
            await self.store.delete("RayJob", ref.namespace, name)
        else:
            await self.store.delete("Job", ref.namespace, name)
        if spec.kind == specs.RunKind.PYTORCH:
            await self.store.delete("Service", ref.namespace, name)

    async def cleanup(
        self, spec: specs.TauSpec, ref: objects.RunRef, status: dict[str, Any], now: dt.datetime
    ) -> None:
        """Delete a finished run's objects after the TTL (once; the TauRun stays)."""
        if status.get("objectsDeleted"):
            return
        if not lifecycle.ttl_expired(
            timestamps.parse(status.get("endTime")), self.ttl_after_finished_s, now
        ):
            return
        for record in status.get("attempts") or []:
            await self.delete(spec, ref, int(record.get("number") or 0))
        status["objectsDeleted"] = True


def _pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "Job":
        return [obj["spec"]["template"]]
    if obj["kind"] == "RayJob":
        cluster = obj["spec"]["rayClusterSpec"]
        return [cluster["headGroupSpec"]["template"]] + [
            group["template"] for group in cluster["workerGroupSpecs"]
        ]
    return []
