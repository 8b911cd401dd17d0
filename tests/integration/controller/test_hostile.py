"""Our own hostile corpus against a real controller on the dev cluster (DESIGN.md section 10;
security review M1, M2, M3, M5, M6, H3, L1, L4, L10): newline-suffixed values, huge
numbers, deep nesting, odd path names, oversized and slow bodies, forged heartbeat fields,
a stranger's bodies, another namespace's researcher. Each is a 4xx naming the field (never a
500), and the controller keeps answering `/healthz`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

from devcluster import cluster
from shared import spec as specs
from tests import support, worldkit
from tests.runskit import IMAGE, job_spec

pytestmark = pytest.mark.cluster

NL = "\n"
DEEP_JSON = b"[" * 100_000 + b"]" * 100_000
DEEP_YAML = b"name: x\nargs: " + b"[" * 100_000 + b"]" * 100_000 + b"\n"


@pytest_asyncio.fixture(scope="module")
async def w(
    k8s: client.ApiClient, dev_cluster: cluster.Cluster, bin_dir: pathlib.Path
) -> AsyncIterator[worldkit.World]:
    """One world for the whole corpus; a small handler timeout for the slow bodies, and a
    platform allowlist of priority classes."""
    async with worldkit.world(
        k8s, dev_cluster, bin_dir, "hostile",
        handler_timeout_s=2.0, allowed_priority_classes=("high", "low"),
    ) as world:  # fmt: skip
        yield world


def _spec(**fields: Any) -> bytes:
    return json.dumps({**job_spec("probe"), **fields}).encode()


# ---------------------------------------------------------------------- submissions
@pytest.mark.parametrize(
    ("body", "content_type", "status", "field"),
    [
        pytest.param(_spec(name="probe" + NL), "application/json", 422, "name",
                     id="a run name with a trailing newline"),
        pytest.param(_spec(image=IMAGE + NL), "application/json", 422, "image",
                     id="an image with a trailing newline"),
        pytest.param(_spec(queue="q" + NL), "application/json", 422, "queue",
                     id="a queue with a trailing newline"),
        pytest.param(_spec(labels={"team": "a" + NL}), "application/json", 422, "labels.team",
                     id="a label value with a trailing newline"),
        pytest.param(_spec(imagePullSecrets=["reg" + NL]), "application/json", 422,
                     "imagePullSecrets[0]", id="a pull secret with a trailing newline"),
        pytest.param(_spec(env={"NVIDIA_VISIBLE_DEVICES": "all"}), "application/json", 422,
                     "env.NVIDIA_VISIBLE_DEVICES", id="every GPU of the node through the env"),
        pytest.param(_spec(env={"NVIDIA_MIG_CONFIG_DEVICES": "all"}), "application/json", 422,
                     "env.NVIDIA_MIG_CONFIG_DEVICES", id="MIG devices through the env"),
        pytest.param(_spec(priority="taugrid-resume"), "application/json", 422, "priority",
                     id="the controller's resume boost"),
        pytest.param(_spec(priority="urgent"), "application/json", 422, "priority",
                     id="a priority class outside the platform's allowlist"),
        pytest.param(_spec(labels={"ray.io/node-type": "head"}), "application/json", 422,
                     "labels.ray.io/node-type", id="a label KubeRay acts on"),
        pytest.param(_spec(labels={"controller-uid": "x"}), "application/json", 422,
                     "labels.controller-uid", id="a label the Job controller selects by"),
        pytest.param(_spec(volumes=[{"claim": "d", "mountPath": "/var/run/secrets/x"}]),
                     "application/json", 422, "volumes[0].mountPath",
                     id="a volume over the ServiceAccount token directory"),
        pytest.param(_spec(resources={"gpus": 1, "cpu": 10**19}), "application/json", 422,
                     "resources.cpu", id="a cpu beyond int64"),
        pytest.param(_spec(workers="__N__").replace(b'"__N__"', b"1" * 5000),
                     "application/json", 400, "", id="a five-thousand-digit JSON integer"),
        pytest.param(_spec(workers="__N__").replace(b'"__N__"', b"1e400"), "application/json",
                     400, "", id="a JSON number past a double"),
        pytest.param(_spec(workers="__N__").replace(b'"__N__"', b"NaN"), "application/json",
                     400, "", id="NaN"),
        pytest.param(DEEP_JSON, "application/json", 400, "", id="JSON nested 100k deep"),
        pytest.param(DEEP_YAML, "application/yaml", 400, "", id="YAML nested 100k deep"),
        pytest.param(b"name: x\nargs: [" + b"a, " * 20_000 + b"]\n", "application/yaml", 400,
                     "", id="twenty thousand YAML nodes"),
        pytest.param(b"name: x\nworkers: " + b"9" * 4400 + b"\n", "application/yaml", 400,
                     "workers", id="a YAML integer past CPython's conversion limit"),
        pytest.param(b"x" * (2 << 20), "application/yaml", 413, "", id="a 2 MiB body"),
        pytest.param(_spec(), "text/html", 415, "", id="a body that says it is HTML"),
    ],
)  # fmt: skip
async def test_hostile_submissions_are_refused_naming_the_field(
    w: worldkit.World, body: bytes, content_type: str, status: int, field: str
) -> None:
    """Each is refused with its 4xx and field, on a dry run and on a real submission alike,
    and no TauRun is created."""
    for dry in ("true", "false"):
        got, answer = await w.call(
            "POST", "/v1/runs", token=w.researcher_a, body=body, content_type=content_type,
            params={"namespace": w.ns_a, "dryRun": dry},
        )  # fmt: skip
        assert (status, field) == (got, answer["error"]["field"]), (dry, answer)
    got, _ = await w.call("GET", f"/v1/runs/{w.ns_a}/probe", token=w.researcher_a)
    assert got == 404, "a refused submission created a run"
    assert await w.healthy()


async def test_a_dry_run_renders_attempt_one_and_creates_nothing(w: worldkit.World) -> None:
    """`?dryRun=true` authorises, parses, validates, renders and has the API server check
    the objects, then answers 200 with them; nothing is created. A CPU-only container is
    rendered with NVIDIA_VISIBLE_DEVICES=void (H3)."""
    spec = job_spec("dry", gpus=0)
    status, answer = await w.call(
        "POST", "/v1/runs", token=w.researcher_a, body=json.dumps(spec).encode(),
        params={"namespace": w.ns_a, "dryRun": "true"},
    )  # fmt: skip
    assert status == 200, answer
    kinds = [o["kind"] for o in answer["objects"]]
    job = next(o for o in answer["objects"] if o["kind"] == "Job")
    env = {
        e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    actual = {
        "dryRun": answer["dryRun"],
        "run": (answer["run"]["kind"], answer["run"]["metadata"]["name"]),
        "kinds": kinds,
        "void": env.get("NVIDIA_VISIBLE_DEVICES"),
        "queue": job["metadata"]["labels"].get("kueue.x-k8s.io/queue-name"),
    }
    expected = {
        "dryRun": True,
        "run": ("TauRun", "dry"),
        "kinds": ["ConfigMap", "Job"],
        "void": "void",
        "queue": "q",
    }
    assert expected == actual
    got, _ = await w.call("GET", f"/v1/runs/{w.ns_a}/dry", token=w.researcher_a)
    jobs = await client.BatchV1Api(w.api).list_namespaced_job(w.ns_a)
    created = (got, sorted(j.metadata.name for j in jobs.items))
    assert (404, [f"{w.run}-a1"]) == created, "a dry run created something"


async def test_bodies_of_an_identity_that_may_not_submit_are_never_parsed(
    w: worldkit.World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """M3: a stranger (no RBAC) posting big YAML bodies gets 403 and the parser never runs,
    whether the namespace comes from ?namespace=, from the body or not at all; an allowed
    researcher's body is parsed (so the counter counts)."""
    calls: list[int] = []
    parse = specs.parse_spec

    def counting(data: bytes, content_type: str | None = None) -> specs.ParsedSpec:
        calls.append(len(data))
        return parse(data, content_type)

    monkeypatch.setattr(specs, "parse_spec", counting)
    big = b"name: x\nnamespace: %s\nargs: [" % w.ns_a.encode() + b"'aaaa', " * 80_000 + b"]\n"
    for params in ({"namespace": w.ns_a}, {}):
        for _ in range(6):
            status, answer = await w.call(
                "POST", "/v1/runs", token=w.stranger, body=big, content_type="application/yaml",
                params=params,
            )  # fmt: skip
            assert (status, answer["error"]["code"]) == (403, "Forbidden"), answer
    no_namespace = big.replace(b"namespace: %s\n" % w.ns_a.encode(), b"")
    status, answer = await w.call("POST", "/v1/runs", token=w.stranger, body=no_namespace,
                                  content_type="application/yaml")  # fmt: skip
    assert status == 403, answer
    assert "namespace default" in answer["error"]["message"]
    stranger_parses = len(calls)
    status, _ = await w.call("POST", "/v1/runs", token=w.researcher_a,
                             body=_spec(name="counted"), params={"dryRun": "true",
                             "namespace": w.ns_a})  # fmt: skip
    expected = (0, 200, 1)
    assert expected == (stranger_parses, status, len(calls))


