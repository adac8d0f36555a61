"""The engine container's command line and what it needs mounted, rendered from the spec per engine kind.

Pure: a spec, a group's names and a rank in; plain Kubernetes dicts out. The flags and their sources (engine
version and documentation page) are in `tokenyard.core.engines`; this module only puts them in order:

    vLLM:   vllm serve MODEL --served-model-name S --port P --tensor-parallel-size T --pipeline-parallel-size PP
            [--revision R] [--tokenizer T [--tokenizer-revision R]]
            [--distributed-executor-backend mp --nnodes N --node-rank K --master-addr LEADER
             --master-port 29500 [--headless]]                                   (groups of several pods)
            USER ARGS
    SGLang: python3 -m sglang.launch_server --model-path MODEL --served-model-name S --host 0.0.0.0 --port P
            --tp-size T --pp-size PP --enable-metrics [--revision R] [--tokenizer-path T]
            [--nnodes N --node-rank K --dist-init-addr LEADER:5000]              (groups of several pods)
            USER ARGS
    Custom: the image's own entrypoint with the user's args.

User arguments go last; the spec's validation has already refused any that would set a rendered flag, so the
rendered values are the ones the engine runs with and nothing is silently overridden either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenyard.core import engines
from tokenyard.core.engines import EngineKind, ModelRef, model_ref
from tokenyard.core.types import ModelDeploymentSpec


@dataclass(frozen=True)
class EngineLaunch:
    """What the engine container runs and what the pod must give it for that."""

    command: list[str] | None  # None: the image's entrypoint (Custom)
    args: list[str]
    env: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class GroupRank:
    """Where one pod stands in its group: what a multi-node bootstrap needs to know."""

    rank: int
    pods: int
    leader_address: str  # DNS name of rank 0 through the group's headless Service


def render_launch(spec: ModelDeploymentSpec, served_model_name: str, member: GroupRank) -> EngineLaunch:
    kind = spec.engine.kind
    if kind is EngineKind.CUSTOM:
        return EngineLaunch(command=None, args=list(spec.engine.args))
    weights = model_ref(spec.model.weights.uri)
    tokenizer = model_ref(spec.model.tokenizer.uri) if spec.model.tokenizer else None
    if kind is EngineKind.VLLM:
        command, args = (
            list(engines.VLLM_COMMAND),
            _vllm_args(spec, served_model_name, weights, tokenizer, member),
        )
    else:
        command, args = (
            list(engines.SGLANG_COMMAND),
            _sglang_args(spec, served_model_name, weights, tokenizer, member),
        )
    volumes, mounts = _volumes(spec, [weights] + ([tokenizer] if tokenizer else []))
    return EngineLaunch(
        command=command,
        args=args + list(spec.engine.args),
        env=_env(spec),
        volumes=volumes,
        volume_mounts=mounts,
    )


def _vllm_args(
    spec: ModelDeploymentSpec, served: str, weights: ModelRef, tokenizer: ModelRef | None, member: GroupRank
) -> list[str]:
    par = spec.parallelism
    args = [
        weights.path,
        "--served-model-name", served,
        "--port", str(spec.engine.port),
        "--tensor-parallel-size", str(par.tensor),
        "--pipeline-parallel-size", str(par.pipeline),
    ]  # fmt: skip
    if weights.revision:
        args += ["--revision", weights.revision]
    if tokenizer is not None:
        args += ["--tokenizer", tokenizer.path]
        if tokenizer.revision:
            args += ["--tokenizer-revision", tokenizer.revision]
    if member.pods > 1:
        args += [
            "--distributed-executor-backend", "mp",
            "--nnodes", str(member.pods),
            "--node-rank", str(member.rank),
            "--master-addr", member.leader_address,
            "--master-port", str(engines.VLLM_MASTER_PORT),
        ]  # fmt: skip
        if member.rank > 0:
            args.append("--headless")  # workers run the model's other ranks and serve no API
    return args


def _sglang_args(
    spec: ModelDeploymentSpec, served: str, weights: ModelRef, tokenizer: ModelRef | None, member: GroupRank
) -> list[str]:
    par = spec.parallelism
    args = [
        "--model-path", weights.path,
        "--served-model-name", served,
        "--host", "0.0.0.0",  # SGLang listens on 127.0.0.1 unless told otherwise
        "--port", str(spec.engine.port),
        "--tp-size", str(par.tensor),
        "--pp-size", str(par.pipeline),
        "--enable-metrics",  # SGLang serves /metrics only with it; the router and autoscaler read them
    ]  # fmt: skip
    if weights.revision:
        args += ["--revision", weights.revision]
    if tokenizer is not None:
        args += ["--tokenizer-path", tokenizer.path]
    if member.pods > 1:
        args += [
            "--nnodes", str(member.pods),
            "--node-rank", str(member.rank),
            "--dist-init-addr", f"{member.leader_address}:{engines.SGLANG_DIST_INIT_PORT}",
        ]  # fmt: skip
    return args


def _env(spec: ModelDeploymentSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = []
    secret = spec.engine.hf_token_secret
    if secret is not None:
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}}
        )
    if spec.engine.model_cache is not None:
        env.append({"name": "HF_HOME", "value": engines.HF_CACHE_MOUNT})
    return env


def _volumes(spec: ModelDeploymentSpec, refs: list[ModelRef]) -> tuple[list[dict], list[dict]]:
    shm: dict[str, Any] = {"medium": "Memory"}
    if spec.engine.shared_memory_size:
        shm["sizeLimit"] = spec.engine.shared_memory_size
    volumes = [{"name": "dshm", "emptyDir": shm}]
    mounts = [{"name": "dshm", "mountPath": engines.SHM_MOUNT}]
    cache = spec.engine.model_cache
    if cache is not None:
        source = (
            {"persistentVolumeClaim": {"claimName": cache.claim_name}}
            if cache.claim_name
            else {"emptyDir": {"sizeLimit": cache.size_limit}}
        )
        volumes.append({"name": "model-cache", **source})
        mounts.append({"name": "model-cache", "mountPath": engines.HF_CACHE_MOUNT})
    claims = sorted({ref.claim for ref in refs if ref.claim})
    for index, claim in enumerate(claims):
        name = f"model-pvc-{index}"
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": name, "mountPath": f"{engines.PVC_MOUNT_ROOT}/{claim}", "readOnly": True})
    return volumes, mounts
