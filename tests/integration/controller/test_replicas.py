"""Two replicas on the real control plane: no caller's credential ever leaves the replica
that received it (DESIGN.md section 6, review finding H1).

Each replica stands in for a chart pod (tests/leaderservice.py): the leader labels its own
pod, the real endpointslice controller puts only that pod behind the leader-only Service, and
a kube-proxy stand-in relays a follower's calls there. A follower authenticates and
authorises every call itself and sends the leader only its own peer token with the caller it
reviewed; the Lease's leader-url annotation is never a place anything is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import io
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from controller import auth
from devcluster import cluster
from shared import heartbeat
from tests import controllerkit as kit
from tests import kueue, leaderservice, runskit, support

pytestmark = pytest.mark.cluster


@dataclasses.dataclass
class Pair:
    """Two replicas, the pods they stand in for, the relay to the leader, their node."""

    replicas: list[kit.RunningController]
    pods: list[str]
    peer_tokens: list[str]
    proxy: leaderservice.ServiceProxy
    node: str
    http: aiohttp.ClientSession
    api: client.ApiClient
    namespace: str

    def pod_of(self, replica: kit.RunningController) -> str:
        return self.pods[self.replicas.index(replica)]

    async def roles(self) -> tuple[kit.RunningController, kit.RunningController]:
        """(leader, follower), once the leader's pod is the leader Service's endpoint."""
        leader = await kit.wait_leader(*self.replicas)
        follower = next(r for r in self.replicas if r is not leader)

        async def labelled() -> None:
            expected = [self.pod_of(leader)]
            assert expected == await leaderservice.endpoints(self.api, self.namespace)

        await support.eventually(labelled, what="the leader's pod behind the leader Service")
        return leader, follower


@pytest_asyncio.fixture
async def pair(
    k8s: client.ApiClient,
    dev_cluster: cluster.Cluster,
    bin_dir: pathlib.Path,
    namespace: str,
    tmp_path: pathlib.Path,
) -> AsyncIterator[Pair]:
    """Two replicas of one fleet, each standing in for a pod of its own."""
    (node,) = await asyncio.to_thread(
        dev_cluster.ensure_nodes, bin_dir, 1, prefix=f"r-{namespace}"[:50].rstrip("-") + "-",
        labels={"taugrid.dev/test-fleet": namespace},
    )  # fmt: skip
    await leaderservice.leader_service(k8s, namespace)
    proxy = await leaderservice.ServiceProxy(k8s, namespace).start()
    replicas: list[kit.RunningController] = []
    pods, tokens = ["ctl-0", "ctl-1"], []
    try:
        for name in pods:
            pod = await leaderservice.replica_pod(k8s, namespace, name, node)
            path = tmp_path / f"{name}.token"
            tokens.append(await leaderservice.peer_token(k8s, namespace, pod, path))
            ctl = await kit.start_controller(
                dev_cluster.kubeconfig, namespace, leader_url=proxy.url, pod_name=name,
                peer_token_file=str(path),
                controller_service_account=leaderservice.SERVICE_ACCOUNT,
                run_manager=f"test/{namespace}",
            )  # fmt: skip
            proxy.backends[name] = ("127.0.0.1", ctl.settings.port)
            replicas.append(ctl)
        async with aiohttp.ClientSession() as http:
            yield Pair(replicas, pods, tokens, proxy, node, http, k8s, namespace)
    finally:
        for r in replicas:
            await r.stop()
        await proxy.close()
        with contextlib.suppress(client.ApiException):
            await client.CoreV1Api(k8s).delete_node(node)
        await kit.delete_test_rbac(k8s, namespace)


async def _labels(api: client.ApiClient, namespace: str, pod: str) -> dict[str, str]:
    return dict((await client.CoreV1Api(api).read_namespaced_pod(pod, namespace)).metadata.labels)


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_only_the_leaders_pod_backs_the_leader_service_and_it_moves_on_failover(
    k8s: client.ApiClient, namespace: str, pair: Pair
) -> None:
    """The leader labels its own pod and only that pod is the Service's endpoint; when it
    stops, its label goes, the other replica leads, labels its pod and takes its place."""
    leader, follower = await pair.roles()
    old_pod, new_pod = pair.pod_of(leader), pair.pod_of(follower)
    before = (
        (await _labels(k8s, namespace, old_pod)).get(leaderservice.LEADER_LABEL),
        (await _labels(k8s, namespace, new_pod)).get(leaderservice.LEADER_LABEL),
    )
    await leader.stop()
    pair.replicas.remove(leader)

    async def moved() -> None:
        expected = [new_pod]
        assert expected == await leaderservice.endpoints(k8s, namespace)

    await support.eventually(moved, what="the new leader's pod behind the leader Service")
    after = (await _labels(k8s, namespace, old_pod)).get(leaderservice.LEADER_LABEL)
    expected = (("true", None), None, True)
    assert expected == (before, after, follower.serving.elector.is_leader())


async def test_a_follower_sends_the_leader_its_own_peer_token_never_the_callers(
    k8s: client.ApiClient, namespace: str, pair: Pair
) -> None:
    """An on-call write, an on-call read and a heartbeat sent to the follower are done by
    the leader; what crossed to the leader holds the follower's peer token and neither the
    on-call token nor the agent's."""
    leader, follower = await pair.roles()
    oncall = await kit.admin_token(k8s, namespace)
    agent = kit.Agent(pair.node, await kit.agent_token(k8s, namespace, pair.node))
    async with pair.http.put(
        f"{follower.url}/v1/fleet/mode", json={"dryRun": True}, headers=_bearer(oncall)
    ) as resp:
        mode = resp.status
    async with pair.http.get(f"{follower.url}/v1/fleet", headers=_bearer(oncall)) as resp:
        fleet = (resp.status, (await resp.json())["leader"])
    beat = await agent.send(pair.http, follower.url)
    sent = bytes(pair.proxy.relayed)
    follower_token = pair.peer_tokens[pair.replicas.index(follower)]
    expected = (200, (200, leader.serving.elector.identity), 202, True, True, False, False)
    actual = (
        mode, fleet, beat, leader.fleet.quarantiner.settings.dry_run,
        pair.node in leader.fleet.fleet,
        oncall.encode() in sent, agent.token.encode() in sent,
    )  # fmt: skip
    assert expected == actual
    assert follower_token.encode() in sent


