"""The volumes every attempt's pods mount (pure): the spec's claims, the checkpoint claim,
/dev/shm, the checkpoint file and the controller's CA from the run's ConfigMap, and the pod's
projected `taugrid-run` token, with the paths the pods are told (`TAU_*_FILE`)."""

from __future__ import annotations

from typing import Any

from controller.runs import objects
from shared import spec as specs

CHECKPOINT_FILE = f"{specs.CHECKPOINT_MOUNT_DIR}/{objects.CHECKPOINT_CONFIGMAP_KEY}"
CA_FILE = f"{specs.CHECKPOINT_MOUNT_DIR}/{objects.CA_CONFIGMAP_KEY}"
"""Where run pods find the controller's CA (`TAU_CA_FILE`)."""

RUN_TOKEN_DIR = "/var/run/secrets/taugrid.dev/run"  # noqa: S105  (a path, not a secret)
RUN_TOKEN_FILE = f"{RUN_TOKEN_DIR}/token"
"""Where a run pod finds its projected `taugrid-run` token (`TAU_TOKEN_FILE`); tau.yaml may
not mount anything over /var/run/secrets."""

VOLUME_SHM = "dshm"
VOLUME_RUN_TOKEN = "taugrid-run-token"  # noqa: S105  (a volume name, not a secret)
VOLUME_CHECKPOINT_FILE = "taugrid-checkpoint"
VOLUME_CHECKPOINT_CLAIM = "checkpoint"


def volumes_and_mounts(
    spec: specs.TauSpec,
    *,
    configmap: str,
    with_ca: bool,
    token_audience: str,
    token_expiration_s: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The spec's claims, the checkpoint claim, /dev/shm, the checkpoint file from the run's
    ConfigMap `configmap` (and the controller's CA beside it, `with_ca`) and the pod's
    `taugrid-run` token (of `token_audience`, living `token_expiration_s`)."""
    claims = [(f"vol-{index}", volume) for index, volume in enumerate(spec.volumes)]
    volumes: list[dict[str, Any]] = [
        {"name": name, "persistentVolumeClaim": {"claimName": v.claim, "readOnly": v.read_only}}
        for name, v in claims
    ]
    mounts: list[dict[str, Any]] = [
        {"name": name, "mountPath": v.mount_path, "readOnly": v.read_only} for name, v in claims
    ]
    checkpoint = spec.checkpoint
    listed = checkpoint is not None and any(v.claim == checkpoint.volume for v in spec.volumes)
    if checkpoint is not None and checkpoint.volume is not None and not listed:
        volumes.append(
            {
                "name": VOLUME_CHECKPOINT_CLAIM,
                "persistentVolumeClaim": {"claimName": checkpoint.volume},
            }
        )
        mounts.append({"name": VOLUME_CHECKPOINT_CLAIM, "mountPath": checkpoint.dir})
    volumes.append(
        {"name": VOLUME_SHM, "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}
    )
    mounts.append({"name": VOLUME_SHM, "mountPath": specs.SHM_MOUNT_PATH})
    items = [{"key": objects.CHECKPOINT_CONFIGMAP_KEY, "path": objects.CHECKPOINT_CONFIGMAP_KEY}]
    if with_ca:
        items.append({"key": objects.CA_CONFIGMAP_KEY, "path": objects.CA_CONFIGMAP_KEY})
    volumes.append(
        {
            "name": VOLUME_CHECKPOINT_FILE,
            "configMap": {
                "name": configmap,
                # Optional: a pod must start even if the ConfigMap is briefly missing.
                "optional": True,
                "items": items,
            },
        }
    )
    mounts.append(
        {"name": VOLUME_CHECKPOINT_FILE, "mountPath": specs.CHECKPOINT_MOUNT_DIR, "readOnly": True}
    )
    # The run's credential for our API (DESIGN.md section 10): bound to this pod, of an
    # audience no Kubernetes API server accepts, rotated by the kubelet, dead with the pod.
    token = {
        "audience": token_audience,
        "expirationSeconds": token_expiration_s,
        "path": "token",
    }
    volumes.append(
        {"name": VOLUME_RUN_TOKEN, "projected": {"sources": [{"serviceAccountToken": token}]}}
    )
    mounts.append({"name": VOLUME_RUN_TOKEN, "mountPath": RUN_TOKEN_DIR, "readOnly": True})
    return volumes, mounts
