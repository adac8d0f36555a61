"""The real engines' command lines, parsed into the simulated engine they describe.

Pure: an argv in (the container's `command + args` as the operator renders it, or what a user types after
`python -m tokenyard.sim`), an `EngineOptions` out, or `EngineArgsError` (a ValueError) naming the flag. Like the
real CLIs, an unknown flag fails at start ("unrecognized arguments: --flag", argparse's wording); a flag the
simulator has no use for but the engine accepts is parsed (its value checked) and ignored.

Programs recognised (see `split_program`):

    vllm serve [MODEL] [vLLM flags]                                    (vLLM's CLI; the operator's vLLM pods)
    python3 -m vllm.entrypoints.openai.api_server --model M [flags]    (vLLM's deprecated entry point)
    python3 -m sglang.launch_server --model-path M [SGLang flags]      (the operator's SGLang pods)

Both `--flag value` and `--flag=value` are accepted; vLLM also accepts underscores in long flag names
(`--max_model_len`, its FlexibleArgumentParser normalises them) and `--no-FLAG` for its boolean flags.

What the simulator takes from a command line: the model (and from its name the performance preset, see
`tokenyard.sim.model.preset_for_model_name`), the served name(s), host and port, tensor and pipeline parallel
sizes, context length, concurrency and token budget, KV block (page) size, memory fraction, prefix caching on or
off, KV-cache dtype, an FP8 checkpoint, the seed, and the multi-node role (`--nnodes`, `--node-rank`,
`--headless`): only the leader serves HTTP.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tokenyard.sim.model import MODELS, PresetError, model_preset, names_fp8_checkpoint, preset_for_model_name
from tokenyard.sim.options import (
    PERSONALITY_SGLANG,
    PERSONALITY_VLLM,
    SGLANG_PAGE_SIZE,
    EngineOptions,
    FaultKnobs,
)

ENGINE_VLLM = PERSONALITY_VLLM
ENGINE_SGLANG = PERSONALITY_SGLANG

VLLM_DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # what `vllm serve` loads without a model (v0.13.0 ModelConfig.model)
VLLM_DEFAULT_HOST = "0.0.0.0"  # vLLM's --host default is None: every interface
VLLM_DEFAULT_PORT = 8000
SGLANG_DEFAULT_HOST = "127.0.0.1"
SGLANG_DEFAULT_PORT = 30000
WEIGHT_DTYPE_BYTES = {"float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "bf16": 2}


class EngineArgsError(ValueError):
    """A command line the engine would refuse at start; `flag` is the offending flag when there is one."""

    def __init__(self, program: str, message: str, flag: str | None = None) -> None:
        super().__init__(f"{program}: {message}")
        self.program = program
        self.message = message
        self.flag = flag


class UnknownFlagError(EngineArgsError):
    """A flag the engine does not have (the real CLI exits with status 2 and "unrecognized arguments")."""


# --- flag tables -------------------------------------------------------------------------------------------
# kinds: str, int, hint (vLLM's human-readable int: 8k, 1M, 25.6k), float, true (store_true), bool (store_true
# plus --no-FLAG, vLLM's BooleanOptionalAction), list (one or more values); "ignore" flags are checked and dropped.
@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    dest: str
    kind: str = "str"
    choices: tuple[str, ...] | None = None
    ignore: bool = False

    @property
    def display(self) -> str:
        return "/".join(self.names)


DTYPE_CHOICES = ("auto", "half", "float16", "bfloat16", "float", "float32")

# vLLM v0.13.0 (the image the operator deploys): `vllm serve` = vllm/entrypoints/cli/serve.py (MODEL positional,
# --headless) + FrontendArgs in vllm/entrypoints/openai/cli_args.py (--host, --port, --uvicorn-log-level,
# --api-key, ...) + EngineArgs/AsyncEngineArgs.add_cli_args in vllm/engine/arg_utils.py (one argument group per
# config dataclass: ModelConfig, LoadConfig, ParallelConfig, CacheConfig, SchedulerConfig; bool fields get
# argparse.BooleanOptionalAction, hence --no-FLAG; --max-model-len and --max-num-batched-tokens take
# human_readable_int). Flag names checked against: arg_utils.py's add_cli_args (ParallelConfig group:
# --distributed-executor-backend, --pipeline-parallel-size/-pp, --master-addr, --master-port, --nnodes/-n,
# --node-rank/-r, --tensor-parallel-size/-tp; CacheConfig group: --block-size, --gpu-memory-utilization,
# --kv-cache-dtype, --num-gpu-blocks-override, --enable-prefix-caching), the rendered `vllm serve --help` at
# docs.vllm.ai/en/v0.12.0/cli/serve/ (--headless, --host, --port, --uvicorn-log-level, --disable-log-requests
# deprecated), docs/configuration/engine_args.md (points at the same config classes), and
# docs/serving/parallelism_scaling.md "Running vLLM with MultiProcessing" (--nnodes 2 --node-rank 0
# --master-addr HEAD; --headless on the other nodes).
VLLM_FLAGS: tuple[Flag, ...] = (
    # ModelConfig
    Flag(("--model",), "model"),
    Flag(("--served-model-name",), "served_model_name", "list"),
    Flag(("--tokenizer",), "tokenizer"),
    Flag(("--tokenizer-revision",), "tokenizer_revision"),
    Flag(("--tokenizer-mode",), "tokenizer_mode", ignore=True),
    Flag(("--revision",), "revision"),
    Flag(("--code-revision",), "code_revision", ignore=True),
    Flag(("--trust-remote-code",), "trust_remote_code", "bool"),
    Flag(("--dtype",), "dtype", choices=DTYPE_CHOICES),
    Flag(("--seed",), "seed", "int"),
    Flag(("--max-model-len",), "max_model_len", "hint"),
    Flag(("--quantization", "-q"), "quantization"),
    Flag(("--enforce-eager",), "enforce_eager", "bool", ignore=True),
    Flag(("--max-logprobs",), "max_logprobs", "int", ignore=True),
    Flag(("--disable-sliding-window",), "disable_sliding_window", "bool", ignore=True),
    Flag(("--disable-cascade-attn",), "disable_cascade_attn", "bool", ignore=True),
    Flag(("--skip-tokenizer-init",), "skip_tokenizer_init", "bool", ignore=True),
    Flag(("--hf-config-path",), "hf_config_path", ignore=True),
    Flag(("--config-format",), "config_format", ignore=True),
    Flag(("--generation-config",), "generation_config", ignore=True),
    # LoadConfig
    Flag(("--load-format",), "load_format", ignore=True),
    Flag(("--download-dir",), "download_dir", ignore=True),
    # ParallelConfig
    Flag(
        ("--distributed-executor-backend",),
        "distributed_executor_backend",
        choices=("ray", "mp", "uni", "external_launcher"),
    ),
    Flag(("--pipeline-parallel-size", "-pp"), "pp", "int"),
    Flag(("--tensor-parallel-size", "-tp"), "tp", "int"),
    Flag(("--data-parallel-size", "-dp"), "dp", "int"),
    Flag(("--master-addr",), "master_addr"),
    Flag(("--master-port",), "master_port", "int"),
    Flag(("--nnodes", "-n"), "nnodes", "int"),
    Flag(("--node-rank", "-r"), "node_rank", "int"),
    Flag(("--disable-custom-all-reduce",), "disable_custom_all_reduce", "bool", ignore=True),
    Flag(("--max-parallel-loading-workers",), "max_parallel_loading_workers", "int", ignore=True),
    # CacheConfig
    Flag(("--block-size",), "block_size", "int"),
    Flag(("--gpu-memory-utilization",), "gpu_memory_utilization", "float"),
    Flag(("--swap-space",), "swap_space", "float", ignore=True),
    Flag(("--kv-cache-dtype",), "kv_cache_dtype"),
    Flag(("--num-gpu-blocks-override",), "num_gpu_blocks_override", "int"),
    Flag(("--enable-prefix-caching",), "enable_prefix_caching", "bool"),
    Flag(("--prefix-caching-hash-algo",), "prefix_caching_hash_algo", ignore=True),
    Flag(("--cpu-offload-gb",), "cpu_offload_gb", "float", ignore=True),
    Flag(("--calculate-kv-scales",), "calculate_kv_scales", "bool", ignore=True),
    # SchedulerConfig
    Flag(("--max-num-batched-tokens",), "max_num_batched_tokens", "hint"),
    Flag(("--max-num-seqs",), "max_num_seqs", "int"),
    Flag(("--enable-chunked-prefill",), "enable_chunked_prefill", "bool"),
    Flag(("--scheduling-policy",), "scheduling_policy", choices=("fcfs", "priority"), ignore=True),
    # (Async)EngineArgs and the serve subcommand
    Flag(("--disable-log-stats",), "disable_log_stats", "true", ignore=True),
    Flag(("--enable-log-requests",), "enable_log_requests", "bool", ignore=True),
    Flag(("--disable-log-requests",), "disable_log_requests", "bool", ignore=True),  # deprecated in v0.12+
    Flag(("--headless",), "headless", "true"),
    Flag(("--api-server-count", "-asc"), "api_server_count", "int", ignore=True),
    # FrontendArgs
    Flag(("--host",), "host"),
    Flag(("--port",), "port", "int"),
    Flag(
        ("--uvicorn-log-level",),
        "uvicorn_log_level",
        choices=("critical", "debug", "error", "info", "trace", "warning"),
    ),
    Flag(("--disable-uvicorn-access-log",), "disable_uvicorn_access_log", "bool", ignore=True),
    Flag(("--api-key",), "api_key", "list", ignore=True),  # the simulator does not check keys
    Flag(("--chat-template",), "chat_template", ignore=True),
    Flag(("--response-role",), "response_role", ignore=True),
    Flag(("--root-path",), "root_path", ignore=True),
    Flag(("--enable-auto-tool-choice",), "enable_auto_tool_choice", "bool", ignore=True),
    Flag(("--tool-call-parser",), "tool_call_parser", ignore=True),
    Flag(("--enable-prompt-tokens-details",), "enable_prompt_tokens_details", "bool"),
)

# SGLang v0.5.x (lmsysorg/sglang): `python3 -m sglang.launch_server` = ServerArgs.add_cli_args in
# python/sglang/srt/server_args.py (plain argparse: no underscore spellings, store_true booleans, no --no-FLAG).
# Flag names checked against docs/advanced_features/server_arguments.md (sgl-project/sglang, "Server Arguments";
# formerly docs/backend/server_arguments.md): sections Model and tokenizer (--model-path/--model,
# --tokenizer-path, --trust-remote-code, --context-length, --revision), HTTP server (--host 127.0.0.1, --port
# 30000), Quantization and data type (--dtype, --kv-cache-dtype), Memory and scheduling (--mem-fraction-static,
# --max-running-requests, --max-total-tokens, --chunked-prefill-size (-1 disables), --page-size 1), Runtime
# options (--tensor-parallel-size/--tp-size, --pipeline-parallel-size/--pp-size, --random-seed), Logging
# (--log-level, --enable-metrics), API related (--api-key, --served-model-name), Multi-node distributed serving
# (--dist-init-addr/--nccl-init-addr, --nnodes, --node-rank), Optimization/debug options (--disable-radix-cache).
# `--tp` is the spelling the page's own examples use (argparse's prefix match of --tp-size).
SGLANG_FLAGS: tuple[Flag, ...] = (
    # Model and tokenizer
    Flag(("--model-path", "--model"), "model"),
    Flag(("--tokenizer-path",), "tokenizer"),
    Flag(("--tokenizer-mode",), "tokenizer_mode", choices=("auto", "slow"), ignore=True),
    Flag(("--skip-tokenizer-init",), "skip_tokenizer_init", "true", ignore=True),
    Flag(("--load-format",), "load_format", ignore=True),
    Flag(("--trust-remote-code",), "trust_remote_code", "true"),
    Flag(("--context-length",), "max_model_len", "int"),
    Flag(("--revision",), "revision"),
    # HTTP server
    Flag(("--host",), "host"),
    Flag(("--port",), "port", "int"),
    Flag(("--skip-server-warmup",), "skip_server_warmup", "true", ignore=True),
    # Quantization and data type
    Flag(("--dtype",), "dtype", choices=DTYPE_CHOICES),
    Flag(("--quantization",), "quantization"),
    Flag(("--kv-cache-dtype",), "kv_cache_dtype"),
    # Memory and scheduling
    Flag(("--mem-fraction-static",), "gpu_memory_utilization", "float"),
    Flag(("--max-running-requests",), "max_num_seqs", "int"),
    Flag(("--max-queued-requests",), "max_queued_requests", "int", ignore=True),
    Flag(("--max-total-tokens",), "max_total_tokens", "int"),
    Flag(("--chunked-prefill-size",), "chunked_prefill_size", "int"),
    Flag(("--max-prefill-tokens",), "max_prefill_tokens", "int", ignore=True),
    Flag(("--schedule-policy",), "schedule_policy", ignore=True),
    Flag(("--schedule-conservativeness",), "schedule_conservativeness", "float", ignore=True),
    Flag(("--page-size",), "block_size", "int"),
    # Runtime options
    Flag(("--tensor-parallel-size", "--tp-size", "--tp"), "tp", "int"),
    Flag(("--pipeline-parallel-size", "--pp-size"), "pp", "int"),
    Flag(("--random-seed",), "seed", "int"),
    Flag(("--watchdog-timeout",), "watchdog_timeout", "float", ignore=True),
    Flag(("--download-dir",), "download_dir", ignore=True),
    Flag(("--base-gpu-id",), "base_gpu_id", "int", ignore=True),
    # Logging
    Flag(("--log-level",), "log_level"),
    Flag(("--log-level-http",), "log_level_http", ignore=True),
    Flag(("--log-requests",), "log_requests", "true", ignore=True),
    Flag(("--enable-metrics",), "enable_metrics", "true"),
    Flag(("--enable-metrics-for-all-schedulers",), "enable_metrics_for_all_schedulers", "true", ignore=True),
    # API related
    Flag(("--api-key",), "api_key", ignore=True),  # the simulator does not check keys
    Flag(("--served-model-name",), "served_model_name"),
    Flag(("--chat-template",), "chat_template", ignore=True),
    Flag(("--enable-cache-report",), "enable_cache_report", "true"),
    Flag(("--tool-call-parser",), "tool_call_parser", ignore=True),
    Flag(("--reasoning-parser",), "reasoning_parser", ignore=True),
    # Data parallelism
    Flag(("--data-parallel-size", "--dp-size", "--dp"), "dp", "int"),
    # Multi-node distributed serving
    Flag(("--dist-init-addr", "--nccl-init-addr"), "dist_init_addr"),
    Flag(("--nnodes",), "nnodes", "int"),
    Flag(("--node-rank",), "node_rank", "int"),
    # Optimization/debug options
    Flag(("--disable-radix-cache",), "disable_radix_cache", "true"),
    Flag(("--disable-cuda-graph",), "disable_cuda_graph", "true", ignore=True),
    Flag(("--cuda-graph-max-bs",), "cuda_graph_max_bs", "int", ignore=True),
    Flag(("--disable-custom-all-reduce",), "disable_custom_all_reduce", "true", ignore=True),
    Flag(("--disable-overlap-schedule",), "disable_overlap_schedule", "true", ignore=True),
    Flag(("--enable-torch-compile",), "enable_torch_compile", "true", ignore=True),
)


# --- programs ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Program:
    engine: str  # ENGINE_VLLM | ENGINE_SGLANG
    display: str  # how error messages name it, e.g. "vllm serve"
    positional_model: bool  # `vllm serve MODEL`


_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")


def split_program(argv: Sequence[str]) -> tuple[Program, list[str]]:
    """The engine program an argv starts with, and the arguments after it. EngineArgsError when none."""
    argv = list(argv)
    head = [os.path.basename(a) for a in argv[:1]] + argv[1:3]
    if len(head) >= 2 and head[0] == "vllm" and head[1] == "serve":
        return Program(ENGINE_VLLM, "vllm serve", True), argv[2:]
    if len(head) >= 3 and _PYTHON.match(head[0]) and head[1] == "-m":
        module = head[2]
        if module == "sglang.launch_server":
            return Program(ENGINE_SGLANG, "sglang.launch_server", False), argv[3:]
        if module == "vllm.entrypoints.openai.api_server":
            return Program(ENGINE_VLLM, "vllm.entrypoints.openai.api_server", False), argv[3:]
    shown = " ".join(argv[:3]) or "(empty)"
    raise EngineArgsError(
        "command",
        f"{shown!r} is neither `vllm serve`, `python3 -m vllm.entrypoints.openai.api_server` nor "
        "`python3 -m sglang.launch_server`",
    )


# --- parsing -----------------------------------------------------------------------------------------------
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT])$")


def human_readable_int(text: str) -> int:
    """vLLM's `human_readable_int` (arg_utils): 8k = 8,000, 8K = 8,192, 25.6k = 25,600; a plain int as is."""
    text = text.strip()
    match = _HUMAN_INT.match(text)
    if match is None:
        return int(text)
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
    if "." in number:
        raise ValueError(f"decimals are not allowed with binary suffixes: {text}")
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1)


