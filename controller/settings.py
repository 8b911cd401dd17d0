"""The controller's settings: one class per process, environment prefix `TAUGRID_CONTROLLER_`,
in sections (kopf's `OperatorSettings`, Kueue's `Configuration`): each section declares its
fields once, and each domain takes its own (`ControllerSettings.fleet`, `.runs` …)."""

from __future__ import annotations

import functools
import ipaddress
import urllib.parse
from typing import Literal, TypeVar

import pydantic
import pydantic_settings

from controller import marks


class Section(pydantic.BaseModel):
    """A section of the settings: frozen, unknown fields refused."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid")


class ApiSettings(Section):
    """Serving the API: listeners, TLS, the leader, callers and their limits, timeouts."""

    host: str = "0.0.0.0"  # noqa: S104  (in a pod every interface is the pod's own)
    """Address to listen on. In a pod every interface is the pod's own."""
    port: int = pydantic.Field(default=8080, ge=0, le=65535)
    """HTTP(S) port of the API (DESIGN.md section 4). 0 picks a free port (tests)."""
    advertise_url: str = ""
    """URL other replicas and agents reach this replica at; written into the Lease when leading.
    Empty means `http(s)://<POD_IP or host>:<port>`, or the name below with `advertise_domain`."""
    advertise_domain: str = ""
    """DNS domain of a headless Service over the replicas (the chart's
    `<fullname>-controller-pods.<namespace>.svc.<clusterDomain>`). With it and `POD_IP`, an
    empty `advertise_url` becomes `http(s)://<POD_IP, dots as dashes>.<domain>:<port>`: the
    name Kubernetes DNS gives each endpoint of a headless Service, which a certificate for
    `*.<domain>` covers, as no certificate covers a pod's IP. Empty advertises the IP."""
    tls_cert_file: str = ""
    """PEM certificate; with `tls_key_file` the API serves HTTPS. Plain HTTP is refused on
    anything but loopback unless `allow_insecure_http` is set (the dev cluster's loopback)."""
    tls_key_file: str = ""
    """PEM private key matching `tls_cert_file`."""
    tls_reload_interval_s: float = pydantic.Field(default=60.0, gt=0)
    """How often the certificate files are checked; a renewed pair (cert-manager, a replaced
    Secret) is served from the next handshake on, without a restart."""
    tls_ca_file: str = ""
    """PEM bundle of the CA that issued the replicas' certificates (the chart's). A follower
    verifies the leader against it alone, never the system store: any publicly trusted
    certificate would otherwise pass. Also what run pods trust unless `run_ca_file` is set."""
    allow_insecure_http: bool = False
    """Serve plain HTTP on a non-loopback address, and reach the leader over plain HTTP;
    only behind a proxy or mesh that terminates TLS."""
    leader_url: str = ""
    """Where a follower sends what only the leader can do (heartbeats, on-call calls, run
    writes): the chart's leader-only Service, `https://<fullname>-controller-leader.<ns>.svc:
    <port>`, whose selector matches the label the leader keeps on its own pod. A bare origin
    (no path); https is verified with `tls_ca_file` alone; http only on loopback (the dev
    cluster) or with `allow_insecure_http`. Empty: a follower answers such calls 503
    NotLeader. Nothing read from the cluster (the Lease's annotation) ever replaces it."""
    peer_token_file: str = ""
    """The projected ServiceAccount token (audience `peer_audience`) a follower presents to
    the leader, in place of any caller's credential, with the caller it reviewed in the
    `X-TauGrid-Caller` header; re-read when the kubelet rotates it."""
    peer_audience: str = "taugrid-peer"
    """Audience of the replicas' peer tokens; the leader reviews them with it."""
    forward_timeout_s: float = pydantic.Field(default=10.0, gt=0)
    """How long a follower waits for the leader's answer before it answers 503."""
    token_audience: str = "taugrid"  # noqa: S105  (an audience name, not a secret)
    """Audience the agents' projected tokens carry; TokenReview checks it."""
    user_audiences: tuple[str, ...] = ()
    """Audiences a person's token (researcher, on-call) must carry, checked by TokenReview.
    Empty accepts the API server's own audiences, so `kubectl create token` and OIDC tokens
    work as they are. A dedicated audience (`kubectl create token --audience taugrid-api`,
    an OIDC client id) keeps a token that leaks at TauGrid from being a Kubernetes
    credential (docs/security.md). Either way a token is only ever sent to TokenReview."""
    auth_cache_ttl_s: float = pydantic.Field(default=60.0, ge=0)
    """How long a SubjectAccessReview answer is reused. A minute bounds how long a revoked
    permission lingers while keeping a busy endpoint from loading the API server."""
    token_cache_max_s: float = pydantic.Field(default=300.0, ge=0)
    """Upper bound on reusing a TokenReview answer (also capped by the token's expiry)."""
    bound_token_cache_max_s: float = pydantic.Field(default=60.0, ge=0)
    """Upper bound on reusing the answer for a pod-bound token whose pod the controller does
    not watch (a run's token): such a token stops working when its pod is deleted, and a
    minute bounds how long a deleted pod's token is still taken here (review L7). Tokens
    bound to the install namespace's pods (agents, replicas) are forgotten when the watch
    sees their pod deleted, and kept up to token_cache_max_s otherwise."""
    log_streams_per_identity: int = pydantic.Field(default=4, ge=1)
    """Concurrent `logs` calls one identity may hold open on a replica; more are 429. Four
    lets a researcher follow a multi-worker run's workers side by side."""
    log_streams_max: int = pydantic.Field(default=64, ge=1)
    """Concurrent `logs` calls a replica serves in all (429 beyond); also the size of the
    connection pool they have to themselves, so streams never wait behind, nor take from,
    the connections the lease, the quarantine loop and the reviews use."""
    expensive_reads_per_identity: int = pydantic.Field(default=2, ge=1)
    """Concurrent run lists and `/v1/queues` calls (several API reads each) one identity may
    have in flight; more are 429."""
    review_rate_per_source: float = pydantic.Field(default=5.0, gt=0)
    """TokenReviews per second a source address may cause with tokens this replica has not
    seen (or a TauRun read for an unseen run token) before it is answered 429: what an
    unauthenticated caller can make the API server do. Tokens already reviewed cost nothing."""
    review_burst_per_source: int = pydantic.Field(default=20, ge=1)
    """How many such reviews a source address may cause at once before the rate applies."""
    reports_per_s_per_run: float = pydantic.Field(default=10.0, gt=0)
    """Results and checkpoint reports one caller may make for one run per second, refilled
    (429 `RateLimited` past it): each costs a read of the TauRun from the API server, so a
    run's pod reporting in a tight loop is slowed, not the API server (security review 3,
    finding 10). `tau result` batches points; a training loop reports far less often."""
    reports_burst_per_run: int = pydantic.Field(default=50, ge=1)
    """How many such reports a caller may make for a run at once before the rate applies."""
    spec_parses_per_identity: int = pydantic.Field(default=2, ge=1)
    """Submissions one caller may have being parsed at once (a body is up to 1 MiB of YAML;
    a parse holds a worker thread); past it 429 `TooMany` (security review 3, finding 10)."""
    spec_parses_max: int = pydantic.Field(default=4, ge=1)
    """Submissions a replica parses at once over all callers (fewer than the default thread
    pool's workers, so other work that needs a thread is never queued behind parses)."""
    reviews_in_flight_max: int = pydantic.Field(default=64, ge=1)
    """TokenReviews this replica has in flight at once; a caller whose token needs one past
    it is answered 503 `ReviewBusy` at once and retries, rather than queueing reviews the API
    server cannot answer in time (they would fail, go uncached and be asked again)."""
    access_reviews_per_identity: int = pydantic.Field(default=8, ge=1)
    """SubjectAccessReviews one username may have in flight on a replica (answers not yet
    cached); a call that needs one past it is answered 429 naming this limit. A caller naming
    a new `?namespace=` in every request buys one review each, so this bounds what one
    caller can make the API server do at once (security review 3, finding 1)."""
    access_reviews_in_flight_max: int = pydantic.Field(default=64, ge=1)
    """SubjectAccessReviews a replica has in flight at once, over all callers; past it 429."""
    max_body_bytes: int = pydantic.Field(default=1 << 20, gt=0)
    """Request bodies above this are refused with 413 (DESIGN.md section 4: 1 MiB)."""
    handler_timeout_s: float = pydantic.Field(default=30.0, gt=0)
    """Every non-streaming handler gives up after this long with 504."""
    shutdown_grace_s: float = pydantic.Field(default=5.0, ge=0)
    """On SIGTERM, seconds between readiness going false and the listeners closing: the
    time the endpoints controller needs to take this replica out of its Services."""
    http_idle_timeout_s: float = pydantic.Field(default=10.0, gt=0, le=3600)
    """A connection that has not sent a complete request head this long after it opened,
    or after the last response on it, is closed: it bounds both a slow or silent request
    head and an idle keep-alive connection (aiohttp's keep-alive timer, whose default is an
    hour: 40 connections trickling header bytes and 40 sending nothing all held their
    sockets; security review 3, finding 14). Above the agents' heartbeat interval (5 s), so
    their kept connections are reused; keep a proxy's upstream idle timeout below it."""
    tls_handshake_timeout_s: float = pydantic.Field(default=10.0, gt=0, le=600)
    """A TLS connection that has not finished its handshake this long after it opened is
    closed (asyncio's default is 60 s); the head timeout above starts after it."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """structlog level."""
    log_json: bool | None = None
    """JSON logs (None: JSON unless stderr is a terminal)."""


class KubeSettings(Section):
    """The Kubernetes side: the API server, namespace, Lease and write budgets."""

    controller_service_account: str = "taugrid-controller"
    """The replicas' ServiceAccount in `namespace`: only its peer tokens may speak for a
    caller a follower has already authenticated and authorised."""
    pod_name: str = ""
    """This replica's pod (the chart sets it from the downward API). The leader labels it
    `taugrid.dev/leader=true` and removes the label when it stops leading, so the
    leader-only Service reaches the leader alone. Empty: no pod to label (a host process)."""
    kubeconfig: str = ""
    """Kubeconfig path; empty means the in-cluster ServiceAccount."""
    namespace: str = "taugrid-system"
    """Install namespace: the Lease, Events of our own, and the agent ServiceAccount live here."""
    agent_service_account: str = "taugrid-agent"
    """Name of the agents' ServiceAccount in `namespace`; only its tokens may send heartbeats."""
    lease_name: str = "taugrid-controller"
    """Lease used for leader election."""
    identity: str = ""
    """This replica's identity in the Lease; empty means `<hostname>-<random>`."""
    lease_duration_s: float = pydantic.Field(default=15.0, gt=0)
    """How long a Lease stays valid without renewal. 15 s is client-go's default: long enough
    to ride out an API-server hiccup, short enough that a failover takes seconds."""
    renew_deadline_s: float = pydantic.Field(default=10.0, gt=0)
    """A leader that cannot renew within this time steps down (must be < lease_duration_s)."""
    retry_period_s: float = pydantic.Field(default=2.0, gt=0)
    """How often candidates try to acquire and leaders renew."""
    api_timeout_s: float = pydantic.Field(default=10.0, gt=0)
    """Every call to the API server gives up after this long (a watch: its own server-side
    timeout plus 30 s of silence; a followed log: this long to connect), so no caller and no
    loop waits forever on a pooled connection or a stuck API server. Lease calls are bounded
    by `renew_deadline_s` as well."""
    api_writes_per_s: float = pydantic.Field(default=100.0, gt=0)
    """The API write budget of this replica, refilled per second (client-side, like
    client-go's QPS): every POST, PUT, PATCH and DELETE we send spends one token, and writes
    that find none wait, served lease first, then node and device writes, runs, Events,
    evictions (`controller.budget`). Reviews spend `api_reviews_per_s` instead."""
    api_write_burst: int = pydantic.Field(default=300, ge=1)
    """Writes this replica may send at once before the rate applies (client-go's burst)."""
    api_write_aging_s: float = pydantic.Field(default=2.0, gt=0)
    """A write waiting this long is promoted one class, so a long storm starves nothing."""
    api_evictions_per_s: float = pydantic.Field(default=20.0, gt=0)
    """Evictions per second at most, within the budget: a big drain is paced."""
    api_eviction_burst: int = pydantic.Field(default=40, ge=1)
    """Evictions at once before their pace applies."""
    api_reviews_per_s: float = pydantic.Field(default=100.0, gt=0)
    """The reviews' own budget, refilled per second: TokenReviews and SubjectAccessReviews
    (which any authenticated caller can cause) never spend the write budget above, so a flood
    of them never delays the Lease renewal or a quarantine write (security review 3,
    finding 1). Reviews past it wait, at most `api_timeout_s`. As large as the write budget,
    which reviews shared before: a fleet's (or a new leader's) first TokenReviews, one per
    node, take no longer than they did (`bench/quarantine.py --burst`, issue 29)."""
    api_review_burst: int = pydantic.Field(default=300, ge=1)
    """Reviews this replica may send at once before `api_reviews_per_s` applies."""


