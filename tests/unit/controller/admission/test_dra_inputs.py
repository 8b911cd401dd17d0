"""The gate's DRA inputs, which a pass builds from caches and keeps while they stay the same:
ResourceClaims trimmed and parsed once by their cache, what they hold counted from the
cache's changes as they come, change and go (`trim_claim`, `Claims.tell`), a DRA node's GPU
capacity built again only when it changed (`WithDevices`), the pods a claim is reserved for
marked once (`MarkClaimed`). Each is held by a hypothesis property to what the gate read
before (`reference.py`: the raw claims read whole, every DRA node built every pass)."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from kubernetes_asyncio import client

from controller import marks
from controller.admission import dra, views
from controller.kube import admission as kube_admission
from controller.kube import informer
from tests.unit.controller.admission import reference
from tests.unit.controller.admission.test_plan import often, one_of

NODES = [f"n{i}" for i in range(5)]
DEVICES = [f"gpu-{i}" for i in range(4)]

# ---------------------------------------------------------------- claims

names = one_of("", "p0", "p1", "p2")
results = st.one_of(
    st.fixed_dictionaries(
        {"request": one_of("gpus", "r")},
        optional={
            "driver": one_of(marks.DRA_DRIVER, marks.DRA_DRIVER, "other.example.com"),
            "pool": one_of(*NODES),
            "device": one_of(*DEVICES),
            "adminAccess": st.booleans(),
        },
    ),
    one_of("junk", 7, None),  # not an object: read past
)
refs = st.one_of(
    st.fixed_dictionaries(
        {"uid": one_of("u1", "u2")},
        optional={
            "resource": one_of("pods", "pods", "rayclusters"),
            "apiGroup": one_of("", "ray.io"),
            "name": names,
        },
    ),
    one_of("junk", None),
)
allocations = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {},
        optional={
            "devices": st.fixed_dictionaries({}, optional={"results": st.lists(results,
                                                                               max_size=4)}),
            "nodeSelector": st.just({"nodeSelectorTerms": []}),
        },
    ),
)  # fmt: skip
claims = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries(
        {"name": one_of("c0", "c1", "c2")},
        optional={"namespace": one_of("ns", "other"), "resourceVersion": one_of("1", "2"),
                  "managedFields": st.just([{"manager": "kube-scheduler"}])})},
    optional={
        "spec": st.just({"devices": {"requests": [{"name": "gpus"}]}}),
        "status": st.fixed_dictionaries({}, optional={
            "allocation": allocations,
            "reservedFor": st.lists(refs, max_size=3),
            "devices": st.just([{"driver": marks.DRA_DRIVER, "conditions": []}]),
        }),
    },
)  # fmt: skip


class FedClaims:
    """A claims cache (`informer.Informer`, fed by hand) and the `Claims` its changes feed,
    as the gate wires them; `parsed` counts the claims it parsed."""

    def __init__(self, trim: Any = kube_admission.trim_claim) -> None:
        async def never(**_: Any) -> Any:
            raise AssertionError  # fed by hand: it never lists

        self.parsed = 0

        def parse(raw: dict[str, Any]) -> dra.Claim:
            self.parsed += 1
            return dra.parse_claim(raw)

        self.cache: informer.Informer[dra.Claim] = informer.Informer(
            never, trim, kind="resourceclaims", view=parse
        )
        self.claims = dra.Claims()
        self.cache.subscribe(lambda change: self.claims.tell(change.old, change.new))
        self._rv = 0

    def list(self, raws: list[dict[str, Any]]) -> dra.Claims:
        """The cache relists these claims (every claim there is): the changes are told."""
        self._rv += 1
        self.cache.listed(raws, str(self._rv))
        return self.claims


def _by_key(raws: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One claim per namespace/name, the last (as an API server holds them)."""
    return list({informer.key_of(c): c for c in raws}.values())