_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "hint": human_readable_int,
    "float": float,
    "list": str,
}
_TYPE_NAMES = {"int": "int", "hint": "human_readable_int", "float": "float"}


def _is_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token)


def parse_flags(
    program: Program, args: Sequence[str], flags: Sequence[Flag], underscores: bool
) -> dict[str, Any]:
    """argparse-compatible parsing of `args` against `flags`: the values by dest (`positional_model` for
    `vllm serve MODEL`). Values of ignored flags are checked but not returned. Errors read like argparse's."""
    table = {name: flag for flag in flags for name in flag.names}
    values: dict[str, Any] = {}
    positionals: list[str] = []
    unknown: list[str] = []
    first_unknown: str | None = None
    i = 0
    args = list(args)
    while i < len(args):
        token = args[i]
        i += 1
        if token == "--":
            positionals.extend(args[i:])
            break
        if not _is_option(token):
            positionals.append(token)
            continue
        name, has_inline, inline = token.partition("=")
        if underscores and name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
        negated = False
        flag = table.get(name)
        if flag is None and name.startswith("--no-"):
            candidate = table.get("--" + name[5:])
            if candidate is not None and candidate.kind == "bool":
                flag, negated = candidate, True
        if flag is None:
            unknown.append(token)
            first_unknown = first_unknown or name
            if not has_inline and i < len(args) and not _is_option(args[i]):
                unknown.append(args[i])  # its value: argparse cannot tell it from a positional either
                i += 1
            continue
        if flag.kind in ("true", "bool"):
            if has_inline:
                raise EngineArgsError(
                    program.display, f"argument {flag.display}: ignored explicit argument {inline!r}", name
                )
            value: Any = not negated
        elif flag.kind == "list":
            items = [inline] if has_inline else []
            while not has_inline and i < len(args) and not _is_option(args[i]):
                items.append(args[i])
                i += 1
            if not items:
                raise EngineArgsError(
                    program.display, f"argument {flag.display}: expected at least one argument", name
                )
            value = items
        else:
            if has_inline:
                raw = inline
            elif i < len(args) and not _is_option(args[i]):
                raw = args[i]
                i += 1
            else:
                raise EngineArgsError(
                    program.display, f"argument {flag.display}: expected one argument", name
                )
            try:
                value = _CONVERTERS[flag.kind](raw)
            except ValueError:
                kind = _TYPE_NAMES.get(flag.kind, flag.kind)
                raise EngineArgsError(
                    program.display, f"argument {flag.display}: invalid {kind} value: {raw!r}", name
                ) from None
            if flag.choices is not None and value not in flag.choices:
                choices = ", ".join(repr(c) for c in flag.choices)
                raise EngineArgsError(
                    program.display,
                    f"argument {flag.display}: invalid choice: {value!r} (choose from {choices})",
                    name,
                )
        if not flag.ignore:
            values[flag.dest] = value
    if program.positional_model and positionals:
        values.setdefault("positional_model", positionals.pop(0))
    if positionals:
        unknown.extend(positionals)
    if unknown:
        raise UnknownFlagError(
            program.display, f"unrecognized arguments: {' '.join(unknown)}", first_unknown or unknown[0]
        )
    return values