class FleetSettings(Section):
    """Node quarantine (the fleet policy's `Settings`), heartbeats, calls to agents."""

    # Heartbeat relay (a follower sends the leader changes at once and liveness in batches).
    heartbeat_relay: bool = True
    """On a follower, relay heartbeats (a change in full at once, the agent waiting for the
    leader's answer; a steady report as liveness in the next batch) instead of forwarding
    each one. Off only to compare the two (bench/fleet_ingest.py)."""
    peer_batch_interval_s: float = pydantic.Field(default=1.0, gt=0, le=60)
    """How often a follower sends the leader its pending liveness entries (a change goes at
    once, with whatever is pending). Must stay well below a staleAfter (3 × the agents'
    interval): the leader sees a steady node's receipt at most this late."""
    peer_batch_max_entries: int = pydantic.Field(default=500, ge=1, le=10_000)
    """Entries in one batch; more are split into several requests. A batch holding only
    liveness entries is ~150 bytes each; full 8-GPU reports ~2 KiB."""
    peer_full_refresh_s: float = pydantic.Field(default=60.0, gt=0)
    """A follower sends each node's full report at least this often, so the leader's GPU
    readings (the on-call API shows them) are never older than this."""
    peer_unreachable_after_s: float = pydantic.Field(default=5.0, gt=0)
    """When a follower's flushes have failed this long, its agents' steady heartbeats are
    answered 503 LeaderUnreachable (as a forward would be) instead of 202, so they see it."""
    peer_max_body_bytes: int = pydantic.Field(default=8 * 1024 * 1024, ge=64 * 1024)
    """Largest `POST /v1/peer/heartbeats` body the leader reads; a follower splits batches
    below it. At least `max_body_bytes` plus 64 KiB, so one report of the largest size fits."""
    heartbeat_min_interval_s: float = pydantic.Field(default=1.0, gt=0)
    """Shortest `intervalS` a heartbeat may announce. The chart's agents report every 5 s; a
    shorter interval would make a node stale after a few hundred milliseconds of silence."""
    heartbeat_max_interval_s: float = pydantic.Field(default=300.0, gt=0, le=3600)
    """Longest `intervalS` a heartbeat may announce: a node is stale only after 3 intervals
    without a report, so one forged `intervalS: 3600` would hide a dead node for 3 hours
    (security review M6). The chart's `agent.heartbeatIntervalS` must lie in this range."""
    heartbeat_max_skew_s: float = pydantic.Field(default=300.0, gt=0)
    """How far a heartbeat's `sentAt` may be from the controller's clock, either way. One report
    dated 2099 would otherwise make every genuine report after it look like a replay."""
    agent_port: int = pydantic.Field(default=9400, ge=1, le=65535)
    """Port of the agents' API; with the pod IP the agent's token is bound to, it makes the
    `agentUrl` the on-call API shows (the chart's `agent.port`)."""
    agent_scheme: Literal["http", "https"] = "http"
    """Scheme of the agents' API in that URL, and of the on-call calls the controller makes
    to an agent for its caller (`/v1/nodes/{name}/gpus`, `/diag`, `/agent/release`); https is
    verified with `tls_ca_file` alone, as the leader is. The chart's agents serve http."""
    agent_token_file: str = ""
    """The projected ServiceAccount token (the chart's: audience `taugrid-agent`, bound to
    this pod, renewed by the kubelet) the controller presents to an agent when it makes an
    on-call call for a caller: never the caller's credential, and never a token the API
    server or the leader accepts, so an agent that keeps it holds nothing beyond the agents'
    own API. Empty: the calls go without a token (the agent then hides pod names, and
    refuses diagnostics and releases: 502 naming this setting)."""
    agent_timeout_s: float = pydantic.Field(default=5.0, gt=0, le=60)
    """How long the controller waits for an agent's whole answer before it answers 504. Well
    below `forward_timeout_s`, so a call a follower forwards gets the leader's 504, not its
    own 503; an agent answers from memory (a diagnostic is only started)."""
    agent_max_response_bytes: int = pydantic.Field(default=4 * 1024 * 1024, ge=64 * 1024)
    """Largest agent answer relayed; a larger one is 502. An 8-GPU `/v1/gpus` with its recent
    events is ~100 KiB; the cap keeps one agent from filling the controller's memory."""
    node_selector: str = ""
    """Label selector of the nodes this controller manages (empty: every node; GPU nodes are
    those advertising `nvidia.com/gpu`). Lets one API server host several fleets, and tests."""
    pass_interval_s: float = pydantic.Field(default=1.0, gt=0)
    """Upper bound between two quarantine passes; heartbeats with a change trigger one at once.
    A pass judges only the nodes whose inputs changed or whose deadline came."""
    full_pass_interval_s: float = pydantic.Field(default=30.0, gt=0)
    """How often a quarantine pass judges every node again, a run pass decides every run and
    the admission gate every waiting Workload again, level-triggered: the safety net under the
    passes that look only at what changed."""
    dry_run: bool = False
    """Start in dry-run mode: decide and record, but change no node. Settable at runtime."""
    max_quarantined_fraction: float = pydantic.Field(default=0.2, gt=0, le=1)
    """At most this share of GPU nodes quarantined by us at once (at least one node)."""
    max_quarantined: int | None = pydantic.Field(default=None, ge=1)
    """Absolute cap on quarantined nodes; overrides the fraction when set."""
    breaker_percent: float = pydantic.Field(default=50.0, gt=0, le=100)
    """The breaker opens when more than this share of nodes turn bad or stale in the window."""
    breaker_window_s: float = pydantic.Field(default=300.0, gt=0)
    """Sliding window for the breaker (5 min, as NVSentinel's default)."""
    breaker_healthy_close_s: float = pydantic.Field(default=1800.0, gt=0)
    """An open breaker closes on its own after the fleet has been healthy this long."""
    breaker_min_nodes: int = pydantic.Field(default=2, ge=1)
    """The breaker never opens for fewer nodes than this: one node is a fault, not a storm."""
    stale_multiplier: float = pydantic.Field(default=3.0, gt=1)
    """A node is stale after this many of its agent's heartbeat intervals without a report;
    3 tolerates two lost reports in a row."""
    default_interval_s: float = pydantic.Field(default=10.0, gt=0)
    """The agent interval assumed for a node that never reported to this leader (once it
    reports, its own `intervalS` counts). 10 s is twice the agent's default, so a new leader
    waits longer, not shorter, before it calls such a node silent."""
    stale_quarantine_after_s: float = pydantic.Field(default=600.0, ge=0)
    """A stale node is quarantined only after being stale this long (10 min, like the clouds'
    NotReady repair waits): silence is weaker evidence than a fault."""
    release_after_s: float = pydantic.Field(default=300.0, ge=0)
    """A node whose latched fault cleared must report healthy this long before release."""
    evict_grace_s: float = pydantic.Field(default=30.0, ge=0)
    """Failed nodes: wait this long after cordon before evicting, so jobs can checkpoint."""
    degraded_drain_after_s: float = pydantic.Field(default=1800.0, ge=0)
    """Degraded nodes: running work continues this long, then is evicted."""
    eviction_retry_s: float = pydantic.Field(default=5.0, gt=0)
    """Seconds between eviction rounds on a node whose last round left pods (refused 429 by a
    PodDisruptionBudget, 409, or an error); a round that left nothing is swept again only
    after `full_pass_interval_s` (`controller.fleet.evictions`)."""


