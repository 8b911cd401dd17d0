"""The admission gate's pass on a big fleet: what it costs now against what it cost when every
Workload rebuilt every node and walked every pod, side by side.

Pure core only, in one process (no cluster, no HTTP): N nodes of 8 GPUs with the labels a GPU
node carries, one agent pod on each, and a training pod of 8 GPUs on every other node (half
the fleet is full); W Workloads of 2 pods × 8 GPUs wait on the check, and 20 admitted
Workloads' pods are bound. For each N and W, in the same run and on the same state:

- parsing the nodes and pods: all of them (a pass before, or the first pass after a relist),
  and what the caches parse now, as they take the 1 % of them a watch replaced (each is
  parsed once as it arrives: `controller.kube.informer`);
- `policy.plan` against the plan that walked everything (`tests/unit/.../reference.py`),
  checking that both decide the same;
- what the caches' views hold for the fleet (tracemalloc), the leader's memory it costs.

`--dra`: the same fleet as DRA nodes (8 devices each, one 8-device ResourceClaim on every
other node, reserved for that node's training pod), and what a pass builds before the plan
when a DRA Workload waits: the claims, the devices they hold, the pods they are reserved
for and each DRA node's GPU capacity. Before: the claims LISTed every pass (the controller's
share of it, decoding the body, is timed; the API server's is not) and read whole, every
pod and node rebuilt (`reference.py`). Now: the claims cache's watch events for the 1 % of
claims that changed (each trimmed and parsed once, what the claims hold counted from the
change: `dra.Claims.tell`), and only the changed nodes rebuilt, 1 % of nodes, GPU listings
and claims replaced since the pass before.

`--workloads`: W Workloads in the cache (the unit tests' Workload: 2 pods × 8 GPUs admitted
in a flavor, our check Ready, a Job owner, the run's labels on its pod template as on every
run's Workload; a real template is bigger, so "before" is a floor), read as a pass reads
them when one waits: once to see whether one does, again with the owners' labels. Before:
parsed twice every pass. Now: each parsed once as the workloads cache takes it (1 % of them
replaced by the watch since the pass before), then joined with its owner's labels
(`views.with_owner`, 1 % of them changed).

Timings are medians of repeated calls (a single call where the old plan takes seconds); the
machine is shared, so read the ratio within a row.

Run: `.venv/bin/python -m bench.gatepass [N ...]` (default 1000 10000); `--dra [N ...]`;
`--workloads [W ...]` (default 1000 5000).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from controller import marks
from controller.admission import dra, policy, views
from controller.kube import admission as kube_admission
from controller.kube import informer
from tests.unit.controller.admission import reference, test_policy

CHECK = marks.DEFAULT_ADMISSION_CHECK
NOW = dt.datetime(2026, 3, 1, 12, tzinfo=dt.UTC)
PRODUCT = {"nvidia.com/gpu.product": "NVIDIA-H200"}
FLAVORS = {"h200": views.Flavor("h200", node_labels=PRODUCT)}
WAITING = (1, 10, 50)
ADMITTED = 20
CHANGED = 0.01


def _median_ms(run: Callable[[], object], repeats: int) -> float:
    took = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        took.append(time.perf_counter() - start)
    return 1e3 * statistics.median(took)


def _node(i: int, *, version: int = 1) -> dict[str, Any]:
    name = f"gpu-{i:06d}"
    labels = {**PRODUCT, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "topology.kubernetes.io/zone": f"z{i % 4}",
              "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "143771",
              "node.kubernetes.io/instance-type": "p5en.48xlarge"}  # fmt: skip
    return {
        "metadata": {"name": name, "labels": labels, "resourceVersion": str(version)},
        "spec": {"unschedulable": False, "taints": []},
        "status": {"allocatable": {marks.GPU_RESOURCE: "8", "cpu": "192", "memory": "2Ti",
                                   "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"},
                                  {"type": marks.NODE_CONDITION, "status": "True",
                                   "reason": "AllGPUsHealthy"}]},
    }  # fmt: skip


def _pod(name: str, node: str, *, gpus: int, labels: dict[str, str]) -> dict[str, Any]:
    limits = {marks.GPU_RESOURCE: str(gpus)} if gpus else {}
    return {
        "metadata": {"namespace": "research" if gpus else "taugrid", "name": name,
                     "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {
            "requests": {"cpu": "16" if gpus else "100m", "memory": "64Gi" if gpus else "128Mi"},
            "limits": limits}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def _pods(count: int) -> list[dict[str, Any]]:
    out = [_pod(f"agent-{i}", f"gpu-{i:06d}", gpus=0, labels={"app": "taugrid-agent"})
           for i in range(count)]  # fmt: skip
    for i in range(0, count, 2):
        run = f"run-{i // 2 % ADMITTED}"
        labels = {marks.RUN_LABEL: run, marks.ATTEMPT_LABEL: "1", "job-name": run}
        out.append(_pod(f"{run}-{i}", f"gpu-{i:06d}", gpus=8, labels=labels))
    return out


def _workload(name: str, *, state: str, admitted: bool) -> views.Workload:
    pod_set = views.PodSet("main", 2, views.Resources(8, 16_000, 64 * 2**30),
                           labels={"job-name": name}, flavors=("h200",))  # fmt: skip
    return views.Workload(
        "research", name, (pod_set,), checks=(views.CheckStatus(CHECK, state),),
        cluster_queue="gpu", quota_reserved=True, admitted=admitted, run=name, attempt=1,
        created=NOW - dt.timedelta(minutes=len(name)),
    )  # fmt: skip


def measure(count: int, waiting: int) -> dict[str, float]:
    """One row's figures, in ms and MB."""
    raw_nodes, raw_pods = [_node(i) for i in range(count)], _pods(count)
    node_cache, pod_cache = _caches(raw_nodes, raw_pods)
    step = int(1 / CHANGED)
    flips = iter(range(1 << 30))

    def parse_all() -> object:
        return [views.parse_node(n) for n in raw_nodes], [views.parse_pod(p) for p in raw_pods]

    def parse_kept() -> object:
        # The watch brings the 1 % that changed (a new version each time); the caches parse
        # them as they take them, and a pass reads the views.
        version = 2 + next(flips)
        for i in range(0, count, step):
            node_cache.event("MODIFIED", _node(i, version=version))
        for i in range(0, len(raw_pods), step):
            pod = raw_pods[i]
            labels = {**pod["metadata"].get("labels", {}), "v": str(version)}
            pod_cache.event("MODIFIED", {**pod, "metadata": {**pod["metadata"], "labels": labels}})
        return list(node_cache.views.values()), list(pod_cache.views.values())

    node_list = [views.parse_node(n) for n in raw_nodes]
    pods = [views.parse_pod(p) for p in raw_pods]
    workloads = [_workload(f"run-{i}", state="Ready", admitted=True) for i in range(ADMITTED)]
    workloads += [_workload(f"wait-{i}", state="Pending", admitted=False) for i in range(waiting)]

    def ours() -> dict[tuple[str, str], policy.Decision]:
        return policy.plan(workloads, node_list, FLAVORS, pods, NOW, check=CHECK)

    def before() -> dict[tuple[str, str], policy.Decision]:
        return reference.plan(workloads, node_list, FLAVORS, pods, NOW, check=CHECK)

    decided = ours()
    assert decided == before(), "the plan decided otherwise than the plan that walked all"
    assert len(decided) == waiting, f"{len(decided)} decisions for {waiting} waiting"
    slow = 1 if count * waiting > 100_000 else 5
    tracemalloc.start()  # the views the caches keep beside their trimmed copies
    held = ([views.parse_node(n) for n in node_cache.items.values()],
            [views.parse_pod(p) for p in pod_cache.items.values()])  # fmt: skip
    kept_mb = tracemalloc.get_traced_memory()[0] / 1e6
    tracemalloc.stop()
    del held
    return {
        "parse_all": _median_ms(parse_all, 5), "parse_kept": _median_ms(parse_kept, 5),
        "plan": _median_ms(ours, 5), "plan_before": _median_ms(before, slow),
        "kept_mb": kept_mb,
    }  # fmt: skip


