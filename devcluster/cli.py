"""`taugrid dev build | up | down | status`: the local, real control plane for development."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from devcluster import build, cluster


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

    sub.add_parser("down", help="stop every process `up` started")
    st = sub.add_parser("status", help="report each component's health")
    st.add_argument("--json", action="store_true", help="print JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `taugrid` command line; return its exit code."""
    args = _parser().parse_args(argv)
    c = cluster.Cluster()
    try:
        if args.command == "build":
            flags = ["--force"] if args.force else []
            if args.only:
                flags.append(f"--only={args.only}")
            return build.main(flags)
        if args.command == "up":
            if args.nodes < 1:
                print("error: --nodes must be at least 1", file=sys.stderr)
                return 2
            build.check_prerequisites()
            c.up(nodes=args.nodes)
            print(cluster.summary(c))
            return 0
        if args.command == "down":
            stopped = c.down()
            print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
            return 0
        if args.command == "status":
            if args.json:
                print(cluster.json_status(c))
            else:
                for name, state, detail in c.status():
                    print(f"{name:<24} {state:<10} {detail}")
            return 0 if c.is_up() else 1
    except cluster.AlreadyRunningError as err:
        print(str(err))
        return 0
    except (build.BuildError, cluster.ClusterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
