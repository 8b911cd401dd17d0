"""What the fleet API takes and answers, as models: the OpenAPI document is generated from
them, and the path, query and body models are the ones that validate (DESIGN.md section 4).

The answer models describe the JSON the handlers build; they are published, not run on
every answer (the OpenAPI fuzzer checks the answers against them).
"""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic

from controller import wire
from controller.fleet import actions, relays, reports
from controller.fleet import state as fleet_state
from shared import heartbeat, patterns
from shared import spec as specs

Wire = wire.Wire
Params = wire.Lenient
"""Path or query parameters: unknown ones are ignored, as HTTP clients expect."""


# ---------------------------------------------------------------- parameters
class NodePath(Params):
    """A node in the path: `/v1/nodes/{name}`."""

    name: specs.ObjectName
    """The Node's name (a DNS-1123 subdomain)."""


class NodesQuery(Params):
    """Filters of `GET /v1/nodes`."""

    state: fleet_state.NodeState | None = None
    """Only nodes in this state."""


class DiagQuery(Params):
    """Parameters of `POST /v1/nodes/{name}/diag`."""

    level: Literal[1, 2, 3] = 1
    """DCGM diagnostic level: 1 (seconds), 2 (about 2 minutes), 3 (about 15 minutes); above 1
    only on an idle or quarantined node (the agent refuses 409 NodeBusy otherwise)."""


GPU_REF_PATTERN = r"[0-9]{1,4}|(?:GPU|MIG)-[0-9A-Za-z-]{1,100}"
"""A GPU as the agent's release takes it: an index, or a GPU or MIG UUID (agent/app.py)."""
FAULT_CODE_PATTERN = r"[A-Za-z0-9_.:-]{1,64}"
"""A latched fault's code, as the agent's release takes it."""


GpuRef = Annotated[
    str,
    pydantic.StringConstraints(pattern=patterns.rust(GPU_REF_PATTERN)),
    pydantic.Field(json_schema_extra={"pattern": patterns.schema(GPU_REF_PATTERN)}),
]
FaultCode = Annotated[
    str,
    pydantic.StringConstraints(pattern=patterns.rust(FAULT_CODE_PATTERN)),
    pydantic.Field(json_schema_extra={"pattern": patterns.schema(FAULT_CODE_PATTERN)}),
]


class LatchReleaseQuery(Params):
    """Parameters of `POST /v1/nodes/{name}/agent/release` (the agent's `POST /v1/release`)."""

    gpu: GpuRef | None = None
    """Only this GPU (index or UUID); every GPU when absent."""
    code: FaultCode | None = None
    """Only faults of this code (`RowRemapFailure`); every latched fault when absent."""
    force: bool = False
    """Release faults other than Inspect too (those a reset or a reboot clears)."""


# ---------------------------------------------------------------- bodies
Reason = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=1024)]
"""Why an on-call engineer acts: kept with what it changed."""


class QuarantineRequest(Wire):
    """Body of the on-call quarantine and release calls."""

    reason: Reason
    """Why (kept in the node's history and its annotations)."""


class BreakerResetRequest(Wire):
    """Body of `POST /v1/fleet/breaker/reset` (optional: a call without a body, as before
    the reason was taken, still resets)."""

    reason: Reason
    """Why the breaker may close now (kept in the breaker's Event and the controller's log)."""


class ModeRequest(Wire):
    """Body of `PUT /v1/fleet/mode`."""

    dry_run: pydantic.StrictBool
    """True: decide and record, change no node."""


class PeerEntry(Wire):
    """One node's entry in a follower's batch (`controller.fleet.relays.WireEntry`, which
    decodes it, is the authority; this model publishes its schema)."""

    node: heartbeat.K8sName
    key: Annotated[
        str,
        pydantic.StringConstraints(pattern=patterns.rust(relays.KEY_PATTERN)),
        pydantic.Field(json_schema_extra={"pattern": patterns.schema(relays.KEY_PATTERN)}),
    ]
    """The report's change key (`reports.change_key`)."""
    boot_id: Annotated[str, pydantic.StringConstraints(min_length=1, max_length=64)]
    sequence: Annotated[int, pydantic.Field(ge=0, le=heartbeat.MAX_SEQUENCE)]
    sent_at: heartbeat.Timestamp
    received_ago_ms: Annotated[int, pydantic.Field(ge=0, le=2**31 - 1)]
    """How long before the batch was sent the last report it stands for reached the follower."""
    first_ago_ms: Annotated[int, pydantic.Field(ge=0, le=2**31 - 1)]
    """The same for the first report it coalesced."""
    report: heartbeat.Heartbeat | None = None
    """The full report (a change, a refresh, or what the leader needed); absent: liveness."""
    caller: Annotated[str, pydantic.StringConstraints(min_length=1, max_length=6000)] | None = None
    """The agent the follower reviewed, encoded as in `X-TauGrid-Caller`; with `report`."""