async def test_run_writes_sent_to_a_follower_are_done_by_the_leader_without_their_tokens(
    k8s: client.ApiClient, namespace: str, pair: Pair
) -> None:
    """A researcher's submit and cancel and a run pod's checkpoint report, each sent to the
    follower, are done by the leader (the run is created, records the checkpoint, ends
    Cancelled); neither the researcher's token nor the run's crosses to the leader, and the
    run's token on another run is refused by the follower itself."""
    _, follower = await pair.roles()
    await kueue.create_queues(k8s, namespace, gpus=8)
    try:
        researcher = await runskit.make_token(k8s, namespace, "researcher",
                                              runskit.RESEARCHER_RULES)  # fmt: skip
        runs = f"{follower.url}/v1/runs"
        answers = []
        for name in ("mine", "theirs"):
            async with pair.http.post(
                runs, params={"namespace": namespace},
                json=runskit.job_spec(name, checkpoint={"dir": "/c"}), headers=_bearer(researcher),
            ) as resp:  # fmt: skip
                answers.append(resp.status)
        token = await runskit.run_token(k8s, namespace, "mine")
        report = {"attempt": 1, "step": 100, "path": "/c/100"}
        for run in ("mine", "theirs"):
            async with pair.http.post(
                f"{runs}/{namespace}/{run}/checkpoints", json=report, headers=_bearer(token)
            ) as resp:
                answers.append(resp.status)
        async with pair.http.delete(f"{runs}/{namespace}/mine", headers=_bearer(researcher)) as r:
            answers.append(r.status)
            phase = (await r.json())["phase"]
        run = await client.CustomObjectsApi(k8s).get_namespaced_custom_object(
            "taugrid.dev", "v1alpha1", namespace, "tauruns", "mine"
        )
    finally:
        await kueue.delete_queues(k8s, namespace)
    sent = bytes(pair.proxy.relayed)
    expected = ([201, 201, 201, 403, 200], "Cancelled", [100], False, False)
    actual = (
        answers, phase, [c["step"] for c in run["status"].get("checkpoints") or []],
        researcher.encode() in sent, token.encode() in sent,
    )  # fmt: skip
    assert expected == actual


