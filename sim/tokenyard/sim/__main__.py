"""`python -m tokenyard.sim serve ...` (one engine) and `python -m tokenyard.sim pods ...` (the cluster's pods)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from tokenyard.sim.model import GPUS, MODELS, PresetError
from tokenyard.sim.server import DRAIN_TIMEOUT_S, EngineOptions, FaultKnobs, SimEngine

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (and exit status 2) instead of usage + line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m tokenyard.sim", description="A GPU-free engine that behaves like a vLLM pod."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = sub.add_parser("serve", help="serve one simulated engine")
    serve.add_argument("--model", default="llama-3.1-8b", help=f"model preset ({', '.join(MODELS)})")
    serve.add_argument("--gpu", default="h100-sxm", help=f"GPU preset ({', '.join(GPUS)})")
    serve.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="served seconds per modelled second (0.05 runs 20x faster than real time)",
    )
    serve.add_argument("--served-model-name", default=None, help="default: the preset's Hugging Face id")
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--num-gpu-blocks-override", type=int, default=None)
    serve.add_argument("--max-num-seqs", type=int, default=None)
    serve.add_argument("--max-num-batched-tokens", type=int, default=None)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument(
        "--error-rate", type=float, default=0.0, help="fraction of requests answered with a 500"
    )
    serve.add_argument("--latency-multiplier", type=_positive_float, default=1.0)
    serve.add_argument("--startup-seconds", type=float, default=0.0, help="modelled model-load time")
    serve.add_argument("--crash-after-requests", type=int, default=None)
    serve.add_argument("--log-level", default="INFO")

    pods = sub.add_parser("pods", help="serve the engine pods of a Kubernetes cluster on their pod IPs")
    pods.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
    pods.add_argument("--time-scale", type=_positive_float, default=1.0, help="unless a pod sets its own")
    pods.add_argument("--default-gpu", default="h100-sxm", help="when a pod's node has no GPU product label")
    pods.add_argument("--log-level", default="INFO")
    return parser


def _options_from_args(args: argparse.Namespace) -> EngineOptions:
    knobs = FaultKnobs(
        error_rate=args.error_rate,
        latency_multiplier=args.latency_multiplier,
        startup_seconds=args.startup_seconds,
        crash_after_requests=args.crash_after_requests,
    )
    return EngineOptions(
        model=args.model,
        gpu=args.gpu,
        tp=args.tp,
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        time_scale=args.time_scale,
        max_model_len=args.max_model_len,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        knobs=knobs,
    )


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _serve(options: EngineOptions) -> None:
    engine = SimEngine(options)
    await engine.start()
    try:
        await _until_signalled()
    finally:
        await engine.stop(DRAIN_TIMEOUT_S)


async def _pods(args: argparse.Namespace) -> None:
    from tokenyard.sim.pods import PodRunner

    runner = PodRunner(kubeconfig=args.kubeconfig, time_scale=args.time_scale, default_gpu=args.default_gpu)
    await runner.start()
    try:
        await _until_signalled()
    finally:
        await runner.stop()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "serve":
        options = _options_from_args(args)
        try:
            options.validate()
        except (PresetError, ValueError) as e:
            parser.exit(EXIT_USAGE, f"{parser.prog} serve: error: {e}\n")
        try:
            asyncio.run(_serve(options))
        except OSError as e:  # the address is taken or cannot be bound
            print(
                f"{parser.prog} serve: error: cannot listen on {options.host}:{options.port}: {e}",
                file=sys.stderr,
            )
            return 1
        return 0
    asyncio.run(_pods(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
