"""The controller's vocabulary on the cluster: every name we put there, defined once.

Labels, annotations, taints, condition types, field managers and the names Events and
records carry. Domains import their names from here, so a name is never spelt twice and a
domain never imports another to learn one (the runs domain reads the fleet's quarantine
annotations; the admission gate reads the fleet's taint and condition and the runs' labels).
Names of Kubernetes and Kueue that we write or read on our objects are here too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

PREFIX = "taugrid.dev/"
"""Our annotations and labels start with this (the node cache keeps only these)."""

# ---------------------------------------------------------------- others' names we use
GPU_RESOURCE = "nvidia.com/gpu"
"""The device plugin's extended resource: what a GPU node advertises and a run requests."""
SIMULATED_NODE_ANNOTATION = "kwok.x-k8s.io/node"
"""KWOK manages a node carrying this annotation: it plays the kubelet, runs no process and so
keeps no container log (read only, to say so in words)."""
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
JOB_COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"

# ---------------------------------------------------------------- Nodes (fleet)
NODE_CONDITION = "GPUHealthy"
"""The Node condition we own (True, False or Unknown; PascalCase reason)."""
TAINT_KEY = "taugrid.dev/gpu-unhealthy"
TAINT_EFFECT = "NoSchedule"
MANAGED_LABEL = "taugrid.dev/managed"
"""`false` opts a node out of quarantine."""
CORDONED_ANNOTATION = "taugrid.dev/cordoned"
"""`true` when we, not someone else, cordoned the node (we only undo what we did)."""
QUARANTINED_BY_ANNOTATION = "taugrid.dev/quarantined-by"
QUARANTINED_AT_ANNOTATION = "taugrid.dev/quarantined-at"
QUARANTINED_REASON_ANNOTATION = "taugrid.dev/quarantined-reason"
QUARANTINE_ANNOTATION = "taugrid.dev/quarantine"
"""The quarantine record (JSON): mode, what clears it, fault keys, eviction deadline."""
RELEASED_FAULTS_ANNOTATION = "taugrid.dev/released-faults"
HISTORY_ANNOTATION = "taugrid.dev/history"
CONTROLLER_IDENTITY = "taugrid-controller"
"""The `by` of every automatic action, in annotations and history."""

# ---------------------------------------------------------------- DRA devices (fleet)
DRA_DRIVER = "gpu.nvidia.com"
"""NVIDIA's DRA driver: its ResourceSlices list a node's GPUs in a pool named after the node."""
DRA_DEVICE_CLASS = "gpu.nvidia.com"
"""NVIDIA's DeviceClass for whole GPUs, which our claim templates request."""
DRA_UUID_ATTRIBUTE = "uuid"
"""The device attribute NVIDIA's driver puts a GPU's UUID in (what our agents report)."""
DEVICE_UNHEALTHY_KEY = TAINT_KEY
"""Our NoSchedule device taint: nothing tolerates it, so no claim is allocated the device."""
DEVICE_EVICT_KEY = "taugrid.dev/gpu-evict"
"""Our NoExecute device taint that run claims tolerate for their checkpoint grace."""
DEVICE_FAILED_KEY = "taugrid.dev/gpu-failed"
"""Our NoExecute device taint that nothing tolerates (an uncontained fault)."""
DEVICE_RULE_PREFIX = "taugrid-"
"""Every DeviceTaintRule we create is named `taugrid-<node>-<device>-<kind>`."""
DEVICE_RULE_LABEL = "taugrid.dev/quarantined-by"
"""On our DeviceTaintRules, `taugrid-controller`: we never delete a rule without it."""
DEVICE_RULE_NODE_ANNOTATION = "taugrid.dev/node"
DEVICE_RULE_DEVICE_ANNOTATION = "taugrid.dev/device"
DEVICE_RULE_UUID_ANNOTATION = "taugrid.dev/gpu-uuid"
DEVICE_RULE_RECORD_ANNOTATION = QUARANTINE_ANNOTATION
"""On our DeviceTaintRules: the quarantine record (reason, fault keys, what clears it)."""
DEVICE_TAINT_DELETION_REASON = "DeletionByDeviceTaintManager"
"""The `DisruptionTarget` reason kube-controller-manager's device-taint eviction puts on a
pod it deletes (pkg/controller/devicetainteviction)."""
EVICTION_IN_PROGRESS_CONDITION = "EvictionInProgress"
"""The DeviceTaintRule condition kube-controller-manager keeps (for effect None: what
NoExecute would evict)."""