async def test_a_namespace_declared_in_the_body_is_authorised_before_the_parse(
    w: worldkit.World,
) -> None:
    """Without ?namespace=, the body's own `namespace:` line is where the caller must be
    allowed: researcher B may not submit into A's namespace that way either."""
    body = _spec(name="sneaky", namespace=w.ns_a)
    status, answer = await w.call("POST", "/v1/runs", token=w.researcher_b, body=body,
                                  params={"dryRun": "true"})  # fmt: skip
    own, _ = await w.call(
        "POST",
        "/v1/runs",
        token=w.researcher_b,
        body=_spec(name="mine", namespace=w.ns_b),
        params={"dryRun": "true"},
    )
    expected = ((403, "Forbidden"), 200)
    assert expected == ((status, answer["error"]["code"]), own)


async def test_an_api_server_refusal_is_a_422_naming_the_field_and_no_run(
    w: worldkit.World,
) -> None:
    """An object the API server (here a ValidatingAdmissionPolicy, which names no field)
    refuses is refused at submission with a 422 carrying the API server's words, before any
    TauRun exists: never a 500, never a run the reconciler retries forever (M1). Refusals that
    name a field are mapped to the tau.yaml field (unit-tested in test_rendering)."""
    adm = client.AdmissionregistrationV1Api(w.api)
    name = f"no-forbidden-images-{w.ns_b}"[:63]
    policy = {
        "metadata": {"name": name, "labels": {"taugrid.dev/test": "true"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["jobs"]}]},
            "validations": [{
                "expression": "object.spec.template.spec.containers.all(c,"
                              " !c.image.startsWith('forbidden.example/'))",
                "message": "images from forbidden.example are not allowed here",
                "reason": "Invalid",
            }],
        },
    }  # fmt: skip
    binding = {
        "metadata": {"name": name, "labels": {"taugrid.dev/test": "true"}},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": w.ns_b}}},
        },
    }  # fmt: skip
    await adm.create_validating_admission_policy(policy)
    await adm.create_validating_admission_policy_binding(binding)
    try:
        image = "forbidden.example/x@sha256:" + "1" * 64

        async def in_force() -> None:
            # A dry run, so nothing is created while the policy is not yet in force.
            status, answer = await w.call(
                "POST", "/v1/runs", token=w.researcher_b, body=_spec(name="probe", image=image),
                params={"namespace": w.ns_b, "dryRun": "true"},
            )  # fmt: skip
            assert status == 422, answer

        await support.eventually(in_force, what="the policy to refuse the Job")
        status, answer = await w.call("POST", "/v1/runs", token=w.researcher_b,
                                      body=_spec(name="refused", image=image),
                                      params={"namespace": w.ns_b})  # fmt: skip
        assert status == 422, answer
        error = answer["error"]
        got, _ = await w.call("GET", f"/v1/runs/{w.ns_b}/refused", token=w.researcher_b)
        expected = ("", "RejectedByAPIServer", True, 404)
        actual = (error["field"], error["code"], "forbidden.example" in error["message"], got)
        assert expected == actual
    finally:
        await adm.delete_validating_admission_policy_binding(name)
        await adm.delete_validating_admission_policy(name)


