"""The health vocabulary both daemons speak: verdicts, actions and reason codes.

Values are PascalCase because they become Kubernetes condition reasons verbatim.
"""

from __future__ import annotations

import enum


class Verdict(enum.StrEnum):
    """What the agent concludes about one GPU (DESIGN.md section 5)."""

    HEALTHY = "Healthy"
    DEGRADED = "Degraded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class Action(enum.StrEnum):
    """What it takes to bring a GPU back; ordered by cost in `ACTION_SEVERITY`."""

    NONE = "None"
    RESTART_APP = "RestartApp"
    RESET_GPU = "ResetGPU"
    REBOOT_NODE = "RebootNode"
    INSPECT = "Inspect"


VERDICT_SEVERITY: dict[Verdict, int] = {
    Verdict.HEALTHY: 0,
    Verdict.UNKNOWN: 1,
    Verdict.DEGRADED: 2,
    Verdict.FAILED: 3,
}

ACTION_SEVERITY: dict[Action, int] = {
    Action.NONE: 0,
    Action.RESTART_APP: 1,
    Action.RESET_GPU: 2,
    Action.REBOOT_NODE: 3,
    Action.INSPECT: 4,
}


def worst_verdict(verdicts: list[Verdict]) -> Verdict:
    """Return the most severe verdict, Healthy for an empty list."""
    return max(verdicts, key=VERDICT_SEVERITY.__getitem__, default=Verdict.HEALTHY)


def worst_action(actions: list[Action]) -> Action:
    """Return the most costly action, None for an empty list."""
    return max(actions, key=ACTION_SEVERITY.__getitem__, default=Action.NONE)