# --- from a command line to an engine ----------------------------------------------------------------------
def engine_options_from_argv(
    argv: Sequence[str],
    *,
    sim_model: str | None = None,
    gpu: str = "h100-sxm",
    time_scale: float = 1.0,
    knobs: FaultKnobs | None = None,
    default_port: int | None = None,
) -> EngineOptions:
    """The engine a full command line (`vllm serve ...`, `python3 -m sglang.launch_server ...`) describes.

    `sim_model` is the preset to use when the model's name does not tell one (TOKENYARD_SIM_MODEL, --sim-model);
    `default_port` replaces the engine's own default port when the command line gives none (a pod's container
    port). The result is not validated against the hardware (call `.validate()`); headless or non-zero-rank
    workers come back with `serves_http` False. EngineArgsError (UnknownFlagError for unknown flags) otherwise.
    """
    program, args = split_program(argv)
    if program.engine == ENGINE_VLLM:
        values = parse_flags(program, args, VLLM_FLAGS, underscores=True)
        common = _vllm_options(program, values, default_port)
    else:
        values = parse_flags(program, args, SGLANG_FLAGS, underscores=False)
        common = _sglang_options(program, values, default_port)
    if values.get("dp", 1) != 1:
        raise EngineArgsError(
            program.display,
            f"data parallel size {values['dp']} is not simulated: run one engine per replica instead",
            "--data-parallel-size",
        )
    model_path = common.pop("model_path")
    preset = _preset(program, model_path, sim_model)
    weight_bytes: float | None = None
    if names_fp8_checkpoint(model_path) or str(values.get("quantization", "")).lower().startswith("fp8"):
        weight_bytes = 1
    dtype = values.get("dtype", "auto")
    if dtype != "auto":
        weight_bytes = weight_bytes or WEIGHT_DTYPE_BYTES[dtype]
    return EngineOptions(
        model=preset,
        gpu=gpu,
        time_scale=time_scale,
        knobs=knobs if knobs is not None else FaultKnobs(),
        model_path=model_path,
        weight_dtype_bytes=weight_bytes if weight_bytes != 2 else None,
        kv_cache_dtype=values.get("kv_cache_dtype", "auto"),
        tp=values.get("tp", 1),
        pp=values.get("pp", 1),
        max_model_len=values.get("max_model_len"),
        max_num_seqs=values.get("max_num_seqs"),
        seed=values.get("seed") or 0,
        nnodes=values.get("nnodes", 1),
        node_rank=values.get("node_rank", 0),
        **common,
    )


