"""`taugrid dev build | up | down | status | inject`: the local, real control plane.

(`taugrid dev renew-tokens` is what `up` runs to keep its host processes' tokens fresh.)"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import pathlib
import sys
from collections.abc import Iterator, Sequence

from devcluster import build, cluster, drapublisher, images, imagespec, netns, node, stack, tokens


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taugrid", description=__doc__)
    top = parser.add_subparsers(dest="group", required=True)
    dev = top.add_parser("dev", help="the local dev cluster")
    sub = dev.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build the control plane from Go modules (cached)")
    b.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    b.add_argument("--only", default="", help="comma-separated components to build")

    up = sub.add_parser("up", help="start the control plane with fake GPU nodes and queues")
    up.add_argument("--nodes", type=int, default=4, help="number of fake GPU nodes (default 4)")
    up.add_argument(
        "--dra-nodes", type=int, default=0,
        help="fake GPU nodes whose GPUs are DRA devices (gpu-dra-node-N; default 0)",
    )  # fmt: skip
    up.add_argument(
        "--real-node",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run one real node (kubelet, containerd, real pods); default on. Where the "
        "machine cannot run it, `up` says why and the KWOK-only cluster comes up",
    )
    up.add_argument(
        "--bare",
        action="store_true",
        help="a bare control plane for the one install (tests/oneinstall): no Kueue, no "
        "KubeRay (no processes, CRDs, webhooks or queues) and no TauGrid; the real node gets "
        "Kueue's and KubeRay's operator images, for `helm install` with kueue.enabled and "
        "kuberay.enabled",
    )
    up.add_argument(
        "--no-taugrid",
        action="store_true",
        help="only the control plane: no TauGrid controller and agents",
    )

    inj = sub.add_parser("inject", help="inject a GPU fault into a dev node's fake NVML library")
    inj.add_argument("node", help="fake node name, e.g. gpu-node-0")
    inj.add_argument("--gpu", type=int, required=True, help="GPU index on that node")
    what = inj.add_mutually_exclusive_group(required=True)
    what.add_argument("--xid", type=int, metavar="CODE", help="raise an Xid event")
    what.add_argument("--lost", action="store_true", help="the GPU falls off the bus")
    what.add_argument("--reset", action="store_true", help="reset the GPU")
    what.add_argument("--ecc-uncorrected", type=int, metavar="K", help="add K uncorrected errors")
    what.add_argument("--thermal", action="store_true", help="hardware thermal slowdown on")
    what.add_argument("--nvlink-down", type=int, metavar="LINK", help="take an NVLink down")
    what.add_argument("--clear", action="store_true", help="back to the scenario's defaults")

    renew = sub.add_parser(
        "renew-tokens", help="keep the host processes' pod-bound tokens fresh (run by `up`)"
    )
    renew.add_argument("nodes", nargs="+", help="the fake GPU nodes whose agents run")
    renew.add_argument(
        "--controller-addr", type=pathlib.Path, default=None,
        help="keep this file at the controller pod's ip:port (real node)",
    )  # fmt: skip

    img = sub.add_parser("images", help="build (or reuse) the images without Docker")
    img.add_argument("names", nargs="*", help="images of the spec (default: all)")
    sub.add_parser("dockerfiles", help="write deploy/docker/*.Dockerfile from the image spec")

    dra = sub.add_parser(
        "dra-publisher", help="publish a ResourceSlice per fake DRA node (run by `up`)"
    )
    dra.add_argument("--port", type=int, required=True, help="loopback port of /healthz")

    sub.add_parser("down", help="stop every process `up` started")
    st = sub.add_parser("status", help="report each component's health")
    st.add_argument("--json", action="store_true", help="print JSON")
    return parser


@contextlib.contextmanager
def _exclusive(c: cluster.Cluster, command: str) -> Iterator[None]:
    """One `up` or `down` at a time per state directory (two racing would both start
    processes and overwrite each other's PID records)."""
    c.state.mkdir(parents=True, exist_ok=True)
    with (c.state / ".lock").open("w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            msg = f"another `taugrid dev up` or `down` is running on {c.state}; wait for it"
            raise cluster.ClusterError(msg) from None
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `taugrid` command line; return its exit code."""
    args = _parser().parse_args(argv)
    c = cluster.Cluster()
    try:
        if args.command in {"up", "down"}:
            with _exclusive(c, args.command):
                return _run(c, args)
        return _run(c, args)
    except cluster.AlreadyRunningError as err:
        print(str(err))
        return 0
    except (build.BuildError, cluster.ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _run(c: cluster.Cluster, args: argparse.Namespace) -> int:
    if args.command == "build":
        flags = ["--force"] if args.force else []
        if args.only:
            flags.append(f"--only={args.only}")
        return build.main(flags)
    if args.command == "up":
        if args.nodes < 1:
            print("error: --nodes must be at least 1", file=sys.stderr)
            return 2
        if args.dra_nodes < 0:
            print("error: --dra-nodes must not be negative", file=sys.stderr)
            return 2
        build.check_prerequisites()
        bin_dir = build.built_dir() / "bin"
        in_chart = _operators_in_chart(args, bin_dir)
        c.up(nodes=args.nodes, dra_nodes=args.dra_nodes, bare=args.bare,
             operators_in_chart=in_chart)  # fmt: skip
        operators = args.bare or in_chart
        real = _start_real_node(c, bin_dir, operators=operators) if args.real_node else None
        if in_chart and real is None:
            print("Kueue and KubeRay: host processes after all (their pods need the real node)")
            c.start_operators(bin_dir, args.nodes + args.dra_nodes)
        if not (args.no_taugrid or args.bare):
            stack.stop_agents_state(c)
            fleet = [f"gpu-node-{i}" for i in range(args.nodes)]
            fleet += [f"{cluster.DRA_NODE_PREFIX}{i}" for i in range(args.dra_nodes)]
            stack.start(c, bin_dir, fleet, real, operators=in_chart)
            print(cluster.summary(c))
            print(_welcome(c, bin_dir))
        else:
            print(cluster.summary(c))
        return 0
    if args.command == "images":
        return images.main(args.names)
    if args.command == "dockerfiles":
        changed = imagespec.write_dockerfiles()
        print("\n".join(changed) if changed else "the Dockerfiles are up to date")
        return 0
    if args.command == "renew-tokens":
        tokens.renew_forever(c, build.built_dir() / "bin", stack.NAMESPACE, stack.RELEASE,
                             args.nodes, controller_addr_file=args.controller_addr)  # fmt: skip
        return 0
    if args.command == "dra-publisher":
        asyncio.run(drapublisher.serve(c.kubeconfig, args.port))
        return 0
    if args.command == "inject":
        line = stack.inject(c, args.node, args.gpu, *_inject_command(args))
        print(f"injected on {args.node}: {line}")
        return 0
    if args.command == "down":
        stopped = node.RealNode(c).stop() if node.recorded(c) else []
        stopped += c.down()
        print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
        return 0
    if args.command == "status":
        if args.json:
            print(cluster.json_status(c))
        else:
            rows = c.status()
            if node.recorded(c):
                rows += node.RealNode(c).status()
            if c.operators_in_chart and c.is_up():
                rows += stack.operator_status(c, build.built_dir() / "bin")
            for name, state, detail in rows:
                print(f"{name:<24} {state:<10} {detail}")
        return 0 if c.is_up() else 1
    return 2


def _operators_in_chart(args: argparse.Namespace, bin_dir: pathlib.Path) -> bool:
    """Whether `up` installs Kueue and KubeRay through the chart (kueue.enabled,
    kuberay.enabled), as pods of the real node: with TauGrid and the real node, on the Kueue
    the chart ships (`TAUGRID_KUEUE_VERSION` set to another builds that version's binary,
    which runs as a host process). Otherwise they are host processes."""
    return (
        args.real_node
        and not (args.no_taugrid or args.bare)
        and build.kueue_version() == build.KUEUE_VERSION
        and not node.preflight(bin_dir)
    )


def _start_real_node(
    c: cluster.Cluster, bin_dir: pathlib.Path, *, operators: bool = False
) -> stack.RealNode | None:
    """Start the real node, or say exactly why not and go on with the KWOK nodes alone."""
    real = node.RealNode(c, bin_dir)
    problems = node.preflight(bin_dir)
    if problems:
        print("real node: not started, the KWOK-only cluster comes up. Why:")
        print("\n".join(f"  - {p}" for p in problems))
        return None
    try:
        refs = real.start(operators=operators)
    except (cluster.ClusterError, images.ImageError, netns.NetnsError, OSError) as err:
        print(f"real node: failed, stopping it; the KWOK-only cluster stays up. Why:\n{err}")
        real.stop()
        return None
    return real.stack_view(refs)


def _inject_command(args: argparse.Namespace) -> list[str]:
    if args.xid is not None:
        return ["xid", str(args.xid)]
    if args.lost:
        return ["lost"]
    if args.reset:
        return ["reset"]
    if args.ecc_uncorrected is not None:
        return ["ecc_uncorrected", str(args.ecc_uncorrected)]
    if args.thermal:
        return ["thermal", "on"]
    if args.nvlink_down is not None:
        return ["nvlink_down", str(args.nvlink_down)]
    return ["clear"]


def _welcome(c: cluster.Cluster, bin_dir: pathlib.Path) -> str:
    token_file = c.state / RESEARCHER_TOKEN_FILE
    token_file.touch(mode=0o600)
    token_file.chmod(0o600)  # a file left by an older `up` keeps its mode otherwise
    token_file.write_text(stack.researcher_token(c, bin_dir) + "\n")
    run_image = ""
    images_file = node.Paths.of(c.state).images
    if node.recorded(c) and images_file.exists():
        built = json.loads(images_file.read_text()).get("run", "")
        run_image = f"{node.RUN_IMAGE_ALIAS} (= {built})"
    return welcome_text(stack.controller_url(), token_file, run_image, bin_dir / "kubectl")


RESEARCHER_TOKEN_FILE = "researcher.token"  # noqa: S105  (a file name, not a secret)
"""Where `up` keeps a 24 h token of ServiceAccount default/researcher, for `tau login`."""


def welcome_text(url: str, token_file: pathlib.Path, run_image: str, kubectl: pathlib.Path) -> str:
    """What `up` prints last: the `tau` lines of the README's quickstart. A run on a KWOK
    node executes no code, so the first run named is the real node's, in its run image."""
    oncall = f"{kubectl} -n taugrid-system create token oncall --duration=8h"
    lines = [
        "",
        f"TauGrid controller: {url}   (web page: {url}/)",
        f"researcher token (ServiceAccount default/researcher, 24 h): {token_file}",
        f"  .venv/bin/tau login --url {url} --token - < {token_file}",
    ]
    if run_image:
        lines += [
            f"first run, on the real node, in the run image {run_image}:",
            "  .venv/bin/tau run examples/real-node.yaml --generate-name",
            (
                "  .venv/bin/tau status NAME --wait && .venv/bin/tau logs NAME"
                " && .venv/bin/tau results NAME"
            ),
        ]
    else:
        lines += ["no real node: every run lands on a KWOK node"]
    lines += [
        "a run on a KWOK (simulated) node executes no code: its pod succeeds after 2 s:",
        "  .venv/bin/tau run examples/job.yaml --generate-name",
        f"on-call:   {oncall} \\",
        f"             | .venv/bin/tau login --url {url} --token -   (then: tau nodes, tau fleet)",
        "inject a fault:  .venv/bin/taugrid dev inject gpu-node-0 --gpu 3 --xid 79",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
