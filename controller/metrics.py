"""Controller metrics, in a registry of the app's own (never the process-global one)."""

from __future__ import annotations

import dataclasses
import functools

import prometheus_client as prom

FAULT_TO_QUARANTINE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)


@dataclasses.dataclass
class ControllerMetrics:
    """Every family the controller exports."""

    registry: prom.CollectorRegistry
    heartbeats: prom.Counter
    heartbeat_seconds: prom.Histogram
    node_verdicts: prom.Gauge
    quarantine_actions: prom.Counter
    quarantined_nodes: prom.Gauge
    breaker_open: prom.Gauge
    dry_run: prom.Gauge
    is_leader: prom.Gauge
    fault_to_quarantine: prom.Histogram
    evictions: prom.Counter
    pass_seconds: prom.Histogram
    pass_nodes: prom.Histogram
    auth_cache: prom.Counter
    runs: prom.Gauge
    run_queue_seconds: prom.Histogram
    run_attempts: prom.Counter
    run_decisions: prom.Counter
    run_resumes: prom.Counter
    checkpoints: prom.Counter
    run_submissions: prom.Counter
    admission_decisions: prom.Counter
    admission_check_active: prom.Gauge
    pass_failures: prom.Counter
    quarantined_devices: prom.Gauge
    gpus_kept: prom.Gauge
    device_breaker_open: prom.Gauge
    fault_to_device_rule: prom.Histogram
    api_writes: prom.Counter
    api_write_wait: prom.Histogram
    api_writes_waiting: prom.Gauge
    relayed: prom.Counter
    relay_batch: prom.Histogram
    peer_entries: prom.Counter
    _heartbeat_outcomes: dict[str, prom.Counter] = dataclasses.field(
        default_factory=dict, init=False, repr=False
    )

    def count_heartbeat(self, outcome: str) -> None:
        """One heartbeat by outcome; the label's child is looked up once (`labels` costs
        a few µs, on the hot path)."""
        child = self._heartbeat_outcomes.get(outcome)
        if child is None:
            child = self._heartbeat_outcomes[outcome] = self.heartbeats.labels(outcome)
        child.inc()