@given(
    st.lists(
        st.tuples(st.lists(claims, max_size=5), st.lists(st.booleans(), min_size=5, max_size=5)),
        max_size=6,
    )
)
@hsettings(max_examples=300, deadline=None)
def test_kept_claims_hold_what_the_raw_claims_held(
    history: list[tuple[list[dict[str, Any]], list[bool]]],
) -> None:
    """Over a history of claims that come, change, stay the same object or go, what the
    counted claims hold (from a cache of raw claims and one of trimmed claims) is what the
    gate read from all the raw claims before; a pool's version changes whenever its holdings
    do."""
    kept, trimmed = FedClaims(trim=lambda raw: raw), FedClaims()
    current: list[dict[str, Any]] = []
    for new, keep in history:
        # Some of the claims before stay the same objects, the rest are gone; new ones come.
        current = _by_key([c for c, k in zip(current, keep, strict=False) if k] + new)
        devices_before = kept.claims.devices
        pools = {p for p, _ in reference.allocated_devices(current) | devices_before}
        held_before = {pool: kept.claims.version(pool) for pool in pools}
        kept.list(current)
        trimmed.list(current)
        want = (reference.allocated_devices(current), reference.claimed_pods(current))
        for claims_ in (kept.claims, trimmed.claims):
            assert (claims_.devices, frozenset(claims_.pods)) == want
            assert all(claims_.holds(p, d) for p, d in want[0])
        for pool, version in held_before.items():
            if {d for p, d in kept.claims.devices if p == pool} != {
                    d for p, d in devices_before if p == pool}:  # fmt: skip
                assert kept.claims.version(pool) != version, pool
    parsed = kept.parsed
    kept.list(current)  # the same objects: none read again
    assert (kept.parsed, kept.claims.devices) == (parsed, reference.allocated_devices(current))


