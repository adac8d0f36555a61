"""`python -m tokenyard.devcluster up | down | status | binaries | demo`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tokenyard.core.cli import OneLineParser
from tokenyard.devcluster.binaries import NAMES, BinaryError, cache_root, ensure_binaries
from tokenyard.devcluster.cluster import DEFAULT_API_PORT, ClusterError, DevCluster
from tokenyard.devcluster.topology import Topology


def default_state_dir() -> Path:
    return Path(os.environ.get("TOKENYARD_DEVCLUSTER_DIR", cache_root() / "devcluster"))


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m tokenyard.devcluster",
        description="A real local Kubernetes control plane (etcd, kube-apiserver, controller manager, scheduler) "
        "with fake GPU nodes from kwok.",
    )
    parser.add_argument(
        "--dir", type=Path, default=default_state_dir(), help="state folder (default: %(default)s)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane and print the kubeconfig path")
    up.add_argument(
        "--port",
        type=int,
        default=DEFAULT_API_PORT,
        help="API server port on 127.0.0.1 (default %(default)s)",
    )
    up.add_argument(
        "--topology",
        default=Topology().describe(),
        help="ZONESxRACKSxNVLINK_DOMAINSxNODESxGPUS (default %(default)s)",
    )
    sub.add_parser("down", help="stop every process the control plane started")
    sub.add_parser("status", help="print the state of the control plane as JSON")
    sub.add_parser("binaries", help="find or build the binaries and print where they are")
    demo = sub.add_parser(
        "demo",
        help="the whole stack (operator, engines, router, Prometheus, autoscaler) under a rising and falling load",
    )
    demo.add_argument("--once", action="store_true", help="stop after one load cycle instead of at Ctrl-C")
    demo.add_argument(
        "--period",
        type=float,
        default=240.0,
        help="seconds of one load cycle (low, peak, low again) (default %(default)s)",
    )
    args = parser.parse_args(argv)

    try:
        if args.command == "binaries":
            found = ensure_binaries(required=NAMES)
            for name, path in vars(found).items():
                print(f"{name}: {path}")
            return 0
        if args.command == "up":
            try:
                topology = Topology.parse(args.topology)
            except ValueError as e:
                parser.error(str(e))
            started = time.monotonic()
            cluster = DevCluster(args.dir, topology=topology, api_port=args.port)
            cluster.start()
            print(
                f"control plane up in {time.monotonic() - started:.1f}s: {cluster.server}, {topology.describe()} GPU nodes"
            )
            print(f"export KUBECONFIG={cluster.kubeconfig}")
            return 0
        if args.command == "demo":
            from tokenyard.devcluster.demo import run

            if args.period < 30:
                parser.error(
                    f"--period {args.period:g}: at least 30 seconds (the fleet needs time to follow)"
                )
            return run(args.dir, once=args.once, period_s=args.period)
        cluster = DevCluster(args.dir)
        if args.command == "down":
            if not cluster.load():
                print(f"no cluster state in {args.dir}; nothing to stop")
                return 0
            cluster.stop()
            print("control plane stopped")
            return 0
        if args.command == "status":
            status = cluster.status()
            print(json.dumps(status, indent=2))
            return 0 if status["running"] else 1
    except (ClusterError, BinaryError) as e:
        print(f"devcluster: {e}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