async def _never(**_: Any) -> Any:
    raise AssertionError  # the caches are fed by hand: they never list


def _caches(
    raw_nodes: list[dict[str, Any]], raw_pods: list[dict[str, Any]]
) -> tuple[informer.Informer[views.NodeCapacity], informer.Informer[views.PodUsage]]:
    """The gate's node and pod caches, listed, parsing with the gate's parsers."""
    nodes: informer.Informer[views.NodeCapacity] = informer.Informer(
        _never, kube_admission.trim_node, kind="nodes", view=views.parse_node
    )
    pods: informer.Informer[views.PodUsage] = informer.Informer(
        _never, kube_admission.trim_pod, kind="pods", view=views.parse_pod
    )
    nodes.listed(raw_nodes, "1")
    pods.listed(raw_pods, "1")
    return nodes, pods


def _claim(i: int, *, version: int = 1) -> dict[str, Any]:
    """An 8-device claim on node i as the API server returns it, allocated and reserved for
    the node's training pod (`_pods`)."""
    node = f"gpu-{i:06d}"
    results = [{"request": "gpus", "driver": marks.DRA_DRIVER, "pool": node,
                "device": f"gpu-{d}"} for d in range(8)]  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "namespace": "research", "name": f"run-{i // 2 % ADMITTED}-{i}-gpus-x7k2p",
            "uid": f"0c4e-{i:06d}", "resourceVersion": str(version),
            "creationTimestamp": "2026-03-01T11:00:00Z",
            "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": f"run-{i}",
                                 "uid": f"9a1f-{i:06d}", "controller": True}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                               "apiVersion": "resource.k8s.io/v1", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:spec": {"f:devices": {}}}},
                              {"manager": "kube-scheduler", "operation": "Update",
                               "subresource": "status", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:status": {"f:allocation": {},
                                                         "f:reservedFor": {}}}}],
        },
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": marks.DRA_DRIVER, "allocationMode": "ExactCount",
            "count": 8}}]}},
        "status": {
            "allocation": {"devices": {"results": results},
                           "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                               {"key": "metadata.name", "operator": "In",
                                "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": f"run-{i // 2 % ADMITTED}-{i}",
                             "uid": f"9a1f-{i:06d}"}],
        },
    }  # fmt: skip