async def test_a_follower_refuses_unauthenticated_and_unauthorised_callers_itself(
    k8s: client.ApiClient, namespace: str, pair: Pair
) -> None:
    """No token (401), a token without the right (403) and a heartbeat from another
    ServiceAccount (403) are answered by the follower: nothing reaches the leader."""
    _, follower = await pair.roles()
    nobody = await runskit.make_token(k8s, namespace, "nobody", None)
    impostor = kit.Agent(pair.node, await _peer_audience_token(k8s, namespace, "nobody"))
    statuses = []
    for headers in ({}, _bearer(nobody)):
        async with pair.http.put(
            f"{follower.url}/v1/fleet/mode", json={"dryRun": True}, headers=headers
        ) as resp:
            statuses.append(resp.status)
    statuses.append(await impostor.send(pair.http, follower.url))
    expected = ([401, 403, 403], 0)
    assert expected == (statuses, pair.proxy.connections)


async def _peer_audience_token(api: client.ApiClient, namespace: str, sa: str) -> str:
    tr = await client.CoreV1Api(api).create_namespaced_service_account_token(
        sa, namespace, {"spec": {"audiences": [leaderservice.PEER_AUDIENCE, "taugrid"]}}
    )
    return str(tr.status.token)


async def test_the_leader_acts_for_a_caller_only_on_a_replicas_peer_token(
    k8s: client.ApiClient, namespace: str, pair: Pair
) -> None:
    """A caller header is honoured only with a peer-audience token of the replicas'
    ServiceAccount: the on-call token itself, another ServiceAccount's peer token and the
    replicas' own API-audience token are refused (403 PeerRefused); with a genuine peer token
    the leader still authorises the named caller itself (a caller without rights: 403). A
    peer token bound to no pod, and a peer speaking for system:masters, are refused too."""
    leader, _ = await pair.roles()
    oncall = await kit.admin_token(k8s, namespace)
    await runskit.make_token(k8s, namespace, "nobody", None)
    admin = auth.encode_caller(auth.Identity(f"system:serviceaccount:{namespace}:oncall"))
    powerless = auth.encode_caller(auth.Identity(f"system:serviceaccount:{namespace}:nobody"))
    masters = auth.encode_caller(auth.Identity("admin", groups=("system:masters",)))
    api_audience = await client.CoreV1Api(k8s).create_namespaced_service_account_token(
        leaderservice.SERVICE_ACCOUNT, namespace, {"spec": {"expirationSeconds": 3600}}
    )
    cases = [
        (oncall, admin),
        (await _peer_audience_token(k8s, namespace, "nobody"), admin),
        (str(api_audience.status.token), admin),
        (pair.peer_tokens[0], powerless),
        # Review 3, finding 8: a peer-audience token of the replicas' own ServiceAccount bound
        # to no pod (minted by hand), and a genuine peer token speaking for system:masters.
        (await _peer_audience_token(k8s, namespace, leaderservice.SERVICE_ACCOUNT), admin),
        (pair.peer_tokens[0], masters),
    ]
    answers = []
    for token, caller in cases:
        async with pair.http.put(
            f"{leader.url}/v1/fleet/mode", json={"dryRun": True},
            headers={**_bearer(token), "X-TauGrid-Caller": caller},
        ) as resp:  # fmt: skip
            answers.append((resp.status, (await resp.json())["error"]["code"]))
    expected = (
        [
            (403, "PeerRefused"),
            (403, "PeerRefused"),
            (403, "PeerRefused"),
            (403, "Forbidden"),
            (403, "PeerRefused"),
            (403, "PeerRefused"),
        ],
        False,
    )
    assert expected == (answers, leader.fleet.quarantiner.settings.dry_run)


