"""A pass of the admission plan costs its nodes and pods once: it decides exactly what the
plan decided when every Workload rebuilt every node and walked every pod (`reference`), and
the gate parses only the nodes and pods that changed since its last pass."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from controller import marks
from controller.admission import policy, views
from controller.kube import admission as kube_admission
from controller.kube import informer
from tests.unit.controller.admission import reference, test_policy
from tests.unit.controller.fleet.fakes import T0, at

CHECK = "taugrid-gpu-health"
GI = 2**30
H100 = {"nvidia.com/gpu.product": "H100"}
A100 = {"nvidia.com/gpu.product": "A100"}
DEDICATED = views.Taint("dedicated", "ml", "NoSchedule")
FLAVORS = {
    "h100": views.Flavor("h100", node_labels=H100),
    "a100": views.Flavor("a100", node_labels=A100, node_taints=(DEDICATED,)),
    "any": views.Flavor("any"),
}
NODE_NAMES = [f"n{i}" for i in range(6)]


def often(tenths: int) -> st.SearchStrategy[bool]:
    """True `tenths` times in ten."""
    return st.integers(0, 9).map(lambda i: i < tenths)


def one_of(*choices: Any) -> st.SearchStrategy[Any]:
    """A choice; repeat one to make it likelier."""
    return st.sampled_from(choices)


# Nodes are small and pods large, so that room runs out within a pass: what one Workload
# takes decides where the next one fits.
requests = st.builds(
    views.Resources,
    one_of(0, 1, 2, 4, 4, 8),
    one_of(0, 1000, 4000, 8000),
    one_of(0, GI, 8 * GI, 32 * GI),
)
taints = st.lists(
    one_of(
        views.Taint(marks.TAINT_KEY, "gpu", "NoSchedule"),
        views.Taint(views.UNSCHEDULABLE_TAINT, "", "NoSchedule"),
        views.Taint("node.kubernetes.io/not-ready", "", "NoExecute"),
        DEDICATED,
        views.Taint("soft", "x", "PreferNoSchedule"),
    ),
    max_size=2,
    unique=True,
).map(tuple)
# Pods of two runs, their attempts, and the template label `job` that tells a pod set's
# pods apart.
pod_labels = st.builds(
    lambda run, attempt, job: {
        k: v for k, v in ((marks.RUN_LABEL, run), (marks.ATTEMPT_LABEL, attempt), ("job", job))
        if v
    },
    one_of("", "r1", "r1", "r2"),
    one_of("", "1", "2", "2", "3"),
    one_of("", "a", "b"),
)  # fmt: skip
namespaces = one_of("ns", "other")


@st.composite
def fleets(draw: st.DrawFn, dra_fleet: bool) -> list[views.NodeCapacity]:
    """Nodes without usage, as the gate parses them, DRA ones with their devices; most
    are healthy nodes of flavor h100, most of them DRA nodes in a DRA fleet."""
    names = draw(st.lists(one_of(*NODE_NAMES), max_size=len(NODE_NAMES), unique=True))
    out = []
    for name in names:
        dra = draw(often(8)) if dra_fleet else draw(often(1))
        out.append(views.NodeCapacity(
            name=name,
            allocatable=views.Resources(
                draw(one_of(0, 4, 8, 8)),
                draw(one_of(8000, 16_000, views.UNLIMITED)),
                draw(one_of(16 * GI, 64 * GI, 64 * GI)),
            ),
            used=views.Resources(draw(one_of(0, 0, 2)) if dra else 0, 0, 0),
            labels=draw(one_of(H100, H100, H100, A100, {}, {**H100, "zone": "b"})),
            taints=draw(taints) if draw(often(3)) else (),
            ready=draw(often(9)),
            gpu_status=draw(one_of("", "True", "True", "True", "True", "True", "False", "Unknown")),
            gpu_reason=draw(one_of("", "XidFallenOffBus")),
            unschedulable=draw(often(1)),
            dra=dra,
            fresh=draw(often(8)) if dra else True,
            fenced=(("gpu-1", "tainted"),) if dra and draw(often(3)) else (),
        ))  # fmt: skip
    return out


@st.composite
def pods(draw: st.DrawFn) -> list[views.PodUsage]:
    """Pods of runs and others, bound or not, running or ended."""
    return [
        views.PodUsage(
            namespace=draw(namespaces),
            name=f"p{i}",
            node=draw(one_of("", *NODE_NAMES)),
            requests=draw(requests),
            phase=draw(one_of("Running", "Running", "Pending", "Succeeded", "Failed")),
            labels=draw(pod_labels),
            claimed=draw(often(2)),
        )
        for i in range(draw(st.integers(0, 8)))
    ]


@st.composite
def pod_sets(draw: st.DrawFn, name: str, dra_fleet: bool) -> views.PodSet:
    """One pod set, with the flavors its admission assigned."""
    return views.PodSet(
        name=name,
        count=draw(st.integers(0, 4)),
        requests=draw(requests),
        node_selector=draw(one_of({}, {}, {}, {"zone": "b"})),
        tolerations=draw(one_of((), (), (views.Toleration("dedicated", "Exists"),))),
        labels=draw(one_of({}, {"job": "a"}, {"job": "b"}, {"job": "a", marks.RUN_LABEL: "r1"})),
        flavors=draw(one_of(("h100",), ("h100",), ("h100",), (), ("a100",), ("any",),
                            ("h100", "any"))),
        dra=draw(often(8)) if dra_fleet else draw(often(1)),
    )  # fmt: skip


@st.composite
def workloads(draw: st.DrawFn, dra_fleet: bool) -> list[views.Workload]:
    """Workloads waiting on our check (most), passed by it, admitted, or none of ours."""
    out = []
    for i in range(draw(st.integers(0, 6))):
        names = draw(st.lists(one_of("main", "worker"), min_size=1, unique=True))
        state = draw(one_of("Pending", "Pending", "Pending", "", "Ready", "Ready", "Retry",
                            "Rejected"))  # fmt: skip
        message = draw(one_of("", "fits (no pods to place)"))
        checks = (views.CheckStatus(CHECK, state, message, draw(one_of(None, T0))),)
        out.append(views.Workload(
            namespace=draw(namespaces),
            name=f"w{i}",
            pod_sets=tuple(draw(pod_sets(n, dra_fleet)) for n in names),
            checks=checks if draw(often(9)) else (),
            cluster_queue=draw(one_of("cq", "cq", "cq", "elsewhere")),
            priority=draw(st.integers(0, 2)),
            created=draw(one_of(None, T0, at(10), at(20))),
            quota_reserved=draw(often(9)),
            admitted=draw(often(2)),
            evicted=draw(often(1)),
            finished=draw(often(1)),
            active=draw(often(9)),
            run=draw(one_of("", "r1", "r1", "r2")),
            attempt=draw(one_of(None, 1, 2, 3, 3)),
            pods_ready=draw(often(3)),
        ))  # fmt: skip
    return out


@st.composite
def passes(
    draw: st.DrawFn,
) -> tuple[list[views.Workload], list[views.NodeCapacity], list[views.PodUsage]]:
    """What one pass reads: a fleet of DRA nodes or of device-plugin nodes (a few of the
    other kind in each), its Workloads and its pods."""
    dra_fleet = draw(st.booleans())
    return draw(workloads(dra_fleet)), draw(fleets(dra_fleet)), draw(pods())


@given(
    passes(),
    one_of(None, frozenset({"cq"})),
    one_of(0.0, 15.0, 2.5),
)
@hsettings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_pass_decides_exactly_what_the_plan_that_walked_everything_decided(
    one_pass: tuple[list[views.Workload], list[views.NodeCapacity], list[views.PodUsage]],
    queues: frozenset[str] | None,
    retry_after_s: float,
) -> None:
    wls, nodes, all_pods = one_pass
    kwargs: dict[str, Any] = {"check": CHECK, "retry_after_s": retry_after_s}
    ours = policy.plan(wls, nodes, FLAVORS, all_pods, at(30), queues=queues, **kwargs)
    before = reference.plan(wls, nodes, FLAVORS, all_pods, at(30), queues=queues, **kwargs)
    assert ours == before
    used = views.with_usage(nodes, all_pods)
    for w in wls:
        one = policy.decide(w, used, FLAVORS, all_pods, at(30), **kwargs)
        assert one == reference.decide(w, used, FLAVORS, all_pods, at(30), **kwargs)


def test_the_tightest_node_is_found_past_full_and_other_flavors_nodes() -> None:
    """The ordered walk skips nodes with too few GPUs, then those of another flavor or too
    little CPU, and takes the least room that fits; names break ties."""
    nodes = [
        views.NodeCapacity("a-full", views.Resources(8, 96_000, GI), views.Resources(8, 0, 0),
                           labels=H100),
        views.NodeCapacity("b-a100", views.Resources(8, 96_000, GI), labels=A100),
        views.NodeCapacity("c-no-cpu", views.Resources(8, 96_000, GI),
                           views.Resources(4, 95_000, 0), labels=H100),
        views.NodeCapacity("e-roomy", views.Resources(8, 96_000, GI), labels=H100),
        views.NodeCapacity("d-tight", views.Resources(8, 96_000, GI),
                           views.Resources(4, 0, 0), labels=H100),
        views.NodeCapacity("f-tight", views.Resources(8, 96_000, GI),
                           views.Resources(4, 0, 0), labels=H100),
    ]  # fmt: skip
    w = views.Workload(
        "ns", "w", (views.PodSet("main", 3, views.Resources(4, 2000, 0), flavors=("h100",)),),
        checks=(views.CheckStatus(CHECK, "Pending"),), cluster_queue="cq", quota_reserved=True,
    )  # fmt: skip
    [decision] = policy.plan([w], nodes, FLAVORS, [], T0, check=CHECK).values()
    assert decision.placement == (
        ("d-tight", views.Resources(4, 2000, 0)),
        ("f-tight", views.Resources(4, 2000, 0)),
        ("e-roomy", views.Resources(4, 2000, 0)),
    )
    assert decision == reference.plan([w], nodes, FLAVORS, [], T0, check=CHECK)[("ns", "w")]


def _raw_node(name: str, *, healthy: str = "True", rv: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": rv, "labels": H100},
        "spec": {},
        "status": {"allocatable": {marks.GPU_RESOURCE: "8", "cpu": "96"},
                   "conditions": [{"type": "Ready", "status": "True"},
                                  {"type": marks.NODE_CONDITION, "status": healthy}]},
    }  # fmt: skip


def test_a_node_is_parsed_again_only_when_the_cache_replaced_it() -> None:
    """The nodes cache parses a node as it takes it and keeps the view while the node's
    trimmed copy stays the same; a node listed while the cache is unsynced is parsed, and
    reads the same."""

    async def never(**_: Any) -> Any:
        raise AssertionError  # the cache is fed by hand: it never lists

    names: list[str] = []

    def parse(raw: dict[str, Any]) -> views.NodeCapacity:
        names.append(raw["metadata"]["name"])
        return views.parse_node(raw)

    cache: informer.Informer[views.NodeCapacity] = informer.Informer(
        never, kube_admission.trim_node, kind="nodes", view=parse
    )
    cache.listed([_raw_node(f"n{i}") for i in range(4)], "1")
    first = list(cache.views.values())
    assert (len(names), [n.healthy for n in first]) == (4, [True] * 4)

    cache.event("MODIFIED", _raw_node("n2", healthy="False", rv="2"))
    cache.event("MODIFIED", _raw_node("n3", rv="3"))  # a new version that reads the same
    cache.event("DELETED", _raw_node("n0", rv="4"))
    second = dict(cache.views)
    assert len(names) == 5  # only n2, whose trimmed object changed
    assert (second["n2"].healthy, second["n3"].healthy) == (False, True)
    assert second["n1"] is first[1]
    assert "n0" not in second

    fresh = [cache.parse(_raw_node("n1"))]  # a LIST's objects are new: parsed, never kept
    assert (len(names), [n.name for n in fresh]) == (6, ["n1"])
    assert fresh[0] == first[1]


def _owned(name: str, rv: str = "7") -> dict[str, Any]:
    raw = test_policy.raw_workload(name)
    raw["metadata"]["resourceVersion"] = rv
    raw["metadata"]["ownerReferences"] = [{"kind": "Job", "name": f"job-{name}"}]
    return raw


def test_a_workload_parsed_once_joined_with_its_owners_labels_reads_as_parsed_with_them() -> None:
    """The workloads cache parses a Workload once, without its owner; the pass joins it with
    its Job's labels (`with_owner`): the same view as parsing it with them, its run and
    attempt following the owner's labels when they change, and the cached view itself when
    they name no run or the same."""
    raws = [_owned(f"w{i}") for i in range(3)]
    owners = {("ns", "Job", f"job-w{i}"): {marks.RUN_LABEL: f"r{i}", marks.ATTEMPT_LABEL: "1"}
              for i in range(3)}  # fmt: skip
    cached = [views.parse_workload(r) for r in raws]
    assert [w.owner for w in cached] == [("Job", f"job-w{i}") for i in range(3)]

    def joined() -> list[views.Workload]:
        return [views.with_owner(w, owners.get((w.namespace, *w.owner))) for w in cached]

    first = joined()
    assert first == [views.parse_workload(r, owners[views.owner_ref(r)]) for r in raws]
    assert [(w.run, w.attempt) for w in first] == [("r0", 1), ("r1", 1), ("r2", 1)]
    owners[("ns", "Job", "job-w2")] = {marks.RUN_LABEL: "r2", marks.ATTEMPT_LABEL: "2"}
    assert joined()[2] == views.parse_workload(raws[2], owners[views.owner_ref(raws[2])])
    assert (joined()[2].attempt, cached[2].attempt) == (2, None), "the cached view is kept"
    assert all(views.with_owner(w, None) is w for w in cached)
    same = views.with_owner(first[0], owners[("ns", "Job", "job-w0")])
    assert same is first[0], "labels naming the same run and attempt copy nothing"
