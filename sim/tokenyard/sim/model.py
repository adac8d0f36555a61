"""The performance model: model and GPU presets, KV budget, and the cost of one engine step.

Pure: plain frozen dataclasses in, numbers out.

The cost of a step is a roofline. A step runs `num_tokens` tokens (prefill chunks and one token per decoding
sequence) through every layer on every GPU of a tensor-parallel group:

    compute_s = FLOPs / TP / (peak dense bf16 FLOP/s x COMPUTE_EFFICIENCY)
    memory_s  = (weight bytes read + KV bytes read and written) / TP / (HBM bandwidth x BANDWIDTH_EFFICIENCY)
    comm_s    = 2 all-reduces per layer (after attention, after the MLP, as Megatron-style TP does) of
                num_tokens x hidden x 2 bytes, ring algorithm over the GPU's interconnect, when TP > 1
    step_s    = max(compute_s, memory_s) + comm_s + STEP_OVERHEAD_S + num_seqs x PER_SEQUENCE_STEP_S

so a prefill-heavy step is compute-bound and a decode step is bandwidth-bound (every weight is read once per step
whatever the batch size, which is what makes batching pay). Mixture-of-experts models read only the experts the
step's tokens were routed to: with uniform routing of k of E experts per token, the expected number of distinct
experts a step touches in one layer is E x (1 - (1 - k/E)^tokens).

The KV budget follows vLLM's memory profiling (vllm/v1/worker/gpu_worker.py, `determine_available_memory`):
memory x utilisation fraction, minus the weights, minus the peak activation memory of the largest step, split
into blocks of 16 tokens (vLLM's default `--block-size`; SGLang's page size is 1 token).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

BF16_BYTES = 2
GIB = 1024**3
MIB = 1024**2

# --- calibration constants (assumptions, not measurements; the bench compares their effect to published figures)
# Fraction of peak dense FLOP/s that large inference GEMMs reach. Model FLOP utilisation of well-tuned serving
# prefill is commonly reported between 50 and 70 percent; 0.6 is the middle.
COMPUTE_EFFICIENCY = 0.6
# Fraction of peak HBM bandwidth that decode kernels (weight and KV streaming) reach. Streaming benchmarks on
# A100/H100 reach about 85-90 percent of the datasheet figure; attention over paged KV does somewhat worse.
BANDWIDTH_EFFICIENCY = 0.8
# Fixed cost of one engine step outside the GPU kernels (scheduling, CUDA-graph launch).
STEP_OVERHEAD_S = 0.001
# Cost of one step per sequence in its batch, beyond the roofline: the work a step does once per request and that
# sharing the weights does not amortise (the request's positions and block table, sampling its token, handing it to
# the detokeniser and the API server), which vLLM's engine loop does between forward passes. Fitted by least squares
# on log(sim / published) to the decode figures marked `fit` in bench/bench_sim.py (InferenceBench's Llama-3.1-8B on
# one H100 at concurrency 1 and 4, its Qwen2.5-72B on four H100s at 1, 4 and 16); held out there: J. Musgrave's A100
# sweep (concurrency 1, and the throughput gain at 8). It stays small because a per-sequence cost caps an engine's
# decode rate at 1 / PER_SEQUENCE_STEP_S tokens per second whatever its GPUs: the 0.234 ms that would bring
# InferenceBench's 8B point at concurrency 16 within 15 percent caps every engine near 4.3k tok/s, and that point is
# itself capped outside the engine (CAPPED in bench/bench_sim.py). `python bench/bench_sim.py --fit` redoes the fit.
PER_SEQUENCE_STEP_S = 0.000050
# Latency of one small NCCL all-reduce inside one node (NCCL's nccl-tests report a few microseconds on NVLink).
ALLREDUCE_LATENCY_S = 10e-6
# CUDA graphs, NCCL buffers and allocator slack that vLLM's profiling finds outside weights and activations.
RUNTIME_RESERVE_BYTES = 1 * GIB

# --- vLLM defaults (vllm/config: CacheConfig, SchedulerConfig; vllm/engine/arg_utils.py)
BLOCK_SIZE_TOKENS = 16  # --block-size default on CUDA
GPU_MEMORY_UTILIZATION = 0.9  # --gpu-memory-utilization default
MAX_NUM_BATCHED_TOKENS = 8192  # V1 default token budget of the OpenAI server on A100/H100-class GPUs
MAX_NUM_SEQS = 256  # --max-num-seqs default


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's shapes, from its Hugging Face config.json."""

    name: str  # preset name, e.g. "llama-3.1-8b"
    hf_id: str  # the served model name by default
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # per expert for MoE models
    vocab_size: int
    max_position_embeddings: int
    num_experts: int = 1
    experts_per_token: int = 1
    tied_embeddings: bool = False
    dtype_bytes: int = BF16_BYTES

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def attention_params_per_layer(self) -> int:
        q_and_o = 2 * self.hidden_size * self.num_attention_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def expert_params(self) -> int:
        """One expert's (or the dense MLP's) gate, up and down projections."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden_size * self.num_experts if self.is_moe else 0

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """Parameters stored (norms and biases are under 0.1 percent and left out)."""
        per_layer = (
            self.attention_params_per_layer
            + self.num_experts * self.expert_params
            + self.router_params_per_layer
        )
        return self.num_layers * per_layer + self.embedding_params + self.lm_head_params

    @property
    def active_params_per_token(self) -> int:
        """Parameters one token multiplies through (the input embedding is a lookup, not a matmul)."""
        per_layer = (
            self.attention_params_per_layer
            + self.experts_per_token * self.expert_params
            + self.router_params_per_layer
        )
        return self.num_layers * per_layer + self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return self.total_params * self.dtype_bytes

    def kv_heads_per_gpu(self, tp: int) -> int:
        # vLLM replicates KV heads when TP exceeds their number (each GPU keeps at least one).
        return max(1, math.ceil(self.num_kv_heads / tp))

    def kv_bytes_per_token(self, tp: int = 1, pp: int = 1, dtype_bytes: int | None = None) -> int:
        """KV-cache bytes one token occupies on one GPU: layers x KV heads x head_dim x (K and V) x dtype.

        With pipeline parallelism a GPU holds the KV of its stage's layers only (the first stages take the
        remainder when the layers do not divide evenly, as vLLM's `get_pp_indices` does)."""
        layers = math.ceil(self.num_layers / pp)
        kv_bytes = self.dtype_bytes if dtype_bytes is None else dtype_bytes
        return layers * self.kv_heads_per_gpu(tp) * self.head_dim * 2 * kv_bytes