# ---------------------------------------------------------------- the Lease, the leader
LEADER_URL_ANNOTATION = "taugrid.dev/leader-url"
"""Where the leader says it listens: informational only (on-call reads it), never a place
any replica or agent sends data to (DESIGN.md section 6)."""
RUN_CALLER_EXTRA = "taugrid.dev/run"
"""The extra of the identity a follower forwards for a run pod's token: `<ns>/<run>`."""
RUN_ATTEMPT_EXTRA = "taugrid.dev/attempt"
"""The extra of that identity naming the attempt of the pod the token is bound to."""
LEADER_LABEL = "taugrid.dev/leader"
"""Set to "true" by the leader on its own pod, removed when it stops leading; the chart's
leader-only Service selects it, and followers send leader-only work there."""
BREAKER_ANNOTATION = "taugrid.dev/breaker"
DRY_RUN_ANNOTATION = "taugrid.dev/dry-run"
DEVICE_BREAKER_ANNOTATION = "taugrid.dev/device-breaker"

# ---------------------------------------------------------------- Kueue (admission)
ADMISSION_CHECK_CONTROLLER = "taugrid.dev/gpu-health"
"""The `spec.controllerName` of the AdmissionCheck we answer."""
DEFAULT_ADMISSION_CHECK = "taugrid-gpu-health"
ADMISSION_FIELD_MANAGER = "taugrid-gpu-health"
"""The server-side-apply field manager of our entry in a Workload's admission checks."""
CHECK_ACTIVE_CONDITION = "Active"
CHECK_ACTIVE_REASON = "ControllerReady"
GATE_PASSED_LABEL = "taugrid.dev/gpu-health-passed"
"""Put on the pods of a Workload our check passed (value `true`, through its
`podSetUpdates`): selects the pods the GPU-health gate let in."""
GATE_CHECK_ANNOTATION = "taugrid.dev/gpu-health-check"
"""Names the AdmissionCheck that passed the pod (a name may be too long for a label value)."""
GATE_PASSED_AT_ANNOTATION = "taugrid.dev/gpu-health-passed-at"
"""When our check went Ready (RFC 3339): a quarantine later than this found a fault that
came after admission, not one the gate let through."""

# ---------------------------------------------------------------- runs
RUN_LABEL = "taugrid.dev/run"
ATTEMPT_LABEL = "taugrid.dev/attempt"
WORKER_LABEL = "taugrid.dev/worker"
"""On a TauRunLog: which worker's log it keeps (0 is the first pod, or a ray run's head)."""
RERUN_OF_ANNOTATION = "taugrid.dev/rerun-of"
"""On a TauRun made by `POST …/rerun`: the run it reruns, as JSON (name, uid, specHash,
imageID), which the new run's evidence repeats."""
CONFIG_HASH_ANNOTATION = "taugrid.dev/config-hash"
CANCEL_ANNOTATION = "taugrid.dev/cancel-requested"
"""Set (to who asked, and when) by `DELETE /v1/runs/...` or `kubectl annotate`: cancel."""
IDEMPOTENCY_ANNOTATION = "taugrid.dev/idempotency-key"
SUBMITTED_BY_ANNOTATION = "taugrid.dev/submitted-by"
MANAGED_BY_ANNOTATION = "taugrid.dev/managed-by"
DEFAULT_RUN_MANAGER = "taugrid.dev/controller"
RESUME_PRIORITY_CLASS = "taugrid-resume"
"""The WorkloadPriorityClass of resumed attempts: the controller's alone."""

# ---------------------------------------------------------------- Events
NODE_EVENT_CONTROLLER = "taugrid.dev/controller"
"""The `reportingController` of the Events on Nodes and the Lease."""
ADMISSION_EVENT_CONTROLLER = ADMISSION_CHECK_CONTROLLER
"""The `reportingController` of the Events on Workloads."""


def quarantined(annotations: Mapping[str, object]) -> bool:
    """Whether a Node's annotations say we quarantined it."""
    return bool(annotations.get(QUARANTINED_BY_ANNOTATION))


def quarantine_failed(annotations: Mapping[str, object]) -> bool:
    """Whether a Node's quarantine record says a GPU failed (`"failed": true`), which ends
    the run attempts on it at once; an unreadable record says no."""
    raw = annotations.get(QUARANTINE_ANNOTATION)
    if not isinstance(raw, str):
        return False
    try:
        record = json.loads(raw)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and record.get("failed") is True