# ---------------------------------------------------------------------- paths and queries
ODD_NAMES = [
    pytest.param("%2e", id="a run named . (the TauRun collection)"),
    pytest.param("%2e%2e", id="a run named .."),
    pytest.param("x%2F..%2Fy", id="an encoded x/../y"),
    pytest.param("x%2Flogs", id="an encoded /logs suffix (L2: never a streaming route)"),
    pytest.param("a%0A", id="a name with a trailing newline"),
    pytest.param("a" * 300, id="a name longer than Kubernetes allows"),
    pytest.param("%00", id="a NUL"),
]
RUN_ROUTES = [
    ("GET", ""), ("DELETE", ""), ("GET", "/logs"), ("GET", "/evidence"),
    ("POST", "/checkpoints"), ("GET", "/checkpoints"), ("GET", "/checkpoints/latest"),
    ("POST", "/resume"), ("POST", "/rerun"), ("POST", "/results"), ("GET", "/results"),
]  # fmt: skip


@pytest.mark.parametrize("name", ODD_NAMES)
async def test_odd_names_in_paths_are_a_400_naming_the_parameter(
    w: worldkit.World, name: str
) -> None:
    """L1: every run and node route refuses a name Kubernetes would not accept (400 naming
    `name`), never reads the TauRun collection as a run, never a 500."""
    answers = {}
    for method, suffix in RUN_ROUTES:
        status, body = await w.call(method, f"/v1/runs/{w.ns_a}/{name}{suffix}",
                                    token=w.researcher_a, body=b"{}")  # fmt: skip
        answers[f"{method} run{suffix}"] = (status, body["error"]["field"])
    for method, suffix in [("GET", ""), ("POST", "/quarantine"), ("DELETE", "/quarantine")]:
        status, body = await w.call(method, f"/v1/nodes/{name}{suffix}", token=w.oncall,
                                    body=b'{"reason": "x"}')  # fmt: skip
        answers[f"{method} node{suffix}"] = (status, body["error"]["field"])
    assert dict.fromkeys(answers, (400, "name")) == answers