class DeviceSettings(Section):
    """Device quarantine on a DRA fleet: the GPU request mode and the limits."""

    gpu_mode: Literal["auto", "dra", "device-plugin"] = "auto"
    """How the cluster's GPUs are advertised (DESIGN.md section 2). `auto`: a node whose
    GPUs NVIDIA's DRA driver lists in ResourceSlices gets device quarantine, others node
    quarantine; runs ask for GPUs through DRA claims when GPUs are published as DRA devices
    and no managed node advertises `nvidia.com/gpu`, else through the extended resource.
    `dra` or `device-plugin` decide both for the whole cluster."""
    device_quarantine_max_per_node: int = pydantic.Field(default=2, ge=0)
    """A DRA node with more bad GPUs than this is quarantined as a node instead: a third
    GPU failing on one board points at the board, its power or its fabric. 0 turns device
    quarantine off."""
    max_quarantined_devices: int | None = pydantic.Field(default=None, ge=1)
    """Absolute cap on GPUs fenced by device quarantine at once; overrides the fraction."""
    max_quarantined_devices_fraction: float = pydantic.Field(default=0.2, gt=0, le=1)
    """At most this share of the DRA fleet's GPUs fenced at once (at least one), the same
    share as for nodes."""
    device_breaker_percent: float = pydantic.Field(default=25.0, gt=0, le=100)
    """The device breaker opens when more than this share of the DRA fleet's GPUs turned bad
    inside `breaker_window_s`: GPUs failing together point at a common cause (a driver or
    firmware roll-out, a cooling loop), which fencing them one by one would not fix."""
    device_breaker_min_devices: int = pydantic.Field(default=4, ge=1)
    """The device breaker never opens for fewer GPUs than this."""