def _vllm_options(program: Program, values: dict[str, Any], default_port: int | None) -> dict[str, Any]:
    # `vllm serve MODEL` wins over --model (vllm/entrypoints/cli/serve.py: "If model is specified in CLI (as
    # positional arg), it takes precedence").
    model_path = values.get("positional_model") or values.get("model") or VLLM_DEFAULT_MODEL
    names = values.get("served_model_name") or []
    memory = values.get("gpu_memory_utilization")
    return dict(
        personality=PERSONALITY_VLLM,
        model_path=model_path,
        served_model_name=names[0] if names else None,
        served_model_aliases=tuple(n for n in names[1:] if n != names[0]),
        host=values.get("host") or VLLM_DEFAULT_HOST,
        port=_port(values, default_port, VLLM_DEFAULT_PORT),
        block_size=values.get("block_size"),
        num_gpu_blocks_override=values.get("num_gpu_blocks_override"),
        max_num_batched_tokens=values.get("max_num_batched_tokens"),
        enable_prefix_caching=values.get("enable_prefix_caching", True),  # on by default in V1
        enable_chunked_prefill=values.get("enable_chunked_prefill", True),  # always chunked in V1
        headless=values.get("headless", False),
        enable_metrics=True,
        report_cached_tokens=values.get("enable_prompt_tokens_details", False),
        **({} if memory is None else {"gpu_memory_utilization": memory}),
    )