@pytest.mark.parametrize(
    ("path", "token", "field"),
    [
        pytest.param("/v1/runs?namespace=a%0A", "researcher_a", "namespace",
                     id="a namespace filter with a newline"),
        pytest.param("/v1/runs?phase=Exploded", "researcher_a", "phase",
                     id="a phase that does not exist"),
        pytest.param("/v1/queues?namespace=..", "researcher_a", "namespace",
                     id="a queues namespace of .."),
        pytest.param("/v1/runs/{ns}/owned/logs?worker=%C2%B2", "researcher_a", "worker",
                     id="a superscript two as a worker number (L10)"),
        pytest.param("/v1/runs/{ns}/owned/logs?tail=" + "9" * 5000, "researcher_a", "tail",
                     id="a five-thousand-digit tail"),
        pytest.param("/v1/runs/{ns}/owned/logs?attempt=0", "researcher_a", "attempt",
                     id="attempt zero"),
        pytest.param("/v1/runs/{ns}/owned/logs?follow=maybe", "researcher_a", "follow",
                     id="a follow that is no boolean"),
        pytest.param("/v1/runs?namespace={ns}&namespace=other", "researcher_a", "namespace",
                     id="a parameter given twice"),
        pytest.param("/v1/nodes?state=Melting", "oncall", "state", id="a node state unknown"),
    ],
)  # fmt: skip
async def test_bad_query_parameters_are_a_400_naming_them(
    w: worldkit.World, path: str, token: str, field: str
) -> None:
    """Query parameters are validated like bodies: bounds, enums, one value each."""
    status, body = await w.call("GET", path.replace("{ns}", w.ns_a), token=getattr(w, token))
    expected = (400, field)
    assert expected == (status, body["error"]["field"])