async def test_a_lease_that_names_another_leader_url_receives_nothing(
    k8s: client.ApiClient, namespace: str, pair: Pair
) -> None:
    """Review H1's attack: whoever can write the Lease takes it and points its leader-url
    annotation at a listener of theirs. Both replicas become followers; calls and heartbeats
    sent to them are answered 503 with no address in the body, and the listener never sees
    a connection (nor any token)."""
    leader, _ = await pair.roles()
    caught: list[bytes] = []

    async def catch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        caught.append(await reader.read(65536))
        writer.close()

    catcher = await asyncio.start_server(catch, "127.0.0.1", 0)
    port = catcher.sockets[0].getsockname()[1]
    coordination = client.CoordinationV1Api(k8s)
    lease = leader.settings.lease_name

    async def hold() -> None:
        while True:
            now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            await coordination.patch_namespaced_lease(
                lease, namespace,
                {"metadata": {"annotations": {"taugrid.dev/leader-url":
                                              f"http://127.0.0.1:{port}"}},
                 "spec": {"holderIdentity": "attacker", "renewTime": now,
                          "leaseDurationSeconds": 3}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
            await asyncio.sleep(0.3)

    attacker = asyncio.create_task(hold())
    try:

        async def nobody_leads() -> None:
            assert not any(r.serving.elector.is_leader() for r in pair.replicas)
            assert not await leaderservice.endpoints(k8s, namespace)

        await support.eventually(nobody_leads, what="the attacker to hold the Lease")
        oncall = await kit.admin_token(k8s, namespace)
        agent = kit.Agent(pair.node, await kit.agent_token(k8s, namespace, pair.node))
        answers: list[Any] = []
        for replica in pair.replicas:
            async with pair.http.put(
                f"{replica.url}/v1/fleet/mode", json={"dryRun": True}, headers=_bearer(oncall)
            ) as resp:
                body = await resp.json()
                answers.append((resp.status, sorted(body)))
            answers.append(await agent.send(pair.http, replica.url))
    finally:
        attacker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await attacker
        catcher.close()
    expected: tuple[list[Any], list[bytes]] = ([(503, ["error"]), 503] * 2, [])
    assert expected == (answers, caught)


# ---------------------------------------------------------------------- relayed heartbeats
async def _beat(
    http: aiohttp.ClientSession, url: str, agent: kit.Agent, interval_s: float = 1.0
) -> tuple[int, str | None]:
    """One heartbeat; its status and how the replica relayed it (None: not relayed)."""
    body = heartbeat.encode(agent.report(interval_s))
    async with http.post(
        f"{url}/v1/heartbeats", data=body,
        headers={**_bearer(agent.token), "Content-Type": "application/json"},
    ) as resp:  # fmt: skip
        answer = await resp.json()
        return resp.status, answer.get("relayed")


def _peer_entries(replica: kit.RunningController, kind: str) -> float:
    """Entries of followers' batches this replica took, of `kind` (full, liveness)."""
    registry = replica.serving.metrics.registry
    return sum(
        sample.value
        for family in registry.collect()
        if family.name == "taugrid_peer_heartbeat_entries"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["kind"] == kind
    )


async def test_a_follower_relays_changes_at_once_and_steady_beats_in_batches(
    k8s: client.ApiClient, namespace: str, pair: Pair
) -> None:
    """Heartbeats sent to the follower reach the leader: the first one and a fault at once
    (the leader holds them when the agent's 202 comes back), twenty steady ones as
    liveness, which the leader applies within a batch interval; the follower sent the
    leader a handful of requests for those 22 reports, and none held the agent's token."""
    leader, follower = await pair.roles()
    agent = kit.Agent(pair.node, await kit.agent_token(k8s, namespace, pair.node))
    first = await _beat(pair.http, follower.url, agent)
    took_first = leader.fleet.fleet.get(pair.node)
    steady = [await _beat(pair.http, follower.url, agent) for _ in range(20)]
    agent.fail(3)
    fault = await _beat(pair.http, follower.url, agent)
    record = leader.fleet.fleet.get(pair.node)
    verdict_at_once = None if record is None else record.verdict.value
    agent.heal()
    await _beat(pair.http, follower.url, agent)  # a change too: the GPU recovered
    for _ in range(5):
        await _beat(pair.http, follower.url, agent)
    relayer = follower.fleet.relayer
    assert relayer is not None

    async def caught_up() -> None:
        got = leader.fleet.fleet.get(pair.node)
        assert (agent.sequence, "Healthy") == (
            got.heartbeat.sequence if got else None,
            got.verdict.value if got else None,
        )

    await support.eventually(caught_up, what="the leader to apply the last liveness entry")
    expected = (
        (202, "change"), True, [(202, "liveness")] * 20, (202, "change"), "Failed", 3.0, True
    )  # fmt: skip
    actual = (
        first, took_first is not None, steady, fault, verdict_at_once,
        _peer_entries(leader, "full"), _peer_entries(leader, "liveness") >= 1,
    )  # fmt: skip
    assert expected == actual
    assert relayer.batches <= 8, f"{relayer.batches} requests for {agent.sequence} heartbeats"
    assert agent.token.encode() not in bytes(pair.proxy.relayed)


def _agent_caller(namespace: str, node: str) -> str:
    """The caller a follower writes for an agent bound to a pod on `node`."""
    extra = ((auth.NODE_NAME_EXTRA, (node,)), (auth.POD_UID_EXTRA, ("uid-1",)))
    return auth.encode_caller(
        auth.Identity(f"system:serviceaccount:{namespace}:{kit.AGENT_SA}", extra=extra)
    )


def _entry(node: str, **fields: Any) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"node": node, "key": "0" * 16, "bootId": "boot-1", "sequence": 1, "sentAt": now,
            "receivedAgoMs": 5, "firstAgoMs": 5, **fields}  # fmt: skip


async def test_the_peer_endpoint_takes_replicas_only_and_refuses_bad_entries_one_by_one(
    k8s: client.ApiClient, namespace: str, pair: Pair
) -> None:
    """`POST /v1/peer/heartbeats` refuses anyone but a replica before reading the body (no
    token 401, an agent's token 401, another ServiceAccount's peer token 403), a follower
    answers 503 NotLeader, and the leader refuses a body too large (413), not JSON (400)
    or too many entries (422 naming `entries`), and a batch with an entry the schema refuses
    (a malformed key, an interval out of range: 422 naming it), or an entry nested 100,000
    deep (400, not the 500 of security review 3, finding 12). In a batch, a full report
    for a node its carried agent is not bound to (403) and a report naming another node than
    its entry (422) are refused alone, each naming its field, while a good full report is
    taken. An entry for a node the cluster does not have, full or liveness, is refused (404
    naming `node`; review 3, finding 8: it used to be needed, then added)."""
    leader, follower = await pair.roles()
    agent = kit.Agent(pair.node, await kit.agent_token(k8s, namespace, pair.node))
    stranger = await _peer_audience_token(k8s, namespace, "default")
    peer = pair.peer_tokens[pair.replicas.index(follower)]
    url = f"{leader.url}/v1/peer/heartbeats"
    answers = []
    for token, target in ((None, url), (agent.token, url), (stranger, url),
                          (peer, f"{follower.url}/v1/peer/heartbeats")):  # fmt: skip
        headers = _bearer(token) if token else {}
        async with pair.http.post(target, json={"entries": []}, headers=headers) as resp:
            answers.append((resp.status, (await resp.json())["error"]["code"]))
    limit = leader.settings.peer_max_body_bytes
    too_many: list[dict[str, Any]] = [{}] * (leader.settings.peer_batch_max_entries + 1)
    bad_key = {"entries": [_entry(pair.node, key="Z" * 16)]}
    slow = heartbeat.to_json(agent.report())
    slow["intervalS"] = leader.settings.heartbeat_max_interval_s + 1
    bad_interval = {"entries": [_entry(pair.node, sequence=slow["sequence"], report=slow,
                                       caller=_agent_caller(namespace, pair.node))]}  # fmt: skip
    bodies = [b"x" * (limit + 1), b"{not json", b'{"entries": {}}',
              json.dumps({"entries": too_many}).encode(), json.dumps(bad_key).encode(),
              json.dumps(bad_interval).encode(),
              b'{"entries": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}"]  # fmt: skip
    for body in bodies:
        async with pair.http.post(url, data=io.BytesIO(body), headers=_bearer(peer)) as resp:
            error = (await resp.json())["error"]
            answers.append((resp.status, error["field"]))
    report = heartbeat.to_json(agent.report())
    other = {**report, "nodeName": "not-this-node"}
    caller = _agent_caller(namespace, pair.node)
    batch = {"entries": [
        _entry(pair.node, sequence=report["sequence"], report=report, caller=caller),
        _entry(pair.node, sequence=report["sequence"], report=report,
               caller=_agent_caller(namespace, "elsewhere")),
        _entry(pair.node, sequence=report["sequence"], report=other, caller=caller),
        _entry("never-seen"),
        _entry("elsewhere", sequence=report["sequence"], report={**report, "nodeName": "elsewhere"},
               caller=_agent_caller(namespace, "elsewhere")),
    ]}  # fmt: skip
    async with pair.http.post(url, json=batch, headers=_bearer(peer)) as resp:
        status, taken = resp.status, await resp.json()
    refused = [(r["index"], r["status"], r["field"]) for r in taken["refused"]]
    expected: tuple[Any, ...] = (
        [(401, "Unauthenticated"), (401, "Unauthenticated"), (403, "PeerRefused"),
         (503, "NotLeader"), (413, ""), (400, "body"), (422, "entries"), (422, "entries"),
         (422, "entries[0].key"), (422, "entries[0].report.intervalS"), (400, "body")],
        200, ["Accepted", "Refused", "Refused", "Refused", "Refused"],
        [(1, 403, "entries[1].caller"), (2, 422, "entries[2].report.nodeName"),
         (3, 404, "entries[3].node"), (4, 404, "entries[4].node")],
        [], (True, False, False),
    )  # fmt: skip
    recorded = tuple(n in leader.fleet.fleet for n in (pair.node, "never-seen", "elsewhere"))
    actual = (answers, status, taken["outcomes"], refused, taken["need"], recorded)
    assert expected == actual


async def test_steady_beats_are_answered_503_once_the_leader_is_unreachable_for_a_while(
    k8s: client.ApiClient, namespace: str, pair: Pair
) -> None:
    """Cut the follower off from the leader (the leader Service's stand-in has no backend):
    its steady beats are still answered 202 as liveness at first, then 503
    LeaderUnreachable once its flushes have failed for `peer_unreachable_after_s`, and 202
    again once the leader is reachable (what was held back reaches the leader)."""
    leader, follower = await pair.roles()
    agent = kit.Agent(pair.node, await kit.agent_token(k8s, namespace, pair.node))
    first = await _beat(pair.http, follower.url, agent)
    backends = await pair.proxy.cut()
    try:
        cut = await _beat(pair.http, follower.url, agent)

        async def refused() -> None:
            expected = (503, None)
            assert expected == await _beat(pair.http, follower.url, agent)

        await support.eventually(refused, what="steady beats answered 503", interval_s=0.5)
    finally:
        pair.proxy.backends.update(backends)

    async def back() -> None:
        expected = (202, "liveness")
        assert expected == await _beat(pair.http, follower.url, agent)

    await support.eventually(back, what="steady beats answered 202 again", interval_s=0.5)

    async def caught_up() -> None:
        got = leader.fleet.fleet.get(pair.node)
        assert agent.sequence - 1 <= (got.heartbeat.sequence if got else -1)

    await support.eventually(caught_up, what="the leader to take what was held back")
    expected = ((202, "change"), (202, "liveness"))
    assert expected == (first, cut)
