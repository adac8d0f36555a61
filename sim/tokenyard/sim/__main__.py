"""The simulator's command line.

    python -m tokenyard.sim serve ...                  one engine, the simulator's own options
    python -m tokenyard.sim pods ...                   the engine pods of a Kubernetes cluster, on their pod IPs
    python -m tokenyard.sim vllm serve MODEL [FLAGS]   one engine from vLLM's own command line
    python -m tokenyard.sim sglang --model-path M ...  one engine from SGLang's `launch_server` command line
    python -m tokenyard.sim python3 -m sglang.launch_server ...   (a container's argv as it is; also
    python -m tokenyard.sim python3 -m vllm.entrypoints.openai.api_server --model M ...)

The engine command lines take the engines' flags (see `tokenyard.sim.engine_args`; an unknown flag exits with
status 2 and one line naming it, as the real CLIs do) plus the simulator's own, anywhere on the line:
`--sim-model PRESET` (when the model's name tells no preset; else TOKENYARD_SIM_MODEL), `--sim-gpu GPU` (default
h100-sxm) and `--sim-time-scale S` (else TOKENYARD_SIM_TIME_SCALE, else 1). Fault knobs come from the same
TOKENYARD_SIM_* environment variables a pod's container carries. A `--headless` (or non-zero node rank) worker
serves nothing and waits for SIGTERM, as a real worker process stays up beside its leader.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
from collections.abc import Callable

from tokenyard.core import labels as L
from tokenyard.sim.engine_args import SGLANG_FLAGS, VLLM_FLAGS, EngineArgsError, engine_options_from_argv
from tokenyard.sim.model import GPUS, MODELS, PresetError
from tokenyard.sim.options import METRICS_FAULTS, PERSONALITIES, knobs_from_env
from tokenyard.sim.server import DRAIN_TIMEOUT_S, EngineOptions, FaultKnobs, SimEngine

EXIT_USAGE = 2
PROG = "python -m tokenyard.sim"
SIM_FLAGS = ("--sim-model", "--sim-gpu", "--sim-time-scale")
_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")


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
        prog=PROG,
        description="A GPU-free engine that behaves like a vLLM (or SGLang) pod.",
        epilog="Also: `vllm serve MODEL [vLLM flags]`, `sglang --model-path M [SGLang flags]`, or a container's "
        "`python3 -m sglang.launch_server ...` argv, each with --sim-model/--sim-gpu/--sim-time-scale.",
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
    serve.add_argument(
        "--personality",
        choices=PERSONALITIES,
        default="vllm",
        help="whose HTTP API, error bodies and metric names to serve (sglang: /metrics always on here)",
    )
    serve.add_argument(
        "--metrics-fault", choices=METRICS_FAULTS, default="none", help="break /metrics on purpose"
    )
    serve.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="report usage.prompt_tokens_details.cached_tokens when above 0, as vLLM does with this flag",
    )
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
        metrics_fault=args.metrics_fault,
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
        personality=args.personality,
        enable_metrics=True,
        report_cached_tokens=args.enable_prompt_tokens_details,
    )


async def _until_signalled(announce: Callable[[], None] | None = None) -> None:
    """Wait for SIGTERM or SIGINT. `announce` runs once the handlers are in place, so that whoever reads what it
    says can signal the process at once without killing it by the default action."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if announce is not None:
        announce()
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


def _is_engine_command(argv: list[str]) -> bool:
    return bool(argv) and (argv[0] in ("vllm", "sglang") or bool(_PYTHON.match(os.path.basename(argv[0]))))


def _split_sim_flags(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The simulator's own --sim-* options (anywhere on the line) and the engine's argv without them."""
    sim: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        name, has_inline, inline = argv[i].partition("=")
        if name in SIM_FLAGS:
            if has_inline:
                sim[name] = inline
            elif i + 1 < len(argv):
                sim[name] = argv[i + 1]
                i += 1
            else:
                raise ValueError(f"argument {name}: expected one argument")
        else:
            rest.append(argv[i])
        i += 1
    return sim, rest


def _engine_options(argv: list[str]) -> EngineOptions:
    sim, engine_argv = _split_sim_flags(argv)
    if engine_argv[0] == "sglang":
        engine_argv = ["python3", "-m", "sglang.launch_server", *engine_argv[1:]]
    elif engine_argv[0] == "vllm" and engine_argv[1:2] != ["serve"]:
        raise EngineArgsError("vllm", "only `vllm serve` is simulated")
    env = os.environ
    raw_scale = sim.get("--sim-time-scale") or env.get(L.ENV_SIM_TIME_SCALE) or "1"
    try:
        time_scale = float(raw_scale)
    except ValueError:
        raise ValueError(f"argument --sim-time-scale: time scale {raw_scale!r} is not a number") from None
    knobs = knobs_from_env(env, "environment")
    options = engine_options_from_argv(
        engine_argv,
        sim_model=sim.get("--sim-model") or env.get(L.ENV_SIM_MODEL_PRESET) or None,
        gpu=sim.get("--sim-gpu", "h100-sxm"),
        time_scale=time_scale,
        knobs=knobs,
    )
    options.validate()
    return options


def _engine_help(argv: list[str]) -> str:
    sglang = argv[0] == "sglang" or "sglang.launch_server" in argv[:3]
    flags = SGLANG_FLAGS if sglang else VLLM_FLAGS
    usage = "sglang --model-path MODEL" if sglang else "vllm serve [MODEL]"
    names = ", ".join(f.display for f in flags)
    return (
        f"usage: {PROG} {usage} [flags] [--sim-model PRESET] [--sim-gpu GPU] [--sim-time-scale S]\n"
        f"flags the simulated engine accepts (as the real one does): {names}\n"
    )


def _engine_main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(_engine_help(argv), end="")
        return 0
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = _engine_options(argv)
    except (EngineArgsError, PresetError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not options.serves_http:

        def announce() -> None:
            logging.getLogger("tokenyard.sim").info(
                "node rank %d of %d%s: a worker serves no API; waiting for SIGTERM",
                options.node_rank,
                options.nnodes,
                " (--headless)" if options.headless else "",
            )

        asyncio.run(_until_signalled(announce))
        return 0
    try:
        asyncio.run(_serve(options))
    except OSError as e:
        print(f"{PROG}: error: cannot listen on {options.host}:{options.port}: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _is_engine_command(argv):
        return _engine_main(argv)
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
