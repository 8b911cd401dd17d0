"""A run's own objects, besides its attempts: the checkpoint ConfigMap, the names of a run's
objects, and the owner reference every object of a run carries (pure).

A run has no token object: its pods get projected ServiceAccount tokens of audience
`taugrid-run` (rendering), which the controller reviews and maps to the run through the pod
they are bound to (`controller.runs.identity`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from controller import marks
from shared import spec as specs

TAURUN_API_VERSION = specs.API_VERSION

TAURUN_KIND = "TauRun"

CHECKPOINT_CONFIGMAP_KEY = "latest"
"""Key (and file name) of the latest checkpoint in the per-run ConfigMap."""

CA_CONFIGMAP_KEY = "ca.crt"
"""Key (and file name) of the controller's CA in the per-run ConfigMap, when it has one."""


@dataclasses.dataclass(frozen=True)
class RunRef:
    """The TauRun an attempt belongs to (its metadata, not its spec)."""

    name: str
    namespace: str
    uid: str


def attempt_name(run_name: str, attempt: int) -> str:
    """Return the name of attempt `attempt` of `run_name`: `<run>-a<N>`."""
    return f"{run_name}-a{attempt}"


def run_of_attempt(name: str) -> str | None:
    """The run whose attempt object is named `name` (`attempt_name`'s inverse); None when
    the name is no attempt's."""
    run, sep, attempt = name.rpartition("-a")
    return run if sep and run and attempt.isdigit() and not attempt.startswith("0") else None


def claim_template_name(run_name: str, attempt: int) -> str:
    """Return the ResourceClaimTemplate of an attempt's pods on DRA: `<run>-a<N>-gpus`."""
    return f"{attempt_name(run_name, attempt)}-gpus"


def attempt_number(run_name: str, object_name: str) -> int | None:
    """N of an object named `<run>-a<N>`; None for any other name."""
    number = object_name.removeprefix(f"{run_name}-a")
    return int(number) if number != object_name and number.isdigit() else None


def checkpoint_configmap_name(run_name: str) -> str:
    """Return the conventional name of a run's checkpoint ConfigMap."""
    return f"{run_name}-checkpoint"


def owner_reference(run: RunRef) -> dict[str, Any]:
    """Return the owner reference every object of a run carries.

    `controller: true` marks the TauRun as the managing controller; `blockOwnerDeletion`
    makes foreground deletion of the TauRun wait for its attempts.
    """
    return {
        "apiVersion": TAURUN_API_VERSION,
        "kind": TAURUN_KIND,
        "name": run.name,
        "uid": run.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def render_checkpoint_configmap(
    run: RunRef, name: str, latest: str, *, ca_pem: str = ""
) -> dict[str, Any]:
    """Return the per-run ConfigMap whose `latest` key the pods read as a file.

    `latest` is whatever the checkpoint reporter writes (the path, or a JSON record); an
    empty string means no checkpoint yet. A non-empty `ca_pem` (`RenderSettings.ca_pem`)
    goes under `ca.crt`, the file `TAU_CA_FILE` names.
    """
    data = {CHECKPOINT_CONFIGMAP_KEY: latest}
    if ca_pem:
        data[CA_CONFIGMAP_KEY] = ca_pem
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": run.namespace,
            "labels": {marks.RUN_LABEL: run.name},
            "ownerReferences": [owner_reference(run)],
        },
        "data": data,
    }


def run_ref(item: Mapping[str, Any]) -> RunRef:
    """The RunRef of a raw TauRun."""
    meta = item.get("metadata") or {}
    return RunRef(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        uid=str(meta.get("uid", "")),
    )
