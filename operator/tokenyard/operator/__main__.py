"""`python -m tokenyard.operator`: the operator against the current kubeconfig (or in-cluster config)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import kopf
from prometheus_client import REGISTRY, start_http_server
from tokenyard.core.cli import OneLineParser
from tokenyard.operator.settings import OperatorSettings, SettingError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = OneLineParser(
        prog="python -m tokenyard.operator",
        description="Reconciles ModelDeployments into topology-placed replica groups of engine pods.",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG, else in-cluster)")
    parser.add_argument(
        "--namespace", action="append", default=[], help="watch only these namespaces (repeatable)"
    )
    parser.add_argument("--metrics-port", type=int, default=9090, help="Prometheus metrics port; 0 disables")
    parser.add_argument("--metrics-host", default="127.0.0.1", help="metrics bind address (0.0.0.0 in a pod)")
    parser.add_argument(
        "--prometheus-url",
        default=os.environ.get("TOKENYARD_PROMETHEUS_URL"),
        help="Prometheus for rollout analysis (default: $TOKENYARD_PROMETHEUS_URL); without it analysis is inconclusive",
    )
    parser.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering", default=None, help="Kopf peering name: run several replicas, one active at a time"
    )
    peering.add_argument(
        "--standalone", action="store_true", default=True, help="one replica, no peering (default)"
    )
    parser.add_argument("--priority", type=int, default=0, help="peering priority; distinct per replica")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.kubeconfig and not os.path.exists(args.kubeconfig):
        parser.error(f"--kubeconfig {args.kubeconfig}: no such file")
    if args.metrics_port < 0 or args.metrics_port > 65535:
        parser.error(f"--metrics-port {args.metrics_port}: not a port number")
    try:  # the start-up handler reads them again; a bad one is said here in one line, before Kopf starts
        OperatorSettings.from_environment(os.environ)
    except SettingError as e:
        parser.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    if args.prometheus_url:
        # Read with the other settings by the start-up handler (handlers.configure), not at import.
        os.environ["TOKENYARD_PROMETHEUS_URL"] = args.prometheus_url
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_host, registry=REGISTRY)
    from tokenyard.operator import handlers  # (registers the Kopf handlers)
    from tokenyard.operator.metrics import OperatorMetrics

    # The operator's metrics on the registry the metrics server exposes (with the process collectors).
    handlers.RUNTIME.metrics = OperatorMetrics(REGISTRY)
    handlers.RUNTIME.namespaced = bool(args.namespace)

    standalone = args.peering is None
    kopf.configure(verbose=args.verbose)

    async def run() -> None:
        # SIGTERM and SIGINT raise this flag (handlers.RUNTIME.begin_stop, which also bounds the way out);
        # Kopf then stops its handlers and daemons gracefully.
        handlers.RUNTIME.stop_flag = asyncio.Event()
        await kopf.operator(
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            standalone=standalone,
            peering_name=args.peering,
            priority=args.priority,
            liveness_endpoint=args.liveness,
            stop_flag=handlers.RUNTIME.stop_flag,
        )

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
