"""`python -m tokenyard.autoscaler --prometheus-url URL [--kubeconfig K] [--interval S] [--metrics-port P]`"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from urllib.parse import urlparse

from tokenyard.autoscaler.controller import DRAIN_SECONDS, run_autoscaler
from tokenyard.autoscaler.prometheus import DEFAULT_SELECTOR


def _url(text: str) -> str:
    parsed = urlparse(text)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r}")
    return text


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}")
    return int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tokenyard.autoscaler",
        description="Scale the replica groups of InferenceAutoscaler targets from signals read from Prometheus.",
    )
    parser.add_argument(
        "--prometheus-url", required=True, type=_url, help="base URL of the Prometheus HTTP API"
    )
    parser.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster, then ~/.kube/config)")
    parser.add_argument(
        "--interval",
        type=_positive,
        default=2.0,
        help="seconds between passes; each autoscaler decides on its own spec.intervalSeconds",
    )
    parser.add_argument(
        "--metrics-port", type=_port, default=None, help="serve /metrics and /healthz on this port"
    )
    parser.add_argument("--metrics-host", default="0.0.0.0", help="address for the metrics port")
    parser.add_argument(
        "--lease-namespace",
        default=None,
        help="namespace of the leader-election Lease (default: $POD_NAMESPACE or 'default')",
    )
    parser.add_argument(
        "--selector",
        default=DEFAULT_SELECTOR,
        help="PromQL label matchers selecting a target's engine series ($namespace, $target)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=_positive,
        default=DRAIN_SECONDS,
        help="on SIGTERM, seconds the pass in flight may take before it is abandoned",
    )
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await run_autoscaler(
        args.prometheus_url,
        stop,
        kubeconfig=args.kubeconfig,
        interval=args.interval,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        lease_namespace=args.lease_namespace,
        selector=args.selector,
        drain_seconds=args.drain_timeout,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_main(args))
    except Exception as exc:  # one clear line, non-zero exit
        print(f"tokenyard.autoscaler: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