def _sglang_options(program: Program, values: dict[str, Any], default_port: int | None) -> dict[str, Any]:
    model_path = values.get("model")
    if not model_path:
        raise EngineArgsError(
            program.display, "the following arguments are required: --model-path", "--model-path"
        )
    page = values.get("block_size") or SGLANG_PAGE_SIZE
    chunk = values.get("chunked_prefill_size")
    total_tokens = values.get("max_total_tokens")
    memory = values.get("gpu_memory_utilization")
    return dict(
        personality=PERSONALITY_SGLANG,
        model_path=model_path,
        served_model_name=values.get("served_model_name"),  # SGLang's default is the model path, as here
        host=values.get("host") or SGLANG_DEFAULT_HOST,
        port=_port(values, default_port, SGLANG_DEFAULT_PORT),
        block_size=page,
        num_gpu_blocks_override=math.ceil(total_tokens / page) if total_tokens else None,
        # --chunked-prefill-size -1 disables chunking: a prompt is prefilled in one step.
        max_num_batched_tokens=chunk if chunk and chunk > 0 else None,
        enable_chunked_prefill=not (chunk is not None and chunk <= 0),
        enable_prefix_caching=not values.get("disable_radix_cache", False),
        enable_metrics=values.get("enable_metrics", False),
        report_cached_tokens=values.get("enable_cache_report", False),
        headless=False,
        **({} if memory is None else {"gpu_memory_utilization": memory}),
    )


def _port(values: dict[str, Any], default_port: int | None, engine_default: int) -> int:
    if "port" in values:
        return values["port"]
    return default_port if default_port is not None else engine_default


def _preset(program: Program, model_path: str, sim_model: str | None) -> str:
    spec = preset_for_model_name(model_path)
    if spec is not None:
        return spec.name
    if sim_model:
        try:
            return model_preset(sim_model).name
        except PresetError as e:
            raise EngineArgsError(program.display, f"TOKENYARD_SIM_MODEL/--sim-model: {e}") from None
    raise EngineArgsError(
        program.display,
        f"the model {model_path!r} names none of the simulator's presets ({', '.join(MODELS)}); "
        "set TOKENYARD_SIM_MODEL (or --sim-model) to the preset it should behave like",
    )