@dataclass(frozen=True)
class GpuSpec:
    """One GPU's datasheet figures."""

    name: str
    product_labels: tuple[
        str, ...
    ]  # values of nvidia.com/gpu.product (GPU feature discovery) that mean this GPU
    peak_bf16_flops: float  # dense (no 2:4 sparsity)
    hbm_bytes_per_s: float
    memory_bytes: int  # total memory as nvidia-smi reports it
    interconnect_bytes_per_s: float  # per direction, GPU to GPU inside one node


# Model presets, from each model's config.json on Hugging Face.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # meta-llama/Llama-3.1-8B-Instruct config.json
        ModelSpec(
            name="llama-3.1-8b",
            hf_id="meta-llama/Llama-3.1-8B-Instruct",
            num_layers=32,
            hidden_size=4096,
            num_attention_heads=32,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=14336,
            vocab_size=128256,
            max_position_embeddings=131072,
        ),
        # meta-llama/Llama-3.1-70B-Instruct config.json
        ModelSpec(
            name="llama-3.1-70b",
            hf_id="meta-llama/Llama-3.1-70B-Instruct",
            num_layers=80,
            hidden_size=8192,
            num_attention_heads=64,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=28672,
            vocab_size=128256,
            max_position_embeddings=131072,
        ),
        # meta-llama/Llama-3.1-405B-Instruct config.json
        ModelSpec(
            name="llama-3.1-405b",
            hf_id="meta-llama/Llama-3.1-405B-Instruct",
            num_layers=126,
            hidden_size=16384,
            num_attention_heads=128,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=53248,
            vocab_size=128256,
            max_position_embeddings=131072,
        ),
        # Qwen/Qwen2.5-72B-Instruct config.json (max_position_embeddings 32768 without YaRN rope scaling)
        ModelSpec(
            name="qwen2.5-72b",
            hf_id="Qwen/Qwen2.5-72B-Instruct",
            num_layers=80,
            hidden_size=8192,
            num_attention_heads=64,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=29568,
            vocab_size=152064,
            max_position_embeddings=32768,
        ),
        # mistralai/Mixtral-8x7B-Instruct-v0.1 config.json: 8 experts, 2 per token
        ModelSpec(
            name="mixtral-8x7b",
            hf_id="mistralai/Mixtral-8x7B-Instruct-v0.1",
            num_layers=32,
            hidden_size=4096,
            num_attention_heads=32,
            num_kv_heads=8,
            head_dim=128,
            intermediate_size=14336,
            vocab_size=32000,
            max_position_embeddings=32768,
            num_experts=8,
            experts_per_token=2,
        ),
    )
}

