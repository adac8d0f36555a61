"""What tokenyard knows about each engine's command line: the facts the operator renders from and the API
server validates against (the CRD's CEL rules are generated from these tables, so they cannot drift).

Sources, per engine (flag names checked against these pages):
- vLLM v0.13.0 (image `vllm/vllm-openai:v0.13.0`, whose entrypoint is `vllm serve`):
  `docs/configuration/engine_args.md` and `docs/cli/serve.md` for the flags;
  `docs/serving/parallelism_scaling.md`, section "Running vLLM with MultiProcessing", for a multi-node group
  (`--nnodes`, `--node-rank`, `--master-addr`, `--master-port`, `--headless` on every node but the head; the
  section first appeared with vllm-project/vllm#30509, 2025-12-14, and v0.13.0 is the first release carrying it).
- SGLang v0.5.x (image `lmsysorg/sglang`, started with `python3 -m sglang.launch_server`):
  `docs/advanced_features/server_arguments.md` for the flags (`--host` defaults to 127.0.0.1, so the operator
  renders `--host 0.0.0.0`; `/metrics` exists only with `--enable-metrics`), and
  `docs/references/multi_node_deployment/multi_node.md` for `--nnodes`, `--node-rank`, `--dist-init-addr`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class EngineKind(StrEnum):
    VLLM = "vLLM"
    SGLANG = "SGLang"
    CUSTOM = "Custom"


# The process each kind's container runs (the image's own entrypoint is not relied on).
VLLM_COMMAND = ("vllm", "serve")
SGLANG_COMMAND = ("python3", "-m", "sglang.launch_server")

# Rendezvous ports of a multi-pod group, on the leader (rank 0) through the group's headless Service.
# vLLM's `--master-port` default is 29501 in v0.13.0 arg_utils; the value is rendered explicitly so that it
# is visible in the pod and does not depend on the version's default.
VLLM_MASTER_PORT = 29500
# SGLang's docs use port 5000 in `--dist-init-addr HOST:5000` for the multi-node example.
SGLANG_DIST_INIT_PORT = 5000

# Mount points of what the operator mounts into a rendered engine container.
SHM_MOUNT = "/dev/shm"
PVC_MOUNT_ROOT = "/mnt/pvc"  # pvc://CLAIM/PATH is served from /mnt/pvc/CLAIM/PATH (read-only)
HF_CACHE_MOUNT = "/root/.cache/huggingface"  # the images run as root; HF_HOME points here as well

# URI schemes the operator can turn into a model argument (spec.model.weights.uri, spec.model.tokenizer.uri).
HF_SCHEME = "hf://"
PVC_SCHEME = "pvc://"
# A regular expression for CEL's `matches` and Python's `re`: hf://ORG/NAME[@REV], pvc://CLAIM/PATH, /ABS/PATH.
# (No backslashes, so that the same text is a valid CEL string literal.)
SUPPORTED_MODEL_URI = (
    "^(hf://([A-Za-z0-9][-._A-Za-z0-9]*/)?[-._A-Za-z0-9]+(@[-._/A-Za-z0-9]+)?"
    "|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[!-~]*)?"
    "|/[!-~]+)$"
)
SUPPORTED_MODEL_URI_HELP = (
    "hf://[ORG/]NAME[@REVISION], pvc://CLAIM/PATH or an absolute path in the container (/models/...)"
)

# The flags the operator renders from the spec, per kind, with every spelling the engine accepts for them.
# A user argument that sets one of these would contradict the spec (or silently win over it), so it is
# refused at admission and by the renderer. vLLM's parser (FlexibleArgumentParser) also accepts underscores
# in long flag names; `-tp`, `-pp`, `-dp` are its documented short forms.
VLLM_RENDERED_FLAGS: dict[str, tuple[str, ...]] = {
    "the model (spec.model.weights.uri)": ("--model",),
    "the served model name (spec.model.servedModelName)": ("--served-model-name",),
    "the port (spec.engine.port)": ("--port",),
    "the tensor-parallel size (spec.parallelism.tensor)": ("--tensor-parallel-size", "-tp"),
    "the pipeline-parallel size (spec.parallelism.pipeline)": ("--pipeline-parallel-size", "-pp"),
    "the data-parallel size (a group is one model replica; use spec.replicas)": (
        "--data-parallel-size",
        "-dp",
    ),
    "the model revision (spec.model.weights.uri @REVISION)": ("--revision",),
    "the tokenizer (spec.model.tokenizer.uri)": ("--tokenizer", "--tokenizer-revision"),
    "the multi-node bootstrap (rendered per rank)": (
        "--distributed-executor-backend",
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--headless",
    ),
}
SGLANG_RENDERED_FLAGS: dict[str, tuple[str, ...]] = {
    "the model (spec.model.weights.uri)": ("--model-path", "--model"),
    "the served model name (spec.model.servedModelName)": ("--served-model-name",),
    "the listen address (rendered as 0.0.0.0)": ("--host",),
    "the port (spec.engine.port)": ("--port",),
    "the tensor-parallel size (spec.parallelism.tensor)": ("--tp-size", "--tensor-parallel-size", "--tp"),
    "the pipeline-parallel size (spec.parallelism.pipeline)": ("--pp-size", "--pipeline-parallel-size"),
    "the data-parallel size (a group is one model replica; use spec.replicas)": (
        "--dp-size",
        "--data-parallel-size",
        "--dp",
    ),
    "the model revision (spec.model.weights.uri @REVISION)": ("--revision",),
    "the tokenizer (spec.model.tokenizer.uri)": ("--tokenizer-path",),
    "the multi-node bootstrap (rendered per rank)": ("--nnodes", "--node-rank", "--dist-init-addr"),
}
RENDERED_FLAGS: dict[EngineKind, dict[str, tuple[str, ...]]] = {
    EngineKind.VLLM: VLLM_RENDERED_FLAGS,
    EngineKind.SGLANG: SGLANG_RENDERED_FLAGS,
}


def _spellings(kind: EngineKind, flag: str) -> tuple[str, ...]:
    if kind is EngineKind.VLLM and flag.startswith("--") and "-" in flag[2:]:
        return flag, "--" + flag[2:].replace("-", "_")
    return (flag,)


def flag_spellings(kind: EngineKind) -> tuple[str, ...]:
    """Every spelling of every rendered flag of `kind` (underscore forms included for vLLM)."""
    flags = (flag for group in RENDERED_FLAGS.get(kind, {}).values() for flag in group)
    return tuple(spelling for flag in flags for spelling in _spellings(kind, flag))


def conflicting_args(kind: EngineKind, args: list[str]) -> list[str]:
    """One message per user argument of `spec.engine.args` that sets a flag the operator renders."""
    meaning_of = {
        spelling: meaning
        for meaning, flags in RENDERED_FLAGS.get(kind, {}).items()
        for flag in flags
        for spelling in _spellings(kind, flag)
    }
    problems = []
    for index, arg in enumerate(args):
        flag = arg.split("=", 1)[0]
        if flag in meaning_of:
            problems.append(
                f"spec.engine.args[{index}]: {flag} sets {meaning_of[flag]}, which the operator renders for "
                f"engine kind {kind.value}; remove it (or use engine kind Custom to write the whole command)"
            )
    return problems


# The flag that bounds how many requests an engine runs in one batch; the rest wait in its queue. vLLM v0.13.0
# docs/configuration/engine_args.md: `--max-num-seqs` ("Maximum number of sequences to be processed in a single
# iteration"); SGLang v0.5.x docs/advanced_features/server_arguments.md: `--max-running-requests`. Neither engine
# exports it in /metrics, so the router reads it from the arguments the operator runs the engine with
# (`configured_batch_size`); without it the router can only learn it once requests have queued.
BATCH_SIZE_FLAGS: dict[EngineKind, tuple[str, ...]] = {
    EngineKind.VLLM: ("--max-num-seqs",),
    EngineKind.SGLANG: ("--max-running-requests",),
    # A custom image runs its own entrypoint; an argument by either engine's name means the same there (the
    # simulators llm-d-inference-sim and tokenyard.sim take --max-num-seqs too).
    EngineKind.CUSTOM: ("--max-num-seqs", "--max-running-requests"),
}


def configured_batch_size(kind: EngineKind | str, args: list[str]) -> int | None:
    """The batch size `args` set for an engine of `kind` (``--flag=N`` or ``--flag N``; the last one wins, as with
    argparse), or None where they set none or set it to something other than a positive integer."""
    try:
        kind = EngineKind(kind)
    except ValueError:
        return None
    spellings = {spelling for flag in BATCH_SIZE_FLAGS[kind] for spelling in _spellings(kind, flag)}
    found: str | None = None
    for index, arg in enumerate(args):
        flag, sep, value = str(arg).partition("=")
        if flag in spellings:
            found = value if sep else (str(args[index + 1]) if index + 1 < len(args) else "")
    if found is None or not found.strip().isdigit() or int(found) < 1:
        return None
    return int(found)


def _cel_sets_rendered_flag(kind: EngineKind) -> str:
    spellings = ", ".join(f"'{flag}'" for flag in flag_spellings(kind))
    return f"[{spellings}].exists(f, a == f || a.startsWith(f + '='))"


def cel_no_rendered_flags_rule(kind: EngineKind) -> str:
    """CEL over spec.engine: no argument names (as `--flag` or `--flag=value`) a flag rendered for `kind`."""
    # `args` has no default in the schema, so an object without it has no such key.
    return f"self.kind != '{kind.value}' || !has(self.args) || !self.args.exists(a, {_cel_sets_rendered_flag(kind)})"


def cel_no_rendered_flags_message(kind: EngineKind) -> str:
    """CEL messageExpression naming the first offending argument."""
    return (
        f"'args: ' + self.args.filter(a, {_cel_sets_rendered_flag(kind)})[0] + ' sets a flag the operator renders "
        f"for engine kind {kind.value} (model, served model name, port, parallel sizes, revision, tokenizer, "
        "multi-node bootstrap); set it through the spec instead, or use kind Custom'"
    )


@dataclass(frozen=True)
class ModelRef:
    """What an engine is told to load for one artifact URI, and the claim to mount for it (if any)."""

    path: str
    revision: str | None = None
    claim: str | None = None


def model_ref(uri: str) -> ModelRef:
    """hf://ORG/NAME[@REV] -> ORG/NAME at REV; pvc://CLAIM/PATH -> /mnt/pvc/CLAIM/PATH on that claim;
    an absolute path as it is. ValueError for anything else (the CRD refuses those at admission)."""
    if not re.match(SUPPORTED_MODEL_URI, uri):
        raise ValueError(f"{uri!r} is not a supported model URI ({SUPPORTED_MODEL_URI_HELP})")
    if uri.startswith(HF_SCHEME):
        repo, _, revision = uri[len(HF_SCHEME) :].partition("@")
        return ModelRef(repo, revision or None)
    if uri.startswith(PVC_SCHEME):
        claim, _, sub_path = uri[len(PVC_SCHEME) :].partition("/")
        path = f"{PVC_MOUNT_ROOT}/{claim}" + (f"/{sub_path.strip('/')}" if sub_path.strip("/") else "")
        return ModelRef(path, claim=claim)
    return ModelRef(uri)
