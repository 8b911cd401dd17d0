"""The chart's pre-delete hook when Kueue comes with the release (kueue.enabled): delete the
Kueue objects TauGrid's chart made while Kueue still runs, and wait until they are gone.

Kueue puts a finalizer (`kueue.x-k8s.io/resource-in-use`) on ClusterQueues and ResourceFlavors
and only its running controller takes it off. `helm uninstall` deletes Kueue's Deployment, its
CRDs (the kueue chart renders them as templates) and those objects in one pass, so without
this hook the objects, and Kueue's CRDs with them, stay Terminating for good. Helm runs
pre-delete hooks before it deletes anything of the release, and fails the uninstall when one
fails: a run that leaves something behind after `--timeout-s` exits 1 naming it.

    python -m controller.kube.uninstall [--timeout-s S] localqueues/NAMESPACE/NAME \\
        clusterqueues/NAME resourceflavors/NAME admissionchecks/NAME \\
        workloadpriorityclasses/NAME

Each target names one object the release made (the chart renders the list from its values);
its ServiceAccount may get and delete exactly those kinds (templates/kueue-uninstall.yaml).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
KINDS = (
    "localqueues",
    "clusterqueues",
    "resourceflavors",
    "admissionchecks",
    "workloadpriorityclasses",
)
"""The kinds the hook may delete, in the order it deletes them: a LocalQueue before the
ClusterQueue it feeds, that before the ResourceFlavor and AdmissionCheck it names."""
NAMESPACED = frozenset({"localqueues"})
POLL_S = 1.0


class TargetError(ValueError):
    """A target argument names no Kueue object of the kinds the hook deletes."""


@dataclasses.dataclass(frozen=True, order=True)
class Target:
    """One Kueue object of the release."""

    kind: str
    name: str
    namespace: str = ""

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}/{where}{self.name}"


def parse_target(text: str) -> Target:
    """`localqueues/NAMESPACE/NAME` or `KIND/NAME` for the cluster-scoped kinds."""
    parts = text.split("/")
    kind = parts[0]
    if kind not in KINDS:
        msg = f"target {text!r}: the kind must be one of {', '.join(KINDS)}"
        raise TargetError(msg)
    want = 3 if kind in NAMESPACED else 2
    if len(parts) != want or not all(parts):
        shape = f"{kind}/NAMESPACE/NAME" if kind in NAMESPACED else f"{kind}/NAME"
        msg = f"target {text!r}: write it as {shape}"
        raise TargetError(msg)
    if kind in NAMESPACED:
        return Target(kind, parts[2], parts[1])
    return Target(kind, parts[1])


def ordered(targets: Sequence[Target]) -> list[Target]:
    """The targets without duplicates, in deletion order (`KINDS`)."""
    return sorted(set(targets), key=lambda t: (KINDS.index(t.kind), t.namespace, t.name))


Delete = Callable[[Target], Awaitable[None]]
"""Delete one object; an object that is gone already is no error."""
Exists = Callable[[Target], Awaitable[bool]]


async def remove(
    targets: Sequence[Target],
    delete: Delete,
    exists: Exists,
    *,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> list[Target]:
    """Delete every target, then wait until none exists or `timeout_s` has passed; return
    those still there (an empty list when all are gone)."""
    todo = ordered(targets)
    for target in todo:
        await delete(target)
    started = clock()
    while True:
        todo = [t for t in todo if await exists(t)]
        if not todo or clock() - started >= timeout_s:
            return todo
        await sleep(POLL_S)


def _api_calls(api: client.CustomObjectsApi) -> tuple[Delete, Exists]:
    async def delete(t: Target) -> None:
        try:
            if t.namespace:
                await api.delete_namespaced_custom_object(
                    GROUP, VERSION, t.namespace, t.kind, t.name
                )
            else:
                await api.delete_cluster_custom_object(GROUP, VERSION, t.kind, t.name)
        except ApiException as err:
            if err.status != 404:  # Not Found: gone already
                raise

    async def exists(t: Target) -> bool:
        try:
            if t.namespace:
                await api.get_namespaced_custom_object(GROUP, VERSION, t.namespace, t.kind, t.name)
            else:
                await api.get_cluster_custom_object(GROUP, VERSION, t.kind, t.name)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    return delete, exists


async def _main(targets: list[Target], timeout_s: float) -> list[Target]:
    cfg = client.Configuration()
    config.load_incluster_config(client_configuration=cfg)
    async with client.ApiClient(configuration=cfg) as api:
        delete, exists = _api_calls(client.CustomObjectsApi(api))
        return await remove(targets, delete, exists, timeout_s=timeout_s)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the hook; 0 when every target is gone, 1 when some remain, 2 on bad arguments."""
    parser = argparse.ArgumentParser(prog="python -m controller.kube.uninstall")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("targets", nargs="+", help="KIND/NAME or localqueues/NAMESPACE/NAME")
    args = parser.parse_args(argv)
    try:
        targets = [parse_target(t) for t in args.targets]
    except TargetError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    left = asyncio.run(_main(targets, args.timeout_s))
    if left:
        names = ", ".join(str(t) for t in left)
        print(f"still there after {args.timeout_s:.0f}s: {names}", file=sys.stderr)
        return 1
    print(f"deleted {len(set(targets))} Kueue objects: {', '.join(map(str, ordered(targets)))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