# ---------------------------------------------------------------------- JSON bodies
JSON_BODIES = [
    pytest.param(b'{"a": ' + b"1" * 5000 + b"}", 400, id="a five-thousand-digit integer"),
    pytest.param(b'{"a": 1e400}', 400, id="a number past a double"),
    pytest.param(b'{"a": NaN}', 400, id="NaN"),
    pytest.param(DEEP_JSON, 400, id="nested 100k deep"),
    pytest.param(b'{"reason": "a", "reason": "b"}', 400, id="a duplicate key"),
    pytest.param(b"[1, 2]", 422, id="a list where an object belongs"),
    pytest.param(b"\xff\xfe", 400, id="bytes that are not UTF-8"),
]


@pytest.mark.parametrize(("body", "status"), JSON_BODIES)
async def test_hostile_json_bodies_are_refused_on_every_json_route(
    w: worldkit.World, body: bytes, status: int
) -> None:
    """M2: checkpoints, resume, quarantine, mode and heartbeats refuse each body with a 4xx
    (400 for what cannot be read, 422 for what is not the object asked for), never a 500."""
    routes = {
        "checkpoint": ("POST", f"/v1/runs/{w.ns_a}/{w.run}/checkpoints", w.run_token),
        "results": ("POST", f"/v1/runs/{w.ns_a}/{w.run}/results", w.run_token),
        "rerun": ("POST", f"/v1/runs/{w.ns_a}/{w.run}/rerun", w.researcher_a),
        "resume": ("POST", f"/v1/runs/{w.ns_a}/{w.run}/resume", w.researcher_a),
        "quarantine": ("POST", f"/v1/nodes/{w.node}/quarantine", w.oncall),
        "release": ("DELETE", f"/v1/nodes/{w.node}/quarantine", w.oncall),
        "mode": ("PUT", "/v1/fleet/mode", w.oncall),
        "heartbeat": ("POST", "/v1/heartbeats", w.agent),
    }
    answers = {}
    for label, (method, path, token) in routes.items():
        got, answer = await w.call(method, path, token=token, body=body)
        answers[label] = (got, isinstance(answer, dict) and "error" in answer)
    assert dict.fromkeys(routes, (status, True)) == answers, "each answer is the error envelope"
    assert await w.healthy()


# ---------------------------------------------------------------------- heartbeats (M6)
def _heartbeat(node: str, **fields: Any) -> dict[str, Any]:
    return {
        "schemaVersion": 1, "nodeName": node, "bootId": "boot-1", "intervalS": 5,
        "sequence": 1, "sentAt": dt.datetime.now(dt.UTC).isoformat(),
        "gpus": [{"index": 0, "uuid": f"GPU-{node}-0", "verdict": "Healthy"}], **fields,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        pytest.param({"sequence": 2**63}, "sequence", id="a sequence past int64"),
        pytest.param({"intervalS": 3600}, "intervalS",
                     id="an interval that would hide a dead node for three hours"),
        pytest.param({"sentAt": "9999-12-31T23:59:59Z"}, "sentAt",
                     id="a report from the year 9999 that would freeze the node"),
        pytest.param({"sentAt": "2026-01-01T00:00:00"}, "sentAt", id="a time without a zone"),
    ],
)  # fmt: skip
async def test_forged_heartbeat_fields_are_refused(
    w: worldkit.World, fields: dict[str, Any], field: str
) -> None:
    """Every field of a heartbeat is bounded (DESIGN.md section 10), even from the node's
    own agent token: 422 naming it, and the node's record is not touched."""
    body = json.dumps(_heartbeat(w.node, **fields)).encode()
    status, answer = await w.call("POST", "/v1/heartbeats", token=w.agent, body=body)
    expected = (422, field)
    assert expected == (status, answer["error"]["field"])