def make_metrics() -> ControllerMetrics:
    """Create the families in a fresh registry."""
    r = prom.CollectorRegistry(auto_describe=True)
    counter = functools.partial(prom.Counter, registry=r)
    gauge = functools.partial(prom.Gauge, registry=r)
    histogram = functools.partial(prom.Histogram, registry=r)
    return ControllerMetrics(
        registry=r,
        heartbeats=counter(
            "taugrid_heartbeats",
            "Heartbeats received, by outcome (accepted, relayed, forwarded, rejected).",
            ["outcome"],
        ),
        heartbeat_seconds=histogram(
            "taugrid_heartbeat_handle_seconds",
            "Time to handle one heartbeat, authentication included.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
        ),
        node_verdicts=gauge(
            "taugrid_nodes",
            "GPU nodes by state as the leader judges them.",
            ["state"],
        ),
        quarantine_actions=counter(
            "taugrid_quarantine_actions",
            "Quarantine actions taken (or recorded in dry run), by kind.",
            ["action", "dry_run"],
        ),
        quarantined_nodes=gauge(
            "taugrid_quarantined_nodes",
            "Nodes currently quarantined by TauGrid.",
        ),
        breaker_open=gauge(
            "taugrid_quarantine_breaker_open",
            "1 while the quarantine circuit breaker is open (no new quarantines).",
        ),
        dry_run=gauge(
            "taugrid_quarantine_dry_run",
            "1 while quarantine runs in dry-run mode.",
        ),
        is_leader=gauge(
            "taugrid_controller_leader",
            "1 on the replica that holds the leader Lease.",
        ),
        fault_to_quarantine=histogram(
            "taugrid_fault_to_quarantine_seconds",
            "Time from the agent's fault report to the node being tainted and cordoned.",
            buckets=FAULT_TO_QUARANTINE_BUCKETS,
        ),
        evictions=counter(
            "taugrid_evictions",
            "Pod evictions requested through the Eviction API, by outcome.",
            ["outcome"],
        ),
        pass_seconds=histogram(
            "taugrid_quarantine_pass_seconds",
            "Duration of one quarantine pass (of what changed, or a full one).",
        ),
        pass_nodes=histogram(
            "taugrid_quarantine_pass_nodes",
            "Nodes one quarantine pass judged: `changed` (inputs changed, deadline came, or"
            " something left to do) or `full` (every node, on the slow timer).",
            ["kind"],
            buckets=(0, 1, 4, 16, 64, 256, 1024, 4096, 16384, 65536),
        ),
        auth_cache=counter(
            "taugrid_auth_reviews",
            "Token and access reviews, by kind, whether the cache answered, and outcome"
            " (allowed, denied, shed by a cap or rate, failed).",
            ["kind", "cached", "outcome"],
        ),
        runs=gauge(
            "taugrid_runs",
            "TauRuns by phase and LocalQueue, as of the last reconciler pass.",
            ["phase", "queue"],
        ),
        run_queue_seconds=histogram(
            "taugrid_run_queue_seconds",
            "Time from a run's attempt being queued to Kueue admitting it.",
            buckets=(0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600),
        ),
        run_attempts=counter(
            "taugrid_run_attempts",
            "Run attempts, by outcome (started, succeeded, or the failure class).",
            ["outcome"],
        ),
        run_decisions=counter(
            "taugrid_run_decisions",
            "Runs a run pass looked at: `decided`, or `kept` (nothing it reads changed since"
            " a step that wrote nothing, so it was not decided again).",
            ["kind"],
        ),
        run_resumes=counter(
            "taugrid_run_resumes",
            "Attempts started automatically after a failure, by the failure class.",
            ["failure_class"],
        ),
        checkpoints=counter(
            "taugrid_checkpoints_reported",
            "Checkpoint reports accepted from runs.",
        ),
        run_submissions=counter(
            "taugrid_run_submissions",
            "POST /v1/runs calls by outcome (created, replayed, conflict, invalid, forbidden).",
            ["outcome"],
        ),
        admission_decisions=counter(
            "taugrid_admission_decisions",
            "States the gpu-health admission check wrote on Workloads (Ready, Retry, Pending).",
            ["state"],
        ),
        pass_failures=counter(
            "taugrid_pass_failures",
            "Passes of a control loop (quarantine, admission, runs) that failed and were retried.",
            ["loop"],
        ),
        admission_check_active=gauge(
            "taugrid_admission_check_active",
            "1 while this replica keeps the gpu-health AdmissionCheck Active (the leader).",
        ),
        quarantined_devices=gauge(
            "taugrid_quarantined_devices",
            "GPUs fenced by TauGrid's DeviceTaintRules (device quarantine on DRA nodes).",
        ),
        gpus_kept=gauge(
            "taugrid_gpus_kept_schedulable",
            "Healthy GPUs on nodes with a fenced GPU: what node quarantine would have taken"
            " out of service and device quarantine keeps schedulable.",
        ),
        device_breaker_open=gauge(
            "taugrid_device_breaker_open",
            "1 while the device quarantine breaker is open (no new devices fenced).",
        ),
        fault_to_device_rule=histogram(
            "taugrid_fault_to_device_rule_seconds",
            "Time from the first report of a GPU's fault to its DeviceTaintRules existing.",
            buckets=FAULT_TO_QUARANTINE_BUCKETS,
        ),
        api_writes=counter(
            "taugrid_api_writes",
            "Writes sent to the API server, by class (lease, review, node, run, event, eviction).",
            ["class"],
        ),
        api_write_wait=histogram(
            "taugrid_api_write_wait_seconds",
            "Time a write waited for the API write budget, by class.",
            ["class"],
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        ),
        api_writes_waiting=gauge(
            "taugrid_api_writes_waiting",
            "Writes waiting for the API write budget now.",
        ),
        relayed=counter(
            "taugrid_heartbeats_relayed",
            "Heartbeat entries a follower sent the leader, by how: `full` (a change, a"
            " refresh, or what the leader needed) or `liveness` (a steady report's summary).",
            ["kind"],
        ),
        relay_batch=histogram(
            "taugrid_heartbeat_relay_batch_entries",
            "Entries in one batch a follower sent the leader (POST /v1/peer/heartbeats).",
            buckets=(1, 2, 4, 16, 64, 256, 1024, 4096),
        ),
        peer_entries=counter(
            "taugrid_peer_heartbeat_entries",
            "Entries of followers' batches the leader took, by kind (full, liveness) and"
            " outcome (Accepted, Replay, Need, Outdated, Refused).",
            ["kind", "outcome"],
        ),
    )
