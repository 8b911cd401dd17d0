"""A run's retry policy (pure): whether a failed attempt is retried, after how long, in which
priority band, and what the run says when it is not. The state machine that applies it is
`controller.runs.policy`."""

from __future__ import annotations

from shared import spec as specs


def should_retry(
    spec: specs.TauSpec, failure: specs.FailureClass, attempt: int, *, budget_from: int = 0
) -> bool:
    """Whether the controller starts another attempt after `attempt` failed with `failure`.

    `maxAttempts` counts the attempts since `budget_from` (the attempt a person resumed
    after: a manual resume grants a fresh budget). Unknown is never retried.
    """
    if failure == specs.FailureClass.UNKNOWN:
        return False
    return str(failure) in spec.retry.when and attempt - budget_from < spec.retry.max_attempts


MAX_BACKOFF_S = 3600.0
"""The longest wait between two attempts, however many have failed."""


def retry_backoff_s(spec: specs.TauSpec, retries_so_far: int) -> float:
    """The wait before the next attempt: `retry.backoff`, doubled for each retry already made
    (`backoff`, 2×, 4×...), capped at an hour. 0 stays 0: a node failure is not the run's
    fault and it resumes at once."""
    base = float(spec.retry.backoff_s)
    if base <= 0:
        return 0.0
    return min(base * 2.0 ** max(retries_so_far, 0), MAX_BACKOFF_S)


INFRASTRUCTURE_FAILURES = frozenset({specs.FailureClass.NODE_FAILURE, specs.FailureClass.EVICTED})
"""Failures that are not the run's fault: its next attempt keeps its place in line."""


def resume_priority_class(
    spec: specs.TauSpec, failure: str, resume_class: str | None
) -> str | None:
    """The WorkloadPriorityClass of the next attempt, or None for the run's own.

    A new attempt is a new Workload, which Kueue would queue behind everything submitted
    since the run first started. After an infrastructure failure (NodeFailure, Evicted) the
    next attempt of a run in the default band (no `priority`) gets `resume_class`, one step
    above that band, so it goes ahead of its peers. Runs with a priority class of their own
    keep it: they already stand ahead of the default band, and a bump could make them
    preempt work at their own level. Failures of the run's own making (AppError, OOMKilled,
    Timeout) queue normally.
    """
    infrastructure = failure in {str(f) for f in INFRASTRUCTURE_FAILURES}
    return resume_class if resume_class and spec.priority is None and infrastructure else None


def final_message(
    spec: specs.TauSpec, failure: specs.FailureClass, attempt: int, budget_from: int, why: str
) -> str:
    """Say why a failed attempt ends the run: which policy decided it, in words."""
    if failure == specs.FailureClass.UNKNOWN:
        tail = "an Unknown failure is never retried"
    elif str(failure) not in spec.retry.when:
        tail = f"{failure} is not in retry.when ({', '.join(spec.retry.when)})"
    else:
        tail = f"all {attempt - budget_from} of retry.maxAttempts={spec.retry.max_attempts} used"
    return f"attempt {attempt} failed ({why}); not retried: {tail}"