# GPU presets, from NVIDIA's datasheets. FLOP/s are dense bf16 Tensor Core figures (the datasheets print the
# 2:4-sparsity figure, twice as large, with an asterisk). Interconnect is the per-direction half of the quoted
# bidirectional NVLink (or PCIe) figure. Memory is what nvidia-smi reports as total (MiB).
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): 312 TFLOPS bf16, 2,039 GB/s HBM2e,
        # NVLink 600 GB/s; nvidia-smi: 81920 MiB.
        GpuSpec(
            name="a100-80gb",
            product_labels=("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe", "A100-80GB", "A100"),
            peak_bf16_flops=312e12,
            hbm_bytes_per_s=2039e9,
            memory_bytes=81920 * MIB,
            interconnect_bytes_per_s=300e9,
        ),
        # Same datasheet (SXM4 40GB): 312 TFLOPS bf16, 1,555 GB/s HBM2, NVLink 600 GB/s; nvidia-smi: 40960 MiB.
        GpuSpec(
            name="a100-40gb",
            product_labels=("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB", "A100-40GB"),
            peak_bf16_flops=312e12,
            hbm_bytes_per_s=1555e9,
            memory_bytes=40960 * MIB,
            interconnect_bytes_per_s=300e9,
        ),
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 1,979 TFLOPS bf16 with sparsity -> 989.4 dense,
        # 3.35 TB/s HBM3, NVLink 900 GB/s; nvidia-smi: 81559 MiB.
        GpuSpec(
            name="h100-sxm",
            product_labels=("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB", "H100-SXM", "H100"),
            peak_bf16_flops=989.4e12,
            hbm_bytes_per_s=3.35e12,
            memory_bytes=81559 * MIB,
            interconnect_bytes_per_s=450e9,
        ),
        # NVIDIA H200 Tensor Core GPU datasheet (SXM): 1,979 TFLOPS bf16 with sparsity -> 989.4 dense,
        # 4.8 TB/s HBM3e, 141 GB, NVLink 900 GB/s; nvidia-smi: 143771 MiB.
        GpuSpec(
            name="h200",
            product_labels=("NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e", "H200"),
            peak_bf16_flops=989.4e12,
            hbm_bytes_per_s=4.8e12,
            memory_bytes=143771 * MIB,
            interconnect_bytes_per_s=450e9,
        ),
        # NVIDIA L40S datasheet: 733 TFLOPS bf16 with sparsity -> 366 dense, 864 GB/s GDDR6, 48 GB,
        # no NVLink: PCIe Gen4 x16 at 64 GB/s; nvidia-smi: 46068 MiB.
        GpuSpec(
            name="l40s",
            product_labels=("NVIDIA-L40S", "L40S"),
            peak_bf16_flops=366e12,
            hbm_bytes_per_s=864e9,
            memory_bytes=46068 * MIB,
            interconnect_bytes_per_s=32e9,
        ),
    )
}


