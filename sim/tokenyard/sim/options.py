"""What defines one simulated engine (`EngineOptions`) and the knobs that change while it runs (`FaultKnobs`).

Pure: no I/O. The command lines (`tokenyard.sim.engine_args`), the `serve` CLI and the pod runner all build an
`EngineOptions`; `tokenyard.sim.server` serves one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokenyard.core import labels as L
from tokenyard.sim.model import (
    BLOCK_SIZE_TOKENS,
    GPU_MEMORY_UTILIZATION,
    Deployment,
    gpu_preset,
    model_preset,
)

PERSONALITY_VLLM = "vllm"
PERSONALITY_SGLANG = "sglang"
PERSONALITIES = (PERSONALITY_VLLM, PERSONALITY_SGLANG)
SGLANG_PAGE_SIZE = 1  # SGLang's --page-size default (docs/advanced_features/server_arguments.md)

METRICS_FAULT_NONE = "none"
METRICS_FAULT_GARBAGE = "garbage"  # 200, but a body that is not the exposition format
METRICS_FAULT_ERROR = "error"  # 500
METRICS_FAULTS = (METRICS_FAULT_NONE, METRICS_FAULT_GARBAGE, METRICS_FAULT_ERROR)


@dataclass
class FaultKnobs:
    """Behaviour knobs for rollout and failure rehearsals; all can change while the engine runs."""

    error_rate: float = 0.0  # fraction of generation requests answered with a 500
    latency_multiplier: float = 1.0  # every step takes this many times as long
    startup_seconds: float = 0.0  # modelled model-load time: /health answers 503 until it has passed
    crash_after_requests: int | None = (
        None  # stop listening (and drop connections) when this many have arrived
    )
    # /metrics only: "garbage" answers 200 with a body that is no exposition format (corrupt gzip when the client
    # accepts gzip, else an HTML page), "error" answers 500; generation is unaffected either way.
    metrics_fault: str = METRICS_FAULT_NONE

    def validated(self) -> FaultKnobs:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {self.error_rate}")
        if self.latency_multiplier <= 0:
            raise ValueError(f"latency_multiplier must be positive, got {self.latency_multiplier}")
        if self.startup_seconds < 0:
            raise ValueError(f"startup_seconds must be >= 0, got {self.startup_seconds}")
        if self.crash_after_requests is not None and self.crash_after_requests < 0:
            raise ValueError(f"crash_after_requests must be >= 0, got {self.crash_after_requests}")
        if self.metrics_fault not in METRICS_FAULTS:
            raise ValueError(
                f"metrics_fault must be one of {', '.join(METRICS_FAULTS)}, got {self.metrics_fault!r}"
            )
        return self


def env_value(env: Mapping[str, str], name: str, kind: type, default: Any, where: str = "env") -> Any:
    """`env[name]` converted to `kind`, `default` when unset or empty; ValueError naming the variable."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{where} {name}={raw!r} is not a valid {kind.__name__}") from None


def knobs_from_env(env: Mapping[str, str], where: str = "env") -> FaultKnobs:
    """The fault knobs a TOKENYARD_SIM_* environment sets (a pod's container env, or the CLI's environment).

    ValueError naming the variable when a value does not parse or is out of range."""

    def value(name: str, kind: type, default: Any) -> Any:
        return env_value(env, name, kind, default, where)

    knobs = FaultKnobs(
        error_rate=value(L.ENV_SIM_ERROR_RATE, float, 0.0),
        latency_multiplier=value(L.ENV_SIM_LATENCY_MULTIPLIER, float, 1.0),
        startup_seconds=value(L.ENV_SIM_STARTUP_SECONDS, float, 0.0),
        crash_after_requests=value(L.ENV_SIM_CRASH_AFTER_REQUESTS, int, None),
        metrics_fault=value(L.ENV_SIM_METRICS_FAULT, str, METRICS_FAULT_NONE).strip().lower(),
    )
    try:
        return knobs.validated()
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