class AdmissionSettings(Section):
    """The AdmissionCheck the gate answers, and how often."""

    dra_quota_resource: str = pydantic.Field(default=marks.GPU_RESOURCE, min_length=1)
    """The name Kueue's `resources.deviceClassMappings` gives NVIDIA's DeviceClass: the
    admission gate reads a DRA pod set's GPUs from its quota usage under this name."""
    admission_check: str = pydantic.Field(default=marks.DEFAULT_ADMISSION_CHECK, min_length=1)
    """Name of the AdmissionCheck this controller answers (DESIGN.md section 7); it must name
    `taugrid.dev/gpu-health` as its `spec.controllerName`. Another name lets a second
    controller (a test) answer a check of its own on the same cluster."""
    admission_pass_interval_s: float = pydantic.Field(default=1.0, gt=0)
    """Upper bound between two passes of the admission gate. A Workload holds reserved quota
    while it waits for our check, so a second is short enough not to waste it and long
    enough that listing Workloads stays cheap; node changes trigger a pass at once."""
    admission_retry_after_s: float = pydantic.Field(default=15.0, gt=0, le=86400)
    """`requeueAfterSeconds` of a Retry (rounded up to whole seconds): how long Kueue waits
    before it queues a Workload that did not fit on healthy nodes again. Without it Kueue
    retries at once, a hot loop; 15 s lets a quarantine or a release settle first."""