async def test_the_agent_url_comes_from_the_bound_pod_not_the_body(w: worldkit.World) -> None:
    """M6: an agentUrl in the body is ignored; the node shows the IP of the pod the agent's
    token is bound to, at the agents' port. That pod is looked up once (one LIST of the
    install namespace, then its watch), not once per heartbeat."""
    await asyncio.wait_for(w.controller.fleet.agents.pods.synced.wait(), 30)
    for sequence in range(1, 6):
        body = json.dumps(_heartbeat(w.node, sequence=sequence,
                                     agentUrl="https://attacker.example/")).encode()  # fmt: skip
        status, answer = await w.call("POST", "/v1/heartbeats", token=w.agent, body=body)
        assert status == 202, answer
    pod = await client.CoreV1Api(w.api).read_namespaced_pod(f"agent-{w.node}"[:63], w.ns_a)
    got, node = await w.call("GET", f"/v1/nodes/{w.node}", token=w.oncall)
    expected = (200, f"http://{pod.status.pod_ip}:9400", 1)
    assert expected == (got, node["agentUrl"], w.controller.fleet.agents.pods.lists)


# ---------------------------------------------------------------------- slow bodies
async def test_a_body_that_never_finishes_times_out_and_the_controller_answers(
    w: worldkit.World,
) -> None:
    """A client that sends headers and then trickles nothing gets the handler timeout (504)
    and ties up nothing else: /healthz answers while it waits."""
    host, port = w.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = (
            f"POST /v1/runs?namespace={w.ns_a} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {w.researcher_a}\r\nContent-Type: application/yaml\r\n"
            "Content-Length: 100000\r\n\r\nname: slow\n"
        )
        writer.write(head.encode())
        await writer.drain()
        assert await w.healthy(), "the controller stopped answering while a body trickles"
        status_line = await asyncio.wait_for(reader.readline(), timeout=support.DEADLINE_S)
    finally:
        writer.close()
    expected = b"HTTP/1.1 504"
    assert expected == status_line[:12]
    assert await w.healthy()


# ---------------------------------------------------------------------- object level
async def test_another_namespaces_researcher_can_do_nothing_to_a_run(w: worldkit.World) -> None:
    """Researcher B, allowed everything in namespace B, gets 403 on every call about A's
    run, its logs, evidence and checkpoints, and on A's lists and queues; the run is
    unchanged afterwards (DESIGN.md section 10: tenants)."""
    before = await w.call("GET", f"/v1/runs/{w.ns_a}/{w.run}", token=w.researcher_a)
    base = f"/v1/runs/{w.ns_a}/{w.run}"
    report = json.dumps({"attempt": 1, "step": 5, "path": "/ckpt/5"}).encode()
    calls = [
        ("GET", base, None), ("DELETE", base, None), ("GET", f"{base}/logs", None),
        ("GET", f"{base}/evidence", None), ("POST", f"{base}/checkpoints", report),
        ("GET", f"{base}/checkpoints", None), ("GET", f"{base}/checkpoints/latest", None),
        ("POST", f"{base}/resume", b"{}"), ("POST", f"{base}/rerun", b"{}"),
        ("POST", f"{base}/results", b'{"attempt": 1}'), ("GET", f"{base}/results", None),
        ("GET", f"/v1/runs?namespace={w.ns_a}", None), ("GET", "/v1/runs", None),
        ("GET", f"/v1/queues?namespace={w.ns_a}", None),
        ("GET", f"/v1/experiments?namespace={w.ns_a}", None),
        ("GET", f"/v1/experiments/compare?namespace={w.ns_a}&run={w.run}", None),
    ]  # fmt: skip
    answers = {}
    for method, path, body in calls:
        status, _ = await w.call(method, path, token=w.researcher_b, body=body)
        answers[f"{method} {path}"] = status
    assert dict.fromkeys(answers, 403) == answers
    after = await w.call("GET", f"/v1/runs/{w.ns_a}/{w.run}", token=w.researcher_a)
    assert before[1]["checkpoints"] == after[1]["checkpoints"]
    assert before[1]["phase"] == after[1]["phase"]