@dataclass(frozen=True)
class EngineOptions:
    """Everything that defines one simulated engine (the command lines, the CLI and the pod runner build one)."""

    model: str = "llama-3.1-8b"  # the preset the performance model uses
    gpu: str = "h100-sxm"
    tp: int = 1
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None  # default: the model as named on the command line, else the HF id
    time_scale: float = 1.0
    max_model_len: int | None = None
    num_gpu_blocks_override: int | None = None  # vLLM's --num-gpu-blocks-override (small caches in tests)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    knobs: FaultKnobs = field(default_factory=FaultKnobs)
    seed: int = 0  # of the fault injection's random numbers
    # --- from the engines' command lines -------------------------------------------------------------------
    personality: str = PERSONALITY_VLLM  # whose HTTP API, error bodies and metric names the engine serves
    pp: int = 1
    model_path: str | None = None  # the model argument as given (a Hugging Face id or a path)
    served_model_aliases: tuple[str, ...] = ()  # vLLM's --served-model-name takes several names; these follow
    block_size: int | None = None  # None: the personality's default (vLLM 16 tokens, SGLang 1)
    enable_prefix_caching: bool = True  # vLLM V1 and SGLang's radix cache are on by default
    enable_chunked_prefill: bool = True
    kv_cache_dtype: str = "auto"
    weight_dtype_bytes: float | None = None  # None: the model's (bf16); 1 for an FP8 checkpoint
    enable_metrics: bool = True  # SGLang serves /metrics only with --enable-metrics
    # usage.prompt_tokens_details.cached_tokens in responses: vLLM v0.13.0 adds it only with
    # --enable-prompt-tokens-details and only when the count is above 0 (entrypoints/openai/serving_completion.py
    # and serving_chat.py: `if self.enable_prompt_tokens_details and num_cached_tokens`); SGLang only with
    # --enable-cache-report, and also only above 0 (UsageProcessor._details_if_cached). Off, as in both.
    report_cached_tokens: bool = False
    headless: bool = False  # vLLM --headless: a worker node that serves no API
    nnodes: int = 1
    node_rank: int = 0

    @property
    def serves_http(self) -> bool:
        """Only the group's leader (node rank 0, not headless) runs the API server."""
        return not self.headless and self.node_rank == 0

    @property
    def effective_block_size(self) -> int:
        if self.block_size is not None:
            return self.block_size
        return SGLANG_PAGE_SIZE if self.personality == PERSONALITY_SGLANG else BLOCK_SIZE_TOKENS

    @property
    def kv_dtype_bytes(self) -> int | None:
        return 1 if self.kv_cache_dtype.lower().startswith("fp8") else None

    def deployment(self) -> Deployment:
        overrides: dict[str, Any] = {}
        if self.max_num_seqs is not None:
            overrides["max_num_seqs"] = self.max_num_seqs
        if self.max_num_batched_tokens is not None:
            overrides["max_num_batched_tokens"] = self.max_num_batched_tokens
        return Deployment(
            model_preset(self.model),
            gpu_preset(self.gpu),
            tp=self.tp,
            pp=self.pp,
            gpu_memory_utilization=self.gpu_memory_utilization,
            block_size=self.effective_block_size,
            weight_dtype_bytes=self.weight_dtype_bytes,
            kv_dtype_bytes=self.kv_dtype_bytes,
            **overrides,
        )

    def validate(self) -> Deployment:
        """The deployment, or ValueError (PresetError) naming what is wrong."""
        if self.personality not in PERSONALITIES:
            raise ValueError(
                f"personality must be one of {', '.join(PERSONALITIES)}, got {self.personality!r}"
            )
        if not self.time_scale > 0 or math.isinf(self.time_scale):
            raise ValueError(f"time scale must be positive, got {self.time_scale}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node rank {self.node_rank} is not one of the {self.nnodes} nodes")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks_override"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.knobs.validated()
        return self.deployment()