class PresetError(ValueError):
    """An unknown preset name or a configuration that cannot run (weights do not fit, ...)."""


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", name.lower())


def model_preset(name: str) -> ModelSpec:
    """A model preset by its preset name or Hugging Face id (case and punctuation are ignored)."""
    wanted = _normalise(name)
    for spec in MODELS.values():
        if wanted in (_normalise(spec.name), _normalise(spec.hf_id), _normalise(spec.hf_id.split("/")[-1])):
            return spec
    raise PresetError(f"unknown model preset {name!r} (known: {', '.join(MODELS)})")


# How a Hugging Face id or a checkpoint directory names each preset's model: family, version and size as tokens
# of the name (case-insensitive; "-", "_", "." and "/" separate tokens), so that "meta-llama/Llama-3.1-8B",
# "Meta-Llama-3.1-8B-Instruct", "/mnt/pvc/models/llama-3.1-8b-instruct" or "Llama-3.1-405B-Instruct-FP8" find
# their preset while "Llama-3.1-80B" or "Llama-3.2-8B" do not.
MODEL_NAME_PATTERNS: dict[str, str] = {
    "llama-3.1-8b": r"llama-?3[.-]1-8b",
    "llama-3.1-70b": r"llama-?3[.-][13]-70b",  # Llama 3.3 70B has Llama 3.1 70B's config.json
    "llama-3.1-405b": r"llama-?3[.-]1-405b",
    "qwen2.5-72b": r"qwen-?2[.-]5-72b",
    "mixtral-8x7b": r"mixtral-8x7b",
}
_FP8_TOKEN = re.compile(r"(^|[-_./])fp8($|[-_./])", re.IGNORECASE)


def preset_for_model_name(name: str) -> ModelSpec | None:
    """The preset a model argument names (a Hugging Face id, its last part, or a checkpoint path), else None.

    An exact preset name or Hugging Face id wins; otherwise the family, version and size are looked for in the
    name's last path component (a local path such as /mnt/models/x tells nothing, and gives None)."""
    try:
        return model_preset(name)
    except PresetError:
        pass
    last = name.rstrip("/").rsplit("/", 1)[-1].lower().replace("_", "-")
    for preset, pattern in MODEL_NAME_PATTERNS.items():
        if re.search(rf"(^|[-.]){pattern}($|[-.])", last):
            return MODELS[preset]
    return None


def names_fp8_checkpoint(name: str) -> bool:
    """Whether a model name says its weights are stored in FP8 (e.g. meta-llama/Llama-3.1-405B-Instruct-FP8)."""
    return bool(_FP8_TOKEN.search(name.rstrip("/").rsplit("/", 1)[-1]))


def gpu_preset(name: str) -> GpuSpec:
    """A GPU preset by preset name or by a `nvidia.com/gpu.product` label value."""
    wanted = _normalise(name)
    for spec in GPUS.values():
        if wanted == _normalise(spec.name) or wanted in (_normalise(label) for label in spec.product_labels):
            return spec
    raise PresetError(f"unknown GPU preset {name!r} (known: {', '.join(GPUS)})")


@dataclass(frozen=True)
class StepShape:
    """What one engine step computes, summed over the sequences in its batch."""

    num_tokens: int  # tokens run through the model (prefill chunk tokens + one per decoding sequence)
    num_seqs: int  # sequences in the batch (each samples at most one token, through the LM head)
    attention_pairs: int  # sum over sequences of (query tokens x context tokens each attends to)
    kv_tokens_read: int  # sum over sequences of context tokens whose K and V are read