def measure_dra(count: int) -> dict[str, float]:
    """The DRA inputs of one pass, before and now, in ms."""
    step = int(1 / CHANGED)
    node_list = [dataclasses.replace(views.parse_node(_node(i)),
                                     allocatable=views.Resources(0, 192_000, 2 << 40))
                 for i in range(count)]  # fmt: skip
    pods = [views.parse_pod(p) for p in _pods(count)]
    raw_claims = [_claim(i) for i in range(0, count, 2)]
    body = json.dumps({"kind": "ResourceClaimList", "items": raw_claims}).encode()

    def listing(i: int) -> tuple[dra.Slot, ...]:
        name = f"gpu-{i:06d}"
        return tuple(dra.DeviceSlot(name, f"gpu-{d}", True) for d in range(8))

    gpus = [listing(i) for i in range(count)]
    with_devices, mark = dra.WithDevices(), dra.MarkClaimed()
    claims = dra.Claims()
    cache: informer.Informer[dra.Claim] = informer.Informer(
        _never, kube_admission.trim_claim, kind="resourceclaims", view=dra.parse_claim
    )
    cache.subscribe(lambda change: claims.tell(change.old, change.new))
    cache.listed(raw_claims, "1")

    def report_of(listings: list[tuple[dra.Slot, ...]]) -> dict[str, Any]:
        # What the fleet hands the gate each pass (`Quarantiner.device_report`), both ways.
        return {n.name: (True, g) for n, g in zip(node_list, listings, strict=True)}

    def now(nodes: list[views.NodeCapacity], report: dict[str, Any],
            events: list[dict[str, Any]]) -> tuple[object, object]:  # fmt: skip
        for claim in events:  # the watch's events since the pass before
            cache.event("MODIFIED", claim)
        return with_devices(nodes, report, claims), mark(pods, claims.pods)

    def before(nodes: list[views.NodeCapacity], report: dict[str, Any]) -> tuple[object, object]:
        dra = {node: dra.DeviceNode(fresh, found) for node, (fresh, found) in report.items()}
        raw = json.loads(body)["items"]
        claimed = reference.claimed_pods(raw)
        built = reference.with_devices(nodes, dra, reference.allocated_devices(raw))
        return built, [dataclasses.replace(p, claimed=True)
                       if (p.namespace, p.name) in claimed else p for p in pods]  # fmt: skip

    # Two states 1 % apart (node views, GPU listings and claims replaced: the claims as the
    # watch brings them, each with a new version), the rest the same objects: each call after
    # the first finds 1 % changed since the call before.
    report = report_of(gpus)
    changing = range(0, len(raw_claims), step)
    states = [(node_list, report, [_claim(2 * i, version=3) for i in changing]), (
        [dataclasses.replace(n) if i % step == 0 else n for i, n in enumerate(node_list)],
        report_of([listing(i) if i % step == 0 else g for i, g in enumerate(gpus)]),
        [_claim(2 * i, version=2) for i in changing],
    )]  # fmt: skip
    calls = iter(range(1 << 30))

    def changed() -> tuple[object, object]:
        return now(*states[next(calls) % 2])

    assert now(*states[1]) == before(node_list, report), "the inputs differ"
    assert changed() == before(node_list, report), "the kept inputs differ"
    built = with_devices.built
    changed()
    assert with_devices.built - built == len(range(0, count, step)), "kept nodes were built"
    return {
        "decode": _median_ms(lambda: json.loads(body), 5),
        "before": _median_ms(lambda: before(node_list, report), 5),
        "now": _median_ms(changed, 5),
        "list_mb": len(body) / 1e6,
    }


