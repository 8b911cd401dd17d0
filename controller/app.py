"""The controller's composition root: `make_app(settings)` wires everything; nothing at import.

It builds the plumbing every API shares (`controller.serving`), the three domains and their
loops, and wires what crosses domains, which no domain may do itself:
- fleet → runs: a node quarantined because a GPU failed reconciles the runs on it at once;
- fleet → admission: any node change wakes the admission gate (what fits has changed);
- admission → runs: why the gate holds a Workload back becomes its run's message;
- the elector → its pod's leader label (`leading.LeaderMark`), which the leader-only
  Service selects, so followers reach the leader without reading any address off the cluster.

Background work lives in a cleanup context, so no loop outlives its app. Shutdown
(`controller.main.serve`): readiness turns false first, then the sites stop, then the
cleanup context cancels the loops (the elector releases its lease, so a follower takes over
at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import pathlib
import ssl
from collections.abc import AsyncIterator, Callable, Mapping

import aiohttp
import structlog
from aiohttp import web

from controller import auth, budget, leading, metrics, openapi, pages, serving
from controller.admission import admitting
from controller.admission import dra as admission_dra
from controller.fleet import agentproxy, devicepolicy, policy, quarantining, state
from controller.fleet import api as fleet_api
from controller.fleet import routes as fleet_routes
from controller.kube import admission as kube_admission
from controller.kube import client as kube_client
from controller.kube import devices as kube_devices
from controller.kube import leases, ratelimit, reviews
from controller.kube import nodes as kube_nodes
from controller.kube import pods as kube_pods
from controller.kube import runs as kube_runs
from controller.runs import api as runs_api
from controller.runs import context as runs_context
from controller.runs import keeping, reconciling, rendering
from controller.settings import ControllerSettings
from shared import kubetoken

log = structlog.get_logger()

GATE = web.AppKey("gate", admitting.Gate)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_app(
    settings: ControllerSettings, *, reviewer: auth.Reviewer | None = None
) -> web.Application:
    """Build the controller app; background work starts with the app, not here."""
    app = web.Application(
        middlewares=[serving.make_middleware(settings.handler_timeout_s)],
        client_max_size=settings.max_body_bytes,
    )
    fleet_routes.add_routes(app)
    pages.add_routes(app, ca_file=settings.tls_ca_file)
    openapi.add_route(app, settings)
    runs_api.add_routes(app)
    app.cleanup_ctx.append(_runtime(settings, reviewer))
    app.cleanup_ctx.append(fleet_api.relay_context)  # after the runtime, whose state it uses
    return app


def read_run_ca(settings: ControllerSettings) -> str:
    """Read the PEM bundle run pods trust (`run_ca_file`, else `tls_ca_file`) once, at
    startup; '' when neither is set. A file that holds no certificate fails here, not in
    every run pod."""
    path = settings.run_ca_file or settings.tls_ca_file
    if not path:
        return ""
    pem = pathlib.Path(path).read_text(encoding="ascii")
    ssl.create_default_context(cadata=pem)  # raises ssl.SSLError on anything but certificates
    return pem


def write_rates(settings: ControllerSettings) -> budget.Rates:
    """The API write budget the settings give (chart `controller.apiWrites`)."""
    return budget.Rates(
        rate_per_s=settings.api_writes_per_s,
        burst=settings.api_write_burst,
        aging_s=settings.api_write_aging_s,
        eviction_per_s=settings.api_evictions_per_s,
        eviction_burst=settings.api_eviction_burst,
        max_wait_s=max(60.0, 6 * settings.api_timeout_s),
    )


def review_rates(settings: ControllerSettings) -> budget.Rates:
    """The reviews' own budget (chart `controller.apiReviews`): a review that waited longer
    than an API call may take fails as a timed-out call would."""
    return budget.Rates(
        rate_per_s=settings.api_reviews_per_s,
        burst=settings.api_review_burst,
        max_wait_s=settings.api_timeout_s,
    )


def _reviewed(
    m: metrics.ControllerMetrics, kind: auth.ReviewKind, cached: bool, outcome: auth.ReviewOutcome
) -> None:
    m.auth_cache.labels(kind.value, str(cached).lower(), outcome.value).inc()


def _seen(m: metrics.ControllerMetrics, cls: budget.WriteClass, waited_s: float) -> None:
    m.api_writes.labels(cls.label).inc()
    m.api_write_wait.labels(cls.label).observe(waited_s)


def _runtime(
    settings: ControllerSettings, reviewer: auth.Reviewer | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        peer_ssl = serving.peer_ssl_context(settings)  # first: a bad CA fails before any client
        run_ca = read_run_ca(settings)
        # Five clients, five pools (review H2): the lease and the leader label on one of their
        # own, so no storm of our own writes delays a renewal; the node cache and the node
        # writes on one that nothing a caller does can fill, as large as a pass's writes in
        # flight (quarantining.MAX_PARALLEL_NODES); the loops and the reviews on another;
        # researchers' reads and writes on a fourth; log streams, which hold a connection
        # while they last, on a fifth as large as the stream cap.
        # One API write budget for all five: what protects the API server is the replica's
        # total, served lease first (controller.budget); reviews, which any caller can cause,
        # spend a budget of their own (security review 3, finding 1).
        m = metrics.make_metrics()
        limiter = ratelimit.Limiter(write_rates(settings), reviews=review_rates(settings),
                                    observe=functools.partial(_seen, m))  # fmt: skip
        m.api_writes_waiting.set_function(lambda: limiter.waiting)
        timeout_s = settings.api_timeout_s
        make = functools.partial(
            kube_client.make_client, settings.kubeconfig, timeout_s=timeout_s, limiter=limiter
        )
        lease_api = await make(pool=4)
        control = await make(pool=quarantining.MAX_PARALLEL_NODES + 4)  # + the node watch
        api, callers = await make(pool=64), await make(pool=32)
        streams = await make(pool=settings.log_streams_max)
        clients = (lease_api, control, api, callers, streams)
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=peer_ssl))
        authn = auth.Authenticator(
            reviewer or reviews.KubeReviewer(api),
            token_ttl_s=settings.token_cache_max_s,
            bound_token_ttl_s=settings.bound_token_cache_max_s,
            access_ttl_s=settings.auth_cache_ttl_s,
            max_reviews=settings.reviews_in_flight_max,
            access_per_identity=settings.access_reviews_per_identity,
            access_max=settings.access_reviews_in_flight_max,
            observe=functools.partial(_reviewed, m),
        )
        # The install namespace's pods, watched: agent IPs, and deletions that retire the
        # tokens bound to them (so those are not re-reviewed every bound_token_cache_max_s).
        agents = kube_nodes.AgentPods(api, settings.namespace, on_gone=authn.forget_pod)
        authn.pod_alive = agents.alive
        fleet = state.FleetState(leader_since=_now(), stale_multiplier=settings.stale_multiplier)
        url = settings.advertise_url or serving.default_url(settings)
        lease_store = leases.KubeLeaseStore(
            lease_api, settings.namespace, settings.lease_name,
            timeout_s=min(timeout_s, settings.renew_deadline_s / 2),
        )  # fmt: skip
        marks_: list[leading.LeaderMark] = []
        run_caches = leading.WhileLeading("run-caches")
        # The closures below read `quarantiner`, built further down: they run only once the
        # runtime is up (the elector's callbacks, the gate's and the node cache's calls).

        async def started() -> None:
            fleet.become_leader(_now())
            quarantiner.restore(elector.lease_state)
            log.info("became leader", identity=elector.identity, url=url)
            quarantiner.poke()
            for mark in marks_:
                mark.poke()
            run_caches.start()

        async def stopped() -> None:
            log.warning("stopped leading", identity=elector.identity)
            for mark in marks_:
                mark.poke()
            await run_caches.stop()

        elector = leading.Elector(
            lease_store, serving.make_identity(settings), url,
            lease_duration_s=settings.lease_duration_s, renew_deadline_s=settings.renew_deadline_s,
            retry_period_s=settings.retry_period_s, on_started=started, on_stopped=stopped,
        )  # fmt: skip

        def dra_devices() -> Mapping[str, tuple[bool, tuple[admission_dra.Slot, ...]]]:
            # fleet -> admission: the DRA nodes' GPUs as device quarantine judges them, as
            # they are (no copy per node per pass: `admission.dra.DeviceNode`).
            return quarantiner.device_report(_now())

        admission_store = kube_admission.AdmissionStore(api, component=elector.identity)
        gate = admitting.Gate(
            admission_store, elector, m,
            check=settings.admission_check, retry_after_s=settings.admission_retry_after_s,
            pass_interval_s=settings.admission_pass_interval_s, devices=dra_devices,
            full_pass_interval_s=settings.full_pass_interval_s,
            dra_resource=settings.dra_quota_resource,
        )  # fmt: skip

        def node_changed() -> None:
            quarantiner.poke()
            gate.poke()  # a quarantine or a release changes what fits: decide again at once

        cache = kube_nodes.NodeCache(
            control, on_change=node_changed, label_selector=settings.node_selector,
            on_delete=fleet.forget,  # a deleted node's record goes with it (review 3, finding 8)
        )  # fmt: skip
        device_cache = kube_devices.DeviceCache(api, on_change=node_changed)
        quarantiner = quarantining.Quarantiner(
            fleet, cache=cache, settings=policy.settings_from(settings.fleet), elector=elector,
            writer=kube_nodes.NodeWriter(control, settings.namespace, component=elector.identity),
            metrics=m, pass_interval_s=settings.pass_interval_s, lease_name=settings.lease_name,
            full_pass_interval_s=settings.full_pass_interval_s,
            eviction_retry_s=settings.eviction_retry_s,
            save_state=lease_store.save_state, device_cache=device_cache,
            device_writer=kube_devices.DeviceWriter(api),
            device_settings=devicepolicy.settings_from(settings.devices, settings.fleet),
        )  # fmt: skip
        if settings.pod_name:
            pod = kube_pods.PodLabel(lease_api, settings.namespace, settings.pod_name)
            marks_.append(leading.LeaderMark(pod, elector, interval_s=settings.retry_period_s))
        store = kube_runs.RunStore(api)
        keeper = keeping.LogKeeper(
            store, elector, m,
            manages=functools.partial(reconciling.manages, manager=settings.run_manager),
            keep_bytes=settings.run_log_keep_kib * 1024,
            interval_s=settings.run_log_capture_interval_s,
            read_timeout_s=settings.run_log_read_timeout_s,
        )  # fmt: skip
        reconciler = reconciling.Reconciler.from_settings(
            store, elector, m, settings.runs,
            rendering.RenderSettings.from_section(settings.runs, controller_url=url, ca_pem=run_ca),
            full_pass_interval_s=settings.full_pass_interval_s, gate_message=gate.message_for,
            keep_logs=keeper.keep_final,
            dra=quarantiner.dra_render,  # fleet -> runs: how GPUs are requested now
        )  # fmt: skip
        # The reconciler's lists come from watch-fed caches while this replica leads (only
        # the leader reconciles); each change pokes it (coalesced, passes spaced).
        run_caches.run = functools.partial(store.run_caches, on_change=reconciler.poke)
        if settings.run_urgent_resume:
            quarantiner.on_quarantine.append(reconciler.urgent)
        else:
            quarantiner.on_quarantine.append(lambda _node: reconciler.poke())

        st = serving.ServingState(settings, m, authn, elector, http, url)
        if settings.peer_token_file:
            st.peer_token = kubetoken.FileToken(pathlib.Path(settings.peer_token_file))
        st.readiness.append(cache.synced.is_set)
        app[serving.SERVING] = st
        # The on-call calls to agents go on the replica's HTTP session (https verified by the
        # chart's CA alone), under the controller's own agent token, never a caller's.
        agent_token: Callable[[], str] = lambda: ""  # noqa: E731  (a default, replaced below)
        if settings.agent_token_file:
            agent_token = kubetoken.FileToken(pathlib.Path(settings.agent_token_file))
        agent_client = agentproxy.AgentClient(
            http, agent_token, scheme=settings.agent_scheme, port=settings.agent_port,
            timeout_s=settings.agent_timeout_s, max_bytes=settings.agent_max_response_bytes,
        )  # fmt: skip
        app[fleet_api.FLEET] = fleet_api.FleetContext(
            fleet, quarantiner, cache, agents, agent_client=agent_client
        )
        app[runs_context.RUNS] = runs_context.RunsContext(
            kube_runs.RunStore(callers, streams=streams), reconciler, keeper
        )
        app[GATE] = gate
        labels = [asyncio.create_task(mark.run(), name="leader-label") for mark in marks_]
        tasks = [
            asyncio.create_task(cache.run(), name="node-cache"),
            asyncio.create_task(agents.run(), name="install-namespace-pods"),
            asyncio.create_task(device_cache.run(), name="device-cache"),
            asyncio.create_task(elector.run(), name="elector"),
            asyncio.create_task(quarantiner.run(), name="quarantine"),
            asyncio.create_task(gate.run(), name="admission"),
            asyncio.create_task(admission_store.run_caches(), name="admission-caches"),
            asyncio.create_task(reconciler.run(), name="runs"),
            asyncio.create_task(keeper.run(), name="logs"),
        ]
        st.ready = True
        try:
            yield
        finally:
            st.ready = False
            await reconciler.collector.aclose()  # while this replica still leads
            # The label goes before the lease (the elector gives it up when cancelled), so
            # the leader-only Service stops sending here before a successor is labelled.
            for t in labels:
                t.cancel()
            for t in labels:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            for mark in marks_:
                await mark.clear()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await run_caches.stop()
            for recorder in (quarantiner.writer.events, admission_store.events):
                await recorder.flush(2.0)  # Events still queued, before their client closes
            await http.close()
            for c in clients:
                await c.close()

    return ctx