def test_a_claims_changes_that_the_gate_does_not_read_leave_its_trimmed_copy_as_it_was() -> None:
    """A new resourceVersion, conditions or managed fields: the same trimmed copy, so the
    cache keeps its object and the gate does not parse it again."""
    raw: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "c", "resourceVersion": "1"},
        "status": {"allocation": {"devices": {"results": [
            {"driver": marks.DRA_DRIVER, "pool": "n0", "device": "gpu-0", "request": "gpus"}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]},
    }  # fmt: skip
    later = {
        **raw,
        "metadata": {**raw["metadata"], "resourceVersion": "2",
                     "managedFields": [{"manager": "kube-scheduler"}]},
        "status": {**raw["status"], "devices": [{"driver": marks.DRA_DRIVER, "conditions": []}]},
    }  # fmt: skip
    assert kube_admission.trim_claim(later) == kube_admission.trim_claim(raw)
    assert dra.parse_claim(raw) == dra.Claim(frozenset({("n0", "gpu-0")}), frozenset({("ns", "p")}))

    fed = FedClaims()
    claims = fed.list([raw])
    version = claims.version("n0")
    fed.cache.event("MODIFIED", later)
    assert (fed.parsed, claims.version("n0")) == (1, version)
    fed.cache.event("MODIFIED", {**later, "status": {}})  # deallocated: read again
    assert (fed.parsed, claims.devices, dict(claims.pods)) == (2, frozenset(), {})
    assert claims.version("n0") == 0


# ---------------------------------------------------------------- DRA nodes


def raw_claim(*devices: tuple[str, str]) -> dict[str, Any]:
    results = [{"driver": marks.DRA_DRIVER, "pool": p, "device": d} for p, d in devices]
    return {"metadata": {"namespace": "ns"},
            "status": {"allocation": {"devices": {"results": results}}}}  # fmt: skip


def _node(name: str, gpus_used: int, cpu: int) -> views.NodeCapacity:
    return views.NodeCapacity(name, views.Resources(0, cpu, 1 << 30),
                              used=views.Resources(gpus_used, 0, 0))  # fmt: skip


def _devices(bad: frozenset[int], pool: str) -> tuple[dra.Slot, ...]:
    return tuple(
        dra.DeviceSlot(pool, d, i not in bad, "tainted" if i in bad else "")
        for i, d in enumerate(DEVICES)
    )


steps = st.one_of(
    st.tuples(st.just("view"), one_of(*NODES), one_of(0, 1), one_of(1000, 2000)),
    st.tuples(st.just("gpus"), one_of(*NODES), st.frozensets(st.integers(0, 3), max_size=2),
              one_of("own", "n0")),
    st.tuples(st.just("fresh"), one_of(*NODES), st.booleans()),
    st.tuples(st.just("allocate"), one_of(*NODES), one_of(*DEVICES), st.booleans()),
    st.tuples(st.just("unlisted"), one_of(*NODES), st.booleans()),
    st.tuples(st.just("gone"), one_of(*NODES), st.booleans()),
    st.tuples(st.just("nothing")),
)  # fmt: skip


@given(st.lists(steps, max_size=25))
@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_kept_dra_nodes_are_what_building_every_node_gives(todo: list[tuple[Any, ...]]) -> None:
    """Over any history of node views replaced, GPUs relisted or fenced, freshness, claims
    allocated and released, nodes the fleet stops listing and nodes gone, every call gives
    what building every node gives; a call with nothing changed builds none."""
    views_by_name = {n: _node(n, 0, 1000) for n in NODES}
    devices = {n: _devices(frozenset(), n) for n in NODES}
    fresh = dict.fromkeys(NODES, True)
    listed, present = set(NODES), set(NODES)
    allocated: dict[tuple[str, str], dict[str, Any]] = {}
    fed = FedClaims()
    memo = dra.WithDevices()
    for step in [("nothing",), *todo]:
        kind, node = step[0], (step[1] if len(step) > 1 else "")
        if kind == "view":
            views_by_name[node] = _node(node, step[2], step[3])  # a new object
        elif kind == "gpus":
            devices[node] = _devices(step[2], node if step[3] == "own" else step[3])
        elif kind == "fresh":
            fresh[node] = step[2]
        elif kind == "allocate":
            if step[3]:
                claim = raw_claim((node, step[2]))  # a new claim
                claim["metadata"]["name"] = f"{node}-{step[2]}-{len(todo)}"
                allocated[(node, step[2])] = claim
            else:
                allocated.pop((node, step[2]), None)
        elif kind in ("unlisted", "gone"):
            chosen = listed if kind == "unlisted" else present
            (chosen.add if step[2] else chosen.discard)(node)
        node_list = [views_by_name[n] for n in NODES if n in present]
        listing = {n: dra.DeviceNode(fresh[n], devices[n]) for n in NODES if n in listed}
        claims = fed.list(list(allocated.values()))
        got = memo(node_list, listing, claims)
        assert got == reference.with_devices(node_list, listing, frozenset(allocated)), step
        built = memo.built
        # The next pass, nothing changed: the fleet's listing is handed over anew as plain
        # pairs (as the app does), its GPUs the same tuples.
        fed.list(list(allocated.values()))
        again = memo(node_list, {n: (d.fresh, d.devices) for n, d in listing.items()}, claims)
        assert (again, memo.built) == (got, built), "a pass with nothing changed built a node"


# ---------------------------------------------------------------- claimed pods

pods = st.lists(
    st.builds(
        views.PodUsage,
        namespace=one_of("ns", "other"),
        name=one_of("p0", "p1", "p2", "p3"),
        node=one_of("", "n0"),
        requests=st.just(views.Resources()),
        claimed=often(1),
    ),
    max_size=6,
)
claimed_sets = st.frozensets(st.tuples(one_of("ns", "other"), one_of("p0", "p1", "p2")))


@given(st.lists(st.tuples(st.lists(st.booleans(), min_size=6, max_size=6), claimed_sets),
                max_size=6), pods)  # fmt: skip
@hsettings(max_examples=200, deadline=None)
def test_marked_pods_are_what_marking_every_pod_gives(
    history: list[tuple[list[bool], frozenset[tuple[str, str]]]], first: list[views.PodUsage]
) -> None:
    """Pods replaced or kept from call to call, claims reserved and released: each call marks
    the pods a claim names and no other, and keeps a marked copy while its pod is the same."""
    mark = dra.MarkClaimed()
    current = first
    previous: dict[int, tuple[views.PodUsage, views.PodUsage]] = {}
    for replaced, claimed in history:
        current = [dataclasses.replace(p, node="n1" if p.node == "n0" else "n0") if r else p
                   for p, r in zip(current, replaced, strict=False)]  # fmt: skip
        got = mark(current, claimed)
        want = [dataclasses.replace(p, claimed=True) if (p.namespace, p.name) in claimed else p
                for p in current]  # fmt: skip
        assert got == want
        for p, out in zip(current, got, strict=True):
            if (p.namespace, p.name) not in claimed:
                assert out is p
            elif (kept := previous.get(id(p))) is not None and kept[0] is p:
                assert out is kept[1]
        previous = {id(p): (p, out) for p, out in zip(current, got, strict=True)
                    if (p.namespace, p.name) in claimed}  # fmt: skip


async def test_the_gate_reads_its_claims_from_the_cache_once_it_is_synced() -> None:
    """Once the claims cache has listed, `list_claims` answers from it (the trimmed copies)
    and sends nothing: this store's client points at no API server, so a LIST would fail."""
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    try:
        store = kube_admission.AdmissionStore(api)
        raw = raw_claim(("n0", "gpu-0"))
        raw["spec"] = {"devices": {"requests": [{"name": "gpus"}]}}
        store.claims.listed([raw], "1")
        assert await store.list_claims() == [kube_admission.trim_claim(raw)]
    finally:
        await api.close()