class RunsSettings(Section):
    """Runs: the pass, how attempts are rendered, retries, results, kept logs, Ray."""

    run_device_grace_s: int = pydantic.Field(default=60, ge=0)
    """A run's checkpoint grace on DRA clusters unless its tau.yaml sets `checkpoint.grace`:
    the `tolerationSeconds` of its claims for our `taugrid.dev/gpu-evict` taint, i.e. how
    long it keeps a fenced GPU to reach a checkpoint before kube-controller-manager deletes
    its pod (which then has `run_termination_grace_s` more to exit). A minute, like the
    SIGTERM window: enough for a run that checkpoints often to lose little."""

    allowed_priority_classes: tuple[str, ...] = ()
    """WorkloadPriorityClasses a tau.yaml may name (a platform's allowlist; JSON list in the
    environment). Empty allows any class but the controller's own resume class, which is
    refused either way (the platform's, not a researcher's, to give)."""
    run_namespaces: tuple[str, ...] = ()
    """Namespaces runs may be submitted to (the chart's `controller.runNamespaces`, where it
    grants the controller its run-object rights); a submission elsewhere is 403
    NamespaceNotServed. Empty: any namespace (a controller with rights everywhere, as in
    tests)."""
    run_pass_interval_s: float = pydantic.Field(default=2.0, gt=0)
    """Upper bound between two full passes of the run reconciler (it lists TauRuns, their
    objects, Workloads and pods). Submissions and cancels are reconciled at once, not here."""
    run_ttl_after_finished_s: float | None = pydantic.Field(default=86400.0, ge=0)
    """A finished run's Jobs/RayJobs (and so its pods) are deleted this long after it ended;
    the TauRun and its evidence stay. A day lets a researcher read a night run's live logs in
    the morning (an hour did not). None keeps them."""
    run_pod_annotations: dict[str, str] = {}
    """Annotations added to every pod of every run, for cluster tooling (the dev cluster's
    KWOK reads `kwok.taugrid.dev/run-for` from here)."""
    run_termination_grace_s: int = pydantic.Field(default=60, ge=0)
    """SIGTERM-to-SIGKILL window of run pods: the time a workload has to write a checkpoint."""
    run_controller_url: str = ""
    """URL run pods use to reach the controller (`TAU_URL`); empty means the advertised URL."""
    run_token_audience: str = "taugrid-run"  # noqa: S105  (an audience name, not a secret)
    """Audience of the projected token each run pod gets (`TAU_TOKEN_FILE`); the controller
    reviews a run pod's token for it alone and maps it to the run through the pod it is
    bound to. Never the API server's own audience: the token is no Kubernetes credential."""
    run_token_expiration_s: int = pydantic.Field(default=3600, ge=600, le=86_400)
    """Lifetime the run pods' projected tokens ask for (the kubelet rotates them at 80%;
    Kubernetes wants at least 600 s)."""
    run_ca_file: str = ""
    """PEM bundle run pods trust for `TAU_URL`: read once at startup, written into each run's
    checkpoint ConfigMap as `ca.crt` and named by `TAU_CA_FILE`. Empty means `tls_ca_file`
    (the CA of the controller's own certificate); both empty: the pods' system store."""
    ray_version: str | None = None
    """`rayClusterSpec.rayVersion` of rendered RayJobs, when the cluster's KubeRay wants one."""
    ray_operator_namespace: str = "kuberay-system"
    """Namespace of the KubeRay operator: its pods may reach a ray run's dashboard port
    through the run's NetworkPolicy (DESIGN §10). Set it to where the platform installed
    KubeRay; empty lets only the run's own submitter pod in."""
    ray_token_auth: bool = False
    """Render `authOptions: {mode: token}` on RayJobs, so a run's dashboard and Jobs API ask
    for the token KubeRay keeps; needs KubeRay 1.5.1+ and `ray_version` 2.52.0 or later."""
    logs_wait_s: float = pydantic.Field(default=120.0, ge=0)
    """How long `GET …/logs?follow=true` waits for a run's pod to start before giving up."""
    run_manager: str = marks.DEFAULT_RUN_MANAGER
    """Name of the run manager: a replica reconciles only TauRuns whose
    `taugrid.dev/managed-by` annotation names it (none means this default), and stamps it on
    the runs it accepts. Lets a second controller (a canary, a test) share a cluster."""
    resume_priority_class: str = marks.RESUME_PRIORITY_CLASS
    """WorkloadPriorityClass of an attempt resumed after an infrastructure failure
    (NodeFailure, Evicted) of a run without a priority of its own, so it does not queue
    behind work submitted since (docs/researcher.md, "Resume"). Empty: no boost. When the
    class does not exist, resumed attempts queue normally."""
    pods_ready_timeout_s: float | None = pydantic.Field(default=None, gt=0)
    """Kueue's `waitForPodsReady.timeout` on this cluster, in seconds, as the platform
    configured Kueue (docs/platform.md); None when it is not enabled. The controller does
    not read Kueue's configuration: this only tells a run whose pods cannot start when
    Kueue will release its quota (or that nothing will)."""
    run_urgent_resume: bool = True
    """When a node is quarantined because a GPU failed, reconcile the runs on it at once from
    their own snapshot, instead of poking the full reconcile pass (which reads the whole
    cluster). Off only to compare the two (bench/resume.py) or to rule the fast path out."""
    run_checkpoints_kept: int = pydantic.Field(default=10, ge=1, le=100)
    """Checkpoints kept in a TauRun's status (the newest)."""
    run_results_flush_s: float = pydantic.Field(default=1.0, gt=0, le=60)
    """Results reports (`POST …/results`) are answered at once and written to the TauRun this
    long after the first of a burst, all in one status write: a loop reporting every step
    costs one write a second, not one per report. A failover loses at most this much."""
    run_results_points: int = pydantic.Field(default=100, ge=2, le=1000)
    """Points kept per metric; past it the series is thinned evenly (first and newest kept)."""
    run_results_metrics: int = pydantic.Field(default=16, ge=1, le=128)
    """Metric names kept per run; a report naming one more is refused (422). With the point
    cap this bounds a run's results to about points × metrics × 60 bytes (96 KiB by
    default) on a status every reconcile pass lists."""
    run_results_artifacts: int = pydantic.Field(default=32, ge=1, le=256)
    """Artifacts kept per run; past it the oldest go (the newest is usually the model)."""
    run_results_pending_max: int = pydantic.Field(default=4096, ge=1)
    """Points, artifacts and summaries of one run waiting to be written; more is 429."""
    run_log_keep_kib: int = pydantic.Field(default=256, ge=1, le=512)
    """KiB of each worker's log kept in its TauRunLog (the tail), so a failed attempt's last
    lines outlive its pods. 256 KiB is several thousand lines and stays under etcd's 1.5 MiB
    object limit even when JSON escaping doubles it; at most 512 (chart runLogKeepKiB)."""
    run_log_capture_interval_s: float = pydantic.Field(default=30.0, gt=0)
    """How often the tail of every running worker's log is kept (one tail read per worker).
    A pod that vanishes without warning loses at most this much of its last output; an
    attempt that ends normally is captured whole before its pods are deleted."""
    run_log_read_timeout_s: float = pydantic.Field(default=2.0, gt=0)
    """A log read gives up after this long. The final capture runs before a failed attempt's
    objects are deleted and its next attempt created, so a kubelet that stops answering (a
    lost node) delays a resume by at most this; its periodic capture is what is kept then."""