def measure_workloads(count: int) -> dict[str, float]:
    """Reading W Workloads in one pass, before and now, in ms."""
    step = int(1 / CHANGED)

    def raw(i: int, version: int = 1) -> dict[str, Any]:
        # The pod template carries the run labels, as every Workload of a run does (its Job's
        # pods are rendered with them).
        out = test_policy.raw_workload(f"job-{i}", state="Ready", labels=owner(i),
                                       conditions=("QuotaReserved", "Admitted"))  # fmt: skip
        out["metadata"]["resourceVersion"] = str(version)
        out["metadata"]["ownerReferences"] = [{"kind": "Job", "name": f"job-{i}"}]
        return out

    def owner(i: int, attempt: int = 1) -> dict[str, str]:
        return {marks.RUN_LABEL: f"run-{i}", marks.ATTEMPT_LABEL: str(attempt)}

    def key(i: int) -> tuple[str, str, str]:
        return ("ns", "Job", f"job-{i}")

    first = [raw(i) for i in range(count)]
    states = [
        (first, {key(i): owner(i) for i in range(count)}),
        ([raw(i, 2) if i % step == 0 else r for i, r in enumerate(first)],
         {key(i): owner(i, 2 if i % step == 1 else 1) for i in range(count)}),
    ]  # fmt: skip
    cache: informer.Informer[views.Workload] = informer.Informer(
        _never, informer.trim_object, kind="workloads", view=views.parse_workload
    )
    cache.listed(first, "1")
    version = iter(range(2, 1 << 30))

    def now() -> object:
        # The watch replaces 1 % of the Workloads (each parsed once, as it arrives); a pass
        # joins every one with its owner's labels, 1 % of them changed.
        raws, owners = states[next(calls) % 2]
        for i in range(0, count, step):
            cache.event("MODIFIED", {**raws[i], "metadata": {**raws[i]["metadata"],
                                     "resourceVersion": str(next(version))}})  # fmt: skip
        listed = list(cache.views.values())
        return listed, [views.with_owner(w, owners.get((w.namespace, *w.owner))) for w in listed]

    def before() -> object:
        raws, owners = states[0]
        listed = [views.parse_workload(r) for r in raws]
        return listed, [views.parse_workload(r, owners.get(views.owner_ref(r))) for r in raws]

    calls = iter(range(1 << 30))

    def unversioned(read: object) -> object:
        return [[dataclasses.replace(w, resource_version="") for w in ws] for ws in read]  # type: ignore[attr-defined]

    assert unversioned(now()) == unversioned(before()), "the views differ"
    return {"before": _median_ms(before, 5), "now": _median_ms(now, 6)}


def main() -> None:
    """Print one row per fleet size and number of waiting Workloads."""
    counts = [int(a) for a in sys.argv[1:] if a.isdigit()] or [1000, 10000]
    if "--workloads" in sys.argv:
        print("Workloads | read twice (before) | kept, 1 % changed | ratio")
        for count in [int(a) for a in sys.argv[1:] if a.isdigit()] or [1000, 5000]:
            m = measure_workloads(count)
            print(f"{count:,} | {m['before']:.0f} ms | {m['now']:.1f} ms | "
                  f"{m['now'] / m['before']:.3f}×", flush=True)  # fmt: skip
        return
    if "--dra" in sys.argv:
        print(
            "DRA nodes | claims | the LIST's body | its decode | the DRA inputs before "
            "(decode included) | now, 1 % changed | ratio"
        )
        for count in counts:
            m = measure_dra(count)
            print(f"{count:,} | {count // 2:,} | {m['list_mb']:.1f} MB | {m['decode']:.0f} ms | "
                  f"{m['before']:.0f} ms | {m['now']:.1f} ms | {m['now'] / m['before']:.3f}×",
                  flush=True)  # fmt: skip
        return
    print("nodes | pods | waiting | parse all | parse, 1 % changed | ratio | plan | "
          "plan that walked all (before) | ratio | pass now | pass before | ratio | "
          "views kept")  # fmt: skip
    for count in counts:
        for waiting in WAITING:
            m = measure(count, waiting)
            now = m["parse_kept"] + m["plan"]
            then = m["parse_all"] + m["plan_before"]
            print(f"{count:,} | {count + count // 2:,} | {waiting} | {m['parse_all']:.0f} ms | "
                  f"{m['parse_kept']:.1f} ms | {m['parse_kept'] / m['parse_all']:.3f}× | "
                  f"{m['plan']:.1f} ms | {m['plan_before']:.0f} ms | "
                  f"{m['plan'] / m['plan_before']:.3f}× | {now:.0f} ms | {then:.0f} ms | "
                  f"{now / then:.3f}× | {m['kept_mb']:.1f} MB", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