@dataclass(frozen=True)
class StepCost:
    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.comm_s + self.overhead_s


@dataclass(frozen=True)
class Deployment:
    """A model served on a tensor- (and pipeline-) parallel group of one GPU type: the unit the simulator models.

    Pipeline parallelism splits the layers into `pp` stages of `tp` GPUs each: weights and KV cache are spread
    over tp x pp GPUs, and one step runs through the stages one after the other (no micro-batching), so its
    compute and memory time is that of all layers on `tp` GPUs, plus one activation hand-off per stage boundary.
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    block_size: int = BLOCK_SIZE_TOKENS
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = MAX_NUM_SEQS
    pp: int = 1
    # None: the model's dtype. Weights: 1 for an FP8 checkpoint, 4 for float32; KV: 1 with --kv-cache-dtype fp8.
    weight_dtype_bytes: float | None = None
    kv_dtype_bytes: int | None = None
    per_sequence_step_s: float = PER_SEQUENCE_STEP_S

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise PresetError(f"tensor parallel size must be >= 1, got {self.tp}")
        if self.pp < 1:
            raise PresetError(f"pipeline parallel size must be >= 1, got {self.pp}")
        if self.pp > self.model.num_layers:
            raise PresetError(f"pipeline parallel size {self.pp} exceeds the {self.model.num_layers} layers")
        if self.block_size < 1:
            raise PresetError(f"block size must be >= 1, got {self.block_size}")
        if self.per_sequence_step_s < 0:
            raise PresetError(f"per-sequence step cost must be >= 0 s, got {self.per_sequence_step_s}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise PresetError(f"gpu memory utilisation must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_budget_bytes_per_gpu < self.block_bytes_per_gpu:
            raise PresetError(
                f"{self.model.name} does not fit on {self.tp * self.pp} x {self.gpu.name}: "
                f"{self.weight_bytes_per_gpu / GIB:.1f} GiB of weights per GPU leave no room for the KV cache "
                f"in {self.gpu.memory_bytes * self.gpu_memory_utilization / GIB:.1f} GiB; raise --tp"
            )

    # --- memory -----------------------------------------------------------------------------------------------
    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.model.total_params * self._weight_dtype_bytes / (self.tp * self.pp)

    @property
    def _weight_dtype_bytes(self) -> float:
        return self.model.dtype_bytes if self.weight_dtype_bytes is None else self.weight_dtype_bytes

    @property
    def activation_bytes_per_gpu(self) -> float:
        """Peak activation memory of the largest step (the budget's worth of tokens through the MLP) plus the
        fp32 logits of a full batch, plus the runtime reserve."""
        m = self.model
        mlp = (
            self.max_num_batched_tokens * (2 * m.intermediate_size / self.tp + m.hidden_size) * m.dtype_bytes
        )
        logits = self.max_num_seqs * m.vocab_size * 4
        return mlp + logits + RUNTIME_RESERVE_BYTES

    @property
    def kv_budget_bytes_per_gpu(self) -> float:
        usable = self.gpu.memory_bytes * self.gpu_memory_utilization
        return usable - self.weight_bytes_per_gpu - self.activation_bytes_per_gpu

    @property
    def kv_bytes_per_token_per_gpu(self) -> int:
        return self.model.kv_bytes_per_token(self.tp, self.pp, self.kv_dtype_bytes)

    @property
    def block_bytes_per_gpu(self) -> int:
        return self.block_size * self.kv_bytes_per_token_per_gpu

    @property
    def num_gpu_blocks(self) -> int:
        return max(0, int(self.kv_budget_bytes_per_gpu // self.block_bytes_per_gpu))

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    @property
    def max_model_len(self) -> int:
        """The context window: the model's, capped by what the KV cache can hold for one sequence."""
        return min(self.model.max_position_embeddings, self.kv_capacity_tokens)

    # --- time ---------------------------------------------------------------------------------------------------
    def expected_experts_touched(self, num_tokens: int) -> float:
        m = self.model
        if not m.is_moe:
            return 1.0
        miss = (1.0 - m.experts_per_token / m.num_experts) ** num_tokens
        return m.num_experts * (1.0 - miss)

    def step_cost(self, shape: StepShape) -> StepCost:
        m, g, tp = self.model, self.gpu, self.tp
        if shape.num_tokens <= 0:
            return StepCost(0.0, 0.0, 0.0, 0.0)
        # Every token runs through all layers (attention projections and its experts); only the sampled
        # positions run through the LM head.
        layer_params = m.attention_params_per_layer + m.router_params_per_layer
        expert_flop_params = m.experts_per_token * m.expert_params
        matmul_flops = 2 * shape.num_tokens * m.num_layers * (layer_params + expert_flop_params)
        lm_head_flops = 2 * shape.num_seqs * m.vocab_size * m.hidden_size
        # QK^T and AV: 2 FLOPs per multiply-add, 2 matmuls, every head of every layer.
        attention_flops = 4 * shape.attention_pairs * m.num_layers * m.num_attention_heads * m.head_dim
        flops = matmul_flops + lm_head_flops + attention_flops
        compute_s = flops / tp / (g.peak_bf16_flops * COMPUTE_EFFICIENCY)

        experts_read = self.expected_experts_touched(shape.num_tokens)
        # The LM head (or, when tied, the embedding matrix) is read once per step too.
        weights_read = self._weight_dtype_bytes * (
            m.num_layers * (layer_params + experts_read * m.expert_params) + m.vocab_size * m.hidden_size
        )
        # whole-model figure; divided by TP below with the weights
        kv_per_token = m.kv_bytes_per_token(1, 1, self.kv_dtype_bytes)
        kv_traffic = (shape.kv_tokens_read + shape.num_tokens) * kv_per_token
        memory_s = (weights_read + kv_traffic) / tp / (g.hbm_bytes_per_s * BANDWIDTH_EFFICIENCY)

        comm_s = 0.0
        if tp > 1:
            message = shape.num_tokens * m.hidden_size * m.dtype_bytes
            ring = 2 * (tp - 1) / tp * message / g.interconnect_bytes_per_s + ALLREDUCE_LATENCY_S
            comm_s = 2 * m.num_layers * ring
        if self.pp > 1:  # each stage hands its activations to the next one
            message = shape.num_tokens * m.hidden_size * m.dtype_bytes
            comm_s += (self.pp - 1) * (message / g.interconnect_bytes_per_s + ALLREDUCE_LATENCY_S)
        overhead_s = STEP_OVERHEAD_S + shape.num_seqs * self.per_sequence_step_s
        return StepCost(compute_s, memory_s, comm_s, overhead_s)

    def step_seconds(self, shape: StepShape) -> float:
        return self.step_cost(shape).total_s

    # --- closed-form figures the bench compares with published ones ----------------------------------------------
    def decode_step_seconds(self, batch: int, context_tokens: int) -> float:
        """One decode step of `batch` sequences that each hold `context_tokens` of context."""
        return self.step_seconds(
            StepShape(
                num_tokens=batch,
                num_seqs=batch,
                attention_pairs=batch * context_tokens,
                kv_tokens_read=batch * context_tokens,
            )
        )

    def prefill_step_seconds(self, prompt_tokens: int, num_prompts: int = 1) -> float:
        """One step that prefills `num_prompts` fresh prompts of `prompt_tokens` each (no cache hits)."""
        tokens = prompt_tokens * num_prompts
        return self.step_seconds(
            StepShape(
                num_tokens=tokens,
                num_seqs=num_prompts,
                attention_pairs=num_prompts * prompt_tokens * (prompt_tokens + 1) // 2,
                kv_tokens_read=num_prompts * prompt_tokens,
            )
        )
