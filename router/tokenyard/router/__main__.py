"""python -m tokenyard.router: the request router (static backends or Kubernetes discovery)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from tokenyard.core.cli import OneLineParser
from tokenyard.router.core import DEFAULT_FILTERS, DEFAULT_MISS_PENALTY, DEFAULT_WEIGHTS
from tokenyard.router.discovery import (
    ConfigError,
    StaticConfig,
    load_static_config,
    parse_backend,
    parse_batch_size,
    parse_shadow,
    parse_traffic,
)
from tokenyard.router.epp import DEFAULT_FALLBACKS
from tokenyard.router.framework import Filter, Scorer
from tokenyard.router.kube import DiscoveryUnavailable
from tokenyard.router.plugins.not_saturated import SaturationLimits
from tokenyard.router.plugins.prefix_cache import HotSpotGuard
from tokenyard.router.prefix import Tokenizer
from tokenyard.router.server import CLOSE_BUDGET_S, RouterServer, ServerOptions
from tokenyard.router.state import RouterSettings
from tokenyard.router.tokenizing import TokenizerUnavailable, load_tokenizer

log = logging.getLogger("tokenyard.router")

EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop factory for ``--event-loop`` (None: asyncio's default loop).

    Why uvloop: every streamed token passes through the router as a socket read and a socket write, and
    uvloop's transports do that in C; in a py-spy profile of bench-router's closed loop the event loop's
    socket handling was a large share of the router's CPU, CPU the engines on the same cores then lack. The
    router only uses the asyncio API, so the stdlib loop remains a complete fallback."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("--event-loop uvloop: the 'uvloop' package is not installed") from None
        return None
    return uvloop.new_event_loop


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m tokenyard.router",
        description="KV-cache-aware request router for OpenAI-compatible engines (vLLM, SGLang, tokenyard.sim).",
    )
    source = parser.add_argument_group("where the replicas come from (static backends or Kubernetes)")
    source.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="[NAME=]URL[#REVISION]",
        help="a static engine backend (repeatable)",
    )
    source.add_argument(
        "--backends-file", metavar="FILE", help="YAML with backends, traffic, shadow and routing.weights"
    )
    source.add_argument(
        "--engine-max-num-seqs",
        metavar="N",
        help="requests each static backend runs at once (its --max-num-seqs, SGLang's --max-running-requests): "
        "filter freeSlot and the load guard use it from the first request (default: learned once requests "
        "queue; in a cluster it is read from the ModelDeployment)",
    )
    source.add_argument(
        "--served-model",
        metavar="NAME",
        help="model name every static backend serves (default: read from their /v1/models)",
    )
    source.add_argument(
        "--traffic",
        action="append",
        default=[],
        metavar="REVISION=WEIGHT",
        help="static canary split by revision, weights 0..100 (repeatable)",
    )
    source.add_argument(
        "--shadow", metavar="REVISION=FRACTION", help="copy this fraction of requests to REVISION"
    )
    source.add_argument("--kubeconfig", metavar="FILE", help="discover replicas from this cluster")
    source.add_argument(
        "--in-cluster", action="store_true", help="discover replicas with the pod's service account"
    )
    source.add_argument("--namespace", help="namespace of the ModelDeployments (default: the context's)")

    serve = parser.add_argument_group("serving")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    serve.add_argument(
        "--port", type=int, default=8080, help="OpenAI-compatible HTTP port (default %(default)s)"
    )
    serve.add_argument(
        "--grpc-port", type=int, default=9090, help="gRPC port; -1 disables (default %(default)s)"
    )
    serve.add_argument(
        "--epp-port",
        type=int,
        default=-1,
        help="serve the Gateway API Inference Extension's endpoint picker (Envoy ext_proc, gRPC) on this port; "
        "-1 disables (default %(default)s)",
    )
    serve.add_argument(
        "--epp-fallbacks",
        type=int,
        default=DEFAULT_FALLBACKS,
        help="endpoints the picker names after the primary, for the gateway to retry on (default %(default)s)",
    )
    serve.add_argument("--metrics-port", type=int, default=9091, help="Prometheus port (default %(default)s)")
    serve.add_argument("--redis-url", help="share load and prefix state with peer routers through this Redis")
    serve.add_argument("--router-id", help="this router's id in Redis (default: random)")
    serve.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    serve.add_argument("--drain-timeout", type=float, default=25.0, help="seconds to drain on SIGTERM")
    serve.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    serve.add_argument(
        "--event-loop",
        default="auto",
        choices=EVENT_LOOPS,
        help="auto: uvloop when installed, else asyncio's own (default %(default)s)",
    )

    route = parser.add_argument_group("routing")
    route.add_argument(
        "--weights",
        metavar="NAME=W,...",
        help="scorer weights (default: "
        + ",".join(f"{k}={v:g}" for k, v in DEFAULT_WEIGHTS.items())
        + "); a ModelDeployment's spec.routing.weights wins",
    )
    route.add_argument(
        "--filters",
        metavar="NAME,...",
        help="filters, in order (default: " + ",".join(DEFAULT_FILTERS) + ")",
    )
    route.add_argument(
        "--tokenizer",
        metavar="sim|FILE",
        help="hash prompts by tokens: 'sim' (tokenyard.sim's tokenizer) or a tokenizer.json "
        "(needs the 'tokenizers' package); default: character blocks",
    )
    route.add_argument("--chars-per-token", type=int, default=4)
    route.add_argument(
        "--default-max-tokens", type=int, default=256, help="expected output tokens when a request names none"
    )
    route.add_argument(
        "--miss-penalty",
        type=float,
        default=DEFAULT_MISS_PENALTY,
        help="extra cost of each uncached prompt token, as a share of its prefill (default %(default)s)",
    )
    route.add_argument(
        "--prefill-interference",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="count each uncached prompt token once more per request in flight on the replica, whose steps "
        "its prefill holds back (default: off)",
    )
    route.add_argument(
        "--batch-stretch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="price each uncached prompt token higher by the share of the replica's batch size (configured or "
        "learned) already in flight (default: on)",
    )
    route.add_argument(
        "--prefill-overlap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="learn whether the engines prefill the prompts they hold side by side (a short prompt sent behind a "
        "long one gets its first token well before it) and, once they are seen to, count no prefill owed as a "
        "replica's load (default: on)",
    )
    route.add_argument(
        "--output-by-age",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="charge a request's remaining decode by its age: the mean length of the model's finished answers that "
        "ran longer, less what it has streamed (answers that outlast the short ones are mostly long ones); "
        "--no-output-by-age counts the mean length down (default: on)",
    )
    route.add_argument(
        "--decode-horizon",
        type=int,
        default=None,
        metavar="TOKENS",
        help="an experiment: count at most TOKENS of each request's remaining answer as its replica's load (a new "
        "prompt's first token waits for a few steps, not for the rest of long answers); default: all of it",
    )
    route.add_argument(
        "--guarded-load",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the load guard judges replicas with no configured batch size too: one with far more requests in "
        "flight than the fewest (the hot-spot guard's request bound) and at or past its learned cap, or the "
        "most requests any replica was seen running, gets no cached-prefix discount in outstandingTokens; for "
        "engines with a small batch that the router is not told of (default: off; with a configured batch "
        "size, see --engine-max-num-seqs, the guard acts by default)",
    )
    route.add_argument(
        "--prefill-progress",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="count a replica's oldest open prompt as partly prefilled, by the time since it was sent and the "
        "prefill rate the router measured there (default: off)",
    )
    route.add_argument(
        "--prefix-feedback",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="correct the prefix index from the cached prompt tokens engines report per request "
        "(usage.prompt_tokens_details.cached_tokens) (default: off)",
    )
    route.add_argument(
        "--stream-usage",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask the engine for a stream's usage (stream_options.include_usage) when the client did not, and "
        "drop that event from the client's stream: the router learns bytes per token and output lengths from "
        "it (default: on; off for an engine that refuses the member)",
    )
    route.add_argument("--hotspot-ratio", type=float, default=1.5)
    route.add_argument("--hotspot-slack-tokens", type=int, default=2048)
    route.add_argument("--hotspot-slack-requests", type=int, default=4)
    route.add_argument(
        "--max-outstanding-requests",
        type=int,
        default=256,
        help="per replica; beyond it the replica is saturated (429 when all are)",
    )
    route.add_argument("--max-queue-waiting", type=float, default=128)
    route.add_argument(
        "--metrics-max-age", type=float, default=5.0, help="engine stats older than this are unknown"
    )
    route.add_argument(
        "--probe-interval",
        type=float,
        default=2.0,
        help="seconds over which every replica is probed once: /health for liveness, /metrics for its load "
        "signals (default %(default)s); keep it below --metrics-max-age",
    )
    return parser


def parse_weights(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    weights = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            weight = float(value)
        except ValueError:
            weight = -1
        if not sep or name not in Scorer.registry or weight < 0:
            known = ", ".join(sorted(Scorer.registry))
            raise ConfigError(f"--weights {item!r}: expected NAME=WEIGHT >= 0 with NAME one of {known}")
        weights[name] = weight
    return weights


def parse_filters(text: str | None) -> tuple[str, ...]:
    if text is None:
        return DEFAULT_FILTERS
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:  # no filter at all would route to unhealthy and ejected replicas: surely not meant
        raise ConfigError("--filters: no filter named; the default is " + ",".join(DEFAULT_FILTERS))
    unknown = [name for name in names if name not in Filter.registry]
    if unknown:
        known = ", ".join(sorted(Filter.registry))
        raise ConfigError(f"--filters: unknown filter(s) {', '.join(unknown)}; known: {known}")
    return names


def tokenizer_from_flag(spec: str | None) -> Tokenizer | None:
    if not spec:
        return None
    try:
        return load_tokenizer(spec)
    except TokenizerUnavailable as error:
        raise ConfigError(f"--tokenizer: {error}") from None


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    sources = sum(bool(x) for x in (args.backend or args.backends_file, args.kubeconfig, args.in_cluster))
    if sources != 1:
        raise ConfigError(
            "give exactly one replica source: --backend/--backends-file, --kubeconfig or --in-cluster"
        )
    static = None
    if args.backend or args.backends_file:
        static = load_static_config(args.backends_file) if args.backends_file else StaticConfig()
        static.backends += [parse_backend(b) for b in args.backend]
        names = [b.name for b in static.backends]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"--backend: duplicate backend names {duplicates}; name them NAME=URL")
        if args.traffic:
            static.traffic = parse_traffic(args.traffic)
        if args.shadow:
            static.shadow = parse_shadow(args.shadow)
        weights = parse_weights(args.weights)
        if weights is not None:
            static.weights = weights
        if args.engine_max_num_seqs is not None:
            static.batch_size = parse_batch_size(args.engine_max_num_seqs, "--engine-max-num-seqs")
    elif args.engine_max_num_seqs is not None:
        raise ConfigError(
            "--engine-max-num-seqs applies to --backend/--backends-file; in a cluster the router reads each "
            "ModelDeployment's --max-num-seqs (or SGLang's --max-running-requests) from spec.engine.args"
        )
    for flag in ("port", "metrics_port"):
        if not 0 <= getattr(args, flag) <= 65535:
            raise ConfigError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: not a port number")
    if not -1 <= args.epp_port <= 65535:
        raise ConfigError(f"--epp-port {args.epp_port}: not a port number (-1 disables the endpoint picker)")
    if args.epp_fallbacks < 0:
        raise ConfigError(f"--epp-fallbacks {args.epp_fallbacks}: must be >= 0")
    if args.decode_horizon is not None and args.decode_horizon < 0:
        raise ConfigError(f"--decode-horizon {args.decode_horizon}: must be >= 0 tokens")
    settings = RouterSettings(
        default_max_tokens=args.default_max_tokens,
        chars_per_token=args.chars_per_token,
        metrics_max_age_s=args.metrics_max_age,
        guard=HotSpotGuard(args.hotspot_ratio, args.hotspot_slack_tokens, args.hotspot_slack_requests),
        saturation=SaturationLimits(args.max_outstanding_requests, args.max_queue_waiting),
        weights=parse_weights(args.weights),
        filters=parse_filters(args.filters),
        miss_penalty=args.miss_penalty,
        prefix_feedback=args.prefix_feedback,
        prefill_interference=args.prefill_interference,
        guarded_load=args.guarded_load,
        batch_stretch=args.batch_stretch,
        prefill_overlap=args.prefill_overlap,
        output_by_age=args.output_by_age,
        decode_horizon=args.decode_horizon,
        prefill_progress=args.prefill_progress,
        stream_usage=args.stream_usage,
    )
    return ServerOptions(
        host=args.host,
        port=args.port,
        grpc_port=None if args.grpc_port < 0 else args.grpc_port,
        epp_port=None if args.epp_port < 0 else args.epp_port,
        epp_fallbacks=args.epp_fallbacks,
        metrics_port=args.metrics_port,
        static=static,
        served_model=args.served_model,
        kubeconfig=args.kubeconfig,
        in_cluster=args.in_cluster,
        namespace=args.namespace,
        redis_url=args.redis_url,
        probe_interval_s=args.probe_interval,
        max_body_bytes=args.max_body_bytes,
        drain_timeout_s=args.drain_timeout,
        settings=settings,
        tokenizer=tokenizer_from_flag(args.tokenizer),
        router_id=args.router_id,
    )


# Past the drain and the close budget, the event loop's own shutdown (cancelling what is left, joining the default
# executor's threads) could still wait on a task or thread stuck on a dependency that never answers; the process
# then exits anyway, this long after the signal, rather than waiting for Kubernetes' SIGKILL.
HARD_STOP_MARGIN_S = 2.0


def _exit_by(seconds: float) -> None:
    def hard_stop() -> None:
        log.warning("still stopping %.0fs after the signal: exiting now", seconds)
        logging.shutdown()
        os._exit(0)  # asked to stop, and stopped: the drain is over, only closing hung

    timer = threading.Timer(seconds, hard_stop)
    timer.daemon = True  # a process that stops in time exits without waiting for it
    timer.start()


async def serve(options: ServerOptions) -> None:
    server = RouterServer(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await server.start()
        await stop.wait()
        log.info("signal received: draining")
        _exit_by(options.drain_timeout_s + CLOSE_BUDGET_S + HARD_STOP_MARGIN_S)
        await server.drain_and_stop()
    except BaseException:
        await server.stop()
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = options_from_args(args)
        factory = loop_factory(args.event_loop)
    except ConfigError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(options))
    except (OSError, DiscoveryUnavailable) as error:  # e.g. the port is taken, the cluster is unreachable
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