class ControllerSettings(
    ApiSettings,
    KubeSettings,
    FleetSettings,
    DeviceSettings,
    AdmissionSettings,
    RunsSettings,
    pydantic_settings.BaseSettings,
):
    """Every knob of the controller process, read from `TAUGRID_CONTROLLER_<FIELD>`: the
    sections' fields, each declared once in its section. Durations are seconds (`*_s`). Each
    domain takes its own section (`fleet`, `devices`, `admission`, `runs`); the root and the
    HTTP plumbing read the API and Kubernetes sections' fields from the process settings."""

    model_config = pydantic_settings.SettingsConfigDict(
        env_prefix="TAUGRID_CONTROLLER_", frozen=True, extra="forbid"
    )

    @functools.cached_property
    def fleet(self) -> FleetSettings:
        """The fleet section (the quarantine policy's settings)."""
        return _section(self, FleetSettings)

    @functools.cached_property
    def devices(self) -> DeviceSettings:
        """The device quarantine section."""
        return _section(self, DeviceSettings)

    @functools.cached_property
    def admission(self) -> AdmissionSettings:
        """The admission section."""
        return _section(self, AdmissionSettings)

    @functools.cached_property
    def runs(self) -> RunsSettings:
        """The runs section."""
        return _section(self, RunsSettings)

    @pydantic.model_validator(mode="after")
    def _peer_body_holds_a_report(self) -> ControllerSettings:
        """A relayed batch must have room for the largest heartbeat the controller takes."""
        if self.peer_max_body_bytes < self.max_body_bytes + 64 * 1024:
            msg = (
                f"peer_max_body_bytes ({self.peer_max_body_bytes}) must be at least"
                f" max_body_bytes ({self.max_body_bytes}) + 65536"
            )
            raise ValueError(msg)
        return self

    @pydantic.model_validator(mode="after")
    def _check_leader_url(self) -> ControllerSettings:
        """Refuse a leader address that could hand a peer token to the wrong place."""
        problem = leader_url_problem(
            self.leader_url, ca_file=self.tls_ca_file, insecure=self.allow_insecure_http
        )
        if problem:
            msg = f"leader_url {self.leader_url!r}: {problem}"
            raise ValueError(msg)
        return self

    @pydantic.model_validator(mode="after")
    def _run_audience_is_its_own(self) -> ControllerSettings:
        """A run pod's token must not double as an agent's or a replica's."""
        if not self.run_token_audience.strip():
            msg = "run_token_audience must not be empty"
            raise ValueError(msg)
        if self.run_token_audience in (self.token_audience, self.peer_audience):
            msg = (
                f"run_token_audience {self.run_token_audience!r} must differ from the agents'"
                " (token_audience) and the replicas' (peer_audience)"
            )
            raise ValueError(msg)
        return self

    @pydantic.model_validator(mode="after")
    def _ray_token_auth_needs_its_version(self) -> ControllerSettings:
        """KubeRay refuses `authOptions.mode: token` without `rayVersion` 2.52.0 or later:
        say so at startup, not on every ray run's create."""
        if self.ray_token_auth and not _at_least(self.ray_version or "", (2, 52, 0)):
            msg = (
                "ray_token_auth needs ray_version 2.52.0 or later (KubeRay refuses token auth"
                f" for older Ray), got {self.ray_version!r}"
            )
            raise ValueError(msg)
        return self