class PeerBatch(Wire):
    """Body of `POST /v1/peer/heartbeats`."""

    entries: Annotated[list[PeerEntry], pydantic.Field(max_length=10_000)]


# ---------------------------------------------------------------- answers
class HeartbeatAccepted(Wire):
    """A heartbeat taken in (a replay of one already taken is accepted too)."""

    accepted: bool
    node: str
    sequence: int
    relayed: Literal["change", "liveness"] | None = None
    """On a follower: how it relayed the report (`change`: the leader took it before this
    answer; `liveness`: it goes in the next batch)."""


class PeerRefusal(Wire):
    """Why the leader refused one entry of a batch."""

    index: int
    node: str
    status: int
    code: str
    message: str
    field: str


class PeerAnswer(Wire):
    """What the leader made of a follower's batch, entry by entry."""

    outcomes: list[reports.Relayed]
    need: list[str]
    """Nodes whose full report the leader needs (the follower sends it at once)."""
    refused: list[PeerRefusal]


class QuarantineView(Wire):
    """TauGrid's quarantine of a node."""

    mode: str
    by: str
    at: str | None
    reason: str
    clears_with: str
    evict_after: str | None


class HistoryEntry(Wire):
    """One action TauGrid took on the node (the last 20 are kept on it)."""

    at: str
    action: str
    reason: str
    by: str
    message: str


class ConditionView(Wire):
    """The node's GPUHealthy condition."""

    status: str
    reason: str
    message: str


class NodeSummary(Wire):
    """A GPU node as `GET /v1/nodes` lists it."""

    name: str
    state: str
    reason: str
    message: str
    last_heartbeat: str | None
    boot_id: str | None
    agent_url: str | None
    """The node's agent, at the address of the pod its token is bound to (derived by the
    controller, never taken from a heartbeat); empty until that pod has been read."""
    managed: bool
    unschedulable: bool
    cordoned_by_us: bool
    tainted: bool
    gpu_capacity: int
    quarantine: QuarantineView | None
    in_cluster: bool
    fenced_gpus: int
    """GPUs of a DRA node under device quarantine (DeviceTaintRules of ours)."""


class EvictionView(Wire):
    """kube-controller-manager's EvictionInProgress condition on a DeviceTaintRule."""

    status: str
    message: str


class DeviceRuleView(Wire):
    """One DeviceTaintRule of ours on a GPU."""

    name: str
    key: str
    effect: str
    time_added: str | None
    eviction_in_progress: EvictionView | None


class FencedGpuView(Wire):
    """A GPU of a DRA node under device quarantine."""

    device: str
    """The device's name in its ResourceSlice."""
    gpu_uuid: str
    dry_run: bool
    """Every rule has effect None: what NoExecute would evict is reported, nothing is."""
    reason: str
    message: str
    since: str | None
    clears_with: str | None
    clears: str
    """What clears it, in words."""
    healthy_since: str | None
    release_at: str | None
    rules: list[DeviceRuleView]


class NodeDetail(NodeSummary):
    """One node: per-GPU detail, its quarantine, fenced GPUs, history and problems."""

    devices: list[FencedGpuView]
    gpus: list[heartbeat.GpuReport]
    history: list[HistoryEntry]
    problems: list[str]
    condition: ConditionView | None


class NodeList(Wire):
    """The fleet's GPU nodes."""

    items: list[NodeSummary]


class FleetView(Wire):
    """The breaker, dry-run mode and the fleet's counts."""

    leader: str
    dry_run: bool
    breaker: actions.BreakerState
    nodes: int
    quarantined: int
    max_quarantined: int | None
    states: dict[str, int]
    devices: DeviceCounts


class DeviceCounts(Wire):
    """Device quarantine (DRA): the GPU mode, its breaker and the device counts."""

    gpu_mode: str
    breaker: actions.BreakerState
    dra_nodes: int
    gpus: int
    quarantined: int
    max_quarantined: int | None


class AgentAnswer(pydantic.BaseModel):
    """The agent's own JSON answer, relayed as it is (agent/app.py, docs/oncall.md): for
    `/gpus`, its `/v1/gpus` document; for `/diag`, `{started, level}`; for
    `/agent/release`, `{released: [...]}`."""

    model_config = pydantic.ConfigDict(extra="allow")