S = TypeVar("S", bound=Section)


def _section(settings: ControllerSettings, section: type[S]) -> S:
    """One section of the settings, with the process's values."""
    return section.model_validate({name: getattr(settings, name) for name in section.model_fields})


def _at_least(version: str, minimum: tuple[int, ...]) -> bool:
    """Whether a dotted version (`2.52.1`, `v2.53`) is at least `minimum`; False when it
    does not parse."""
    parts = version.strip().removeprefix("v").split(".")
    try:
        numbers = tuple(int(p) for p in parts)
    except ValueError:
        return False
    return numbers >= minimum


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def leader_url_problem(url: str, *, ca_file: str, insecure: bool) -> str:
    """Why `url` may not be the leader's address ('' when it may): an origin only (scheme,
    host, port), https with a CA to verify it by, or http on loopback or when explicitly
    allowed."""
    if not url:
        return ""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http(s):// URL with a host"
    if parts.username or parts.password or parts.query or parts.fragment:
        return "must not carry credentials, a query or a fragment"
    if parts.path not in ("", "/"):
        return "must be an origin (scheme, host, port) without a path"
    if parts.scheme == "https" and not ca_file:
        return "https needs tls_ca_file: the leader is verified against that CA alone"
    if parts.scheme == "http" and not (is_loopback(parts.hostname) or insecure):
        return "plain http only on loopback (or with allow_insecure_http behind a TLS proxy)"
    return ""
