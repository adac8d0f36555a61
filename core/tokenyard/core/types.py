"""The tokenyard API types: the one source of truth for the CRDs.

Each resource is a pydantic model. The same models
- parse a resource's spec in the operator and the autoscaler (`ModelDeploymentSpec.parse(obj["spec"])`), and
- generate the CRD schemas in `charts/tokenyard/crds/` (`tokenyard.core.crdgen`), descriptions, defaults and
  CEL rules included; a unit test fails when the YAML in the chart drifts from what these models generate.

Conventions: Python names are snake_case and the API's are camelCase (an alias generator maps them); every field
has a description because `kubectl explain` prints it; a rule that spans fields is a CEL rule in
`x-kubernetes-validations` on the object that holds both fields, with a message that names the field.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from tokenyard.core import engines, labels
from tokenyard.core.engines import EngineKind


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; `field_path` makes the API server name that field in its error."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


class ApiModel(BaseModel):
    """Base of every API type: camelCase on the wire, unknown fields rejected when parsing in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    @classmethod
    def parse(cls, data: dict[str, Any] | None):
        return cls.model_validate(data or {})

    def dump(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def rules(*entries: dict[str, str]) -> ConfigDict:
    return ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        json_schema_extra={"x-kubernetes-validations": list(entries)},
    )


# Kubernetes names for the quantities we validate by pattern (the API server's own quantity type is not
# expressible in a CRD schema, so an int-or-string with a pattern is the usual substitute).
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# CEL has no bitwise operators; the powers of two up to the field's maximum are listed instead.
POWER_OF_TWO_RULE = "self in [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]"


# --------------------------------------------------------------------------- ModelDeployment: spec


class ArtifactRef(ApiModel):
    """Where an artifact lives and the digest that identifies its exact content."""

    uri: str = Field(
        min_length=1,
        max_length=2048,
        description=(
            "Location of the artifact: hf://ORG/NAME[@REVISION] (Hugging Face Hub), pvc://CLAIM/PATH (a "
            "PersistentVolumeClaim the operator mounts read-only) or an absolute path in the container. Engine "
            "kind Custom takes any URI and leaves it to the image."
        ),
    )
    digest: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9]+:[a-fA-F0-9]{16,128}$",
        description="Content digest, e.g. sha256:<hex>. Part of the revision: a new digest at the same URI is a new revision.",
    )


class ModelArtifact(ApiModel):
    """The model's identity: weights, tokenizer and the name clients use. All of it is part of the revision."""

    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="The model name clients send in OpenAI requests. Defaults to the ModelDeployment's name.",
    )
    weights: ArtifactRef = Field(description="The weights (checkpoint) to serve.")
    tokenizer: ArtifactRef | None = Field(
        default=None, description="The tokenizer, when it is not the one stored with the weights."
    )


class EnvVar(ApiModel):
    """An environment variable of the engine container (literal values only; use the pod template for secrets)."""

    name: str = Field(min_length=1, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Variable name.")
    value: str = Field(default="", description="Variable value.")


class Resources(ApiModel):
    """CPU and memory of each engine pod. GPUs come from `parallelism.gpusPerPod` and are added by the operator."""

    cpu: str | None = Field(
        default=None, pattern=QUANTITY_PATTERN, description='CPU request and limit, e.g. "8".'
    )
    memory: str | None = Field(
        default=None, pattern=QUANTITY_PATTERN, description="Memory request and limit, e.g. 64Gi."
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the ModelDeployment's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret.")
    key: str = Field(default="HF_TOKEN", min_length=1, max_length=253, description="Key in the Secret.")


class ModelCache(ApiModel):
    """A volume for the engine's Hugging Face cache (downloads survive a restart when it is a claim)."""

    model_config = rules(
        cel(
            "has(self.claimName) != has(self.sizeLimit)",
            "modelCache takes exactly one of claimName (a PersistentVolumeClaim) or sizeLimit (an emptyDir)",
        )
    )

    claim_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="A PersistentVolumeClaim in the namespace, mounted read-write (ReadWriteMany for several pods).",
    )
    size_limit: str | None = Field(
        default=None,
        pattern=QUANTITY_PATTERN,
        description="Size of an emptyDir cache instead of a claim, e.g. 200Gi.",
    )


# An argument's length and count are bounded so that the API server can price the CEL rules over them.
EngineArg = Annotated[str, Field(max_length=4096)]


class Engine(ApiModel):
    """The inference engine container run in every pod of a group (vLLM, SGLang or any OpenAI-compatible server)."""

    model_config = rules(
        *(
            {
                **cel(
                    engines.cel_no_rendered_flags_rule(kind),
                    f"args must not set a flag the operator renders for kind {kind.value} (the model, served name, "
                    "port, parallel sizes, revision, tokenizer, multi-node bootstrap): set them through the spec",
                    ".args",
                ),
                "messageExpression": engines.cel_no_rendered_flags_message(kind),
            }
            for kind in engines.RENDERED_FLAGS
        )
    )

    kind: EngineKind = Field(
        default=EngineKind.VLLM,
        description=(
            "vLLM or SGLang: the operator renders the engine's command line (model, served name, port, parallel "
            "sizes, multi-node bootstrap) and args are appended to it. Custom: the image runs its own entrypoint "
            "with args and env as given, plus the TOKENYARD_* environment."
        ),
    )
    image: str = Field(
        min_length=1, description="Container image of the engine, e.g. vllm/vllm-openai:v0.13.0."
    )
    args: list[EngineArg] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Arguments of the engine container; for vLLM and SGLang, appended after the rendered ones. The router "
            "reads the batch size from them (--max-num-seqs, SGLang's --max-running-requests) and prefers replicas "
            "with a free slot by it from the first request."
        ),
    )
    env: list[EnvVar] = Field(default_factory=list, description="Environment of the engine container.")
    port: int = Field(
        default=8000, ge=1, le=65535, description="Port of the engine's OpenAI-compatible HTTP API."
    )
    resources: Resources = Field(default_factory=Resources, description="CPU and memory per pod.")
    startup_timeout_seconds: int = Field(
        default=1800,
        ge=10,
        le=86400,
        description=(
            "How long an engine may take to load its model before its startup probe (GET /health) fails the "
            "pod. Readiness is probed only after startup. vLLM and SGLang only."
        ),
    )
    hf_token_secret: SecretKeyRef | None = Field(
        default=None,
        description="A Secret key holding a Hugging Face token, given to the engine as HF_TOKEN (gated models).",
    )
    model_cache: ModelCache | None = Field(
        default=None,
        description="A volume for the Hugging Face cache, mounted at /root/.cache/huggingface (HF_HOME).",
    )
    shared_memory_size: str | None = Field(
        default=None,
        pattern=QUANTITY_PATTERN,
        description=(
            "Size limit of the memory-backed /dev/shm that vLLM and SGLang need for their worker processes "
            "(NCCL, tensor-parallel IPC). Unset: bounded by the pod's memory only."
        ),
    )
    pod_template: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Extra pod settings merged into every pod of a group (metadata.labels, metadata.annotations, "
            "spec.tolerations, spec.volumes, ...). Part of the revision."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class Parallelism(ApiModel):
    """How one model replica (a group) is split across GPUs and pods."""

    model_config = rules(
        cel(
            "!has(self.gpusPerPod) || (self.tensor * self.pipeline) % self.gpusPerPod == 0",
            "gpusPerPod must divide the group's GPUs (tensor x pipeline)",
            ".gpusPerPod",
        ),
        cel(
            "!has(self.gpusPerPod) || self.gpusPerPod <= self.tensor * self.pipeline",
            "gpusPerPod cannot exceed the group's GPUs (tensor x pipeline)",
            ".gpusPerPod",
        ),
    )

    tensor: int = Field(
        default=1,
        ge=1,
        le=512,
        description="Tensor-parallel degree: a positive power of two.",
        json_schema_extra={
            "x-kubernetes-validations": [cel(POWER_OF_TWO_RULE, "tensor must be a positive power of two")]
        },
    )
    pipeline: int = Field(default=1, ge=1, le=64, description="Pipeline-parallel degree.")
    gpus_per_pod: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description=(
            "GPUs per pod. Defaults to tensor x pipeline capped at 8. When a group needs more GPUs than one pod has, "
            "it spans several pods: a leader (rank 0) and workers, on several nodes."
        ),
    )

    @property
    def group_gpus(self) -> int:
        return self.tensor * self.pipeline

    @property
    def pod_gpus(self) -> int:
        return self.gpus_per_pod or min(self.group_gpus, 8)

    @property
    def pods_per_group(self) -> int:
        return self.group_gpus // self.pod_gpus


class PackingStrategy(StrEnum):
    BEST_FIT = "BestFit"
    SPREAD = "Spread"


class TopologyLevel(ApiModel):
    """One level of the GPU topology and the node label that names a node's domain at that level."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Level name, e.g. nvlink, rack, zone.",
    )
    node_label: str = Field(
        min_length=1,
        max_length=316,
        description="Node label whose value names the domain, e.g. topology.kubernetes.io/zone.",
    )


def _default_topology() -> list[TopologyLevel]:
    return [TopologyLevel(name=name, node_label=label) for name, label in labels.DEFAULT_TOPOLOGY_LEVELS]


class Placement(ApiModel):
    """Where the groups go on the GPU topology."""

    model_config = rules(
        cel(
            "!has(self.required) || self.required == 'node' || self.topology.exists(l, l.name == self.required)",
            "required must be 'node' or the name of a level in placement.topology",
            ".required",
        ),
        cel(
            "!has(self.preferred) || self.preferred == 'node' || self.topology.exists(l, l.name == self.preferred)",
            "preferred must be 'node' or the name of a level in placement.topology",
            ".preferred",
        ),
    )

    topology: list[TopologyLevel] = Field(
        default_factory=_default_topology,
        min_length=1,
        max_length=8,
        description="Topology levels from innermost to outermost. Defaults to nvlink, rack, zone.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    required: str | None = Field(
        default=None,
        description="The level a whole group must fit inside (a level name, or 'node'). Unset: anywhere.",
    )
    preferred: str | None = Field(
        default=None,
        description="The level a whole group should fit inside when it can (a level name, or 'node').",
    )
    strategy: PackingStrategy = Field(
        default=PackingStrategy.BEST_FIT,
        description="BestFit packs groups to keep large blocks of GPUs free; Spread spreads groups for availability.",
    )
    gpu_product: str | None = Field(
        default=None,
        description="Only nodes whose nvidia.com/gpu.product label equals this, e.g. NVIDIA-H100-80GB-HBM3.",
    )


class PauseStep(ApiModel):
    """Wait, for a duration or (without one) until promoted."""

    duration_seconds: int | None = Field(
        default=None, ge=0, description="How long to wait; unset waits until promoted."
    )


class ShadowStep(ApiModel):
    """Send a copy of a fraction of live requests to the new revision; the copies' responses are discarded."""

    fraction: float = Field(ge=0, le=1, description="Fraction of requests copied to the new revision (0-1).")
    duration_seconds: int = Field(ge=1, description="How long the shadow step lasts.")


class AnalysisStep(ApiModel):
    """Run the rollout's analysis until it reaches a verdict or the timeout passes."""

    timeout_seconds: int = Field(
        default=600, ge=1, description="Longest wait for a verdict; then the rollout pauses."
    )


class RolloutStep(ApiModel):
    """One step of a canary rollout: exactly one of setWeight, pause, shadow or analysis."""

    model_config = rules(
        cel(
            "[has(self.setWeight), has(self.pause), has(self.shadow), has(self.analysis)].filter(x, x).size() == 1",
            "each rollout step sets exactly one of setWeight, pause, shadow, analysis",
        )
    )

    set_weight: int | None = Field(
        default=None, ge=0, le=100, description="Traffic weight (0-100) of the new revision."
    )
    pause: PauseStep | None = Field(default=None, description="Wait for a duration or until promoted.")
    shadow: ShadowStep | None = Field(
        default=None, description="Mirror a fraction of requests to the new revision."
    )
    analysis: AnalysisStep | None = Field(default=None, description="Wait for the analysis' verdict.")


class AnalysisMetricKind(StrEnum):
    ERROR_RATIO = "ErrorRatio"
    TTFT_OVER_SLO = "TTFTOverSLO"
    INTER_TOKEN_LATENCY = "InterTokenLatency"
    PROMQL = "PromQL"


class AnalysisMetric(ApiModel):
    """A metric compared between the new and the stable revision over the same time."""

    model_config = rules(
        cel(
            "self.kind != 'PromQL' || has(self.badQuery)",
            "a PromQL analysis metric needs a badQuery",
            ".badQuery",
        ),
        cel(
            "self.kind != 'PromQL' || has(self.totalQuery)",
            "a PromQL analysis metric needs a totalQuery",
            ".totalQuery",
        ),
        cel(
            "self.kind != 'TTFTOverSLO' || has(self.sloSeconds)",
            "TTFTOverSLO needs sloSeconds",
            ".sloSeconds",
        ),
    )

    name: str = Field(min_length=1, max_length=63, description="Metric name shown in the status.")
    kind: AnalysisMetricKind = Field(description="A built-in comparison, or PromQL.")
    slo_seconds: float | None = Field(
        default=None, gt=0, description="The time-to-first-token SLO for TTFTOverSLO."
    )
    bad_query: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "For PromQL: the number of bad requests of one revision over the analysis window, as one number. "
            "$revision, $window (e.g. 300s), $model and $namespace are substituted."
        ),
    )
    total_query: str | None = Field(
        default=None,
        min_length=1,
        description="For PromQL: the number of requests of one revision over the window, with the same substitutions.",
    )


class Analysis(ApiModel):
    """How the new revision is judged: a sequential test whose false-rollback rate holds however often it looks."""

    alpha: float = Field(
        default=0.05, gt=0, lt=0.5, description="Tolerated rate of rolling back a revision that is not worse."
    )
    margin: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Absolute degradation tolerated before a revision counts as worse.",
    )
    min_requests: int = Field(default=200, ge=1, description="Requests per revision before any verdict.")
    interval_seconds: int = Field(default=30, ge=1, description="How often the analysis looks.")
    metrics: list[AnalysisMetric] = Field(
        default_factory=list,
        max_length=16,
        description="Metrics compared. Empty: the error ratio alone.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )


class RolloutStrategy(StrEnum):
    ROLLING_UPDATE = "RollingUpdate"
    CANARY = "Canary"


class Rollout(ApiModel):
    """How a new revision replaces the running one."""

    model_config = rules(
        cel(
            "self.strategy != 'Canary' || (has(self.steps) && size(self.steps) > 0)",
            "a Canary rollout needs at least one step",
            ".steps",
        ),
        cel(
            "self.maxSurge > 0 || self.maxUnavailable > 0",
            "maxSurge and maxUnavailable cannot both be 0",
            ".maxSurge",
        ),
    )

    strategy: RolloutStrategy = Field(
        default=RolloutStrategy.ROLLING_UPDATE,
        description="RollingUpdate replaces groups one by one; Canary follows steps with traffic weights and analysis.",
    )
    max_surge: int = Field(default=1, ge=0, description="Groups created above replicas during an update.")
    max_unavailable: int = Field(
        default=0, ge=0, description="Groups that may be missing below replicas during an update."
    )
    steps: list[RolloutStep] = Field(
        default_factory=list, max_length=32, description="Canary steps, in order."
    )
    analysis: Analysis = Field(default_factory=Analysis, description="How the new revision is judged.")
    auto_rollback: bool = Field(default=True, description="Roll back by itself when the analysis fails.")
    drain_seconds: int = Field(
        default=30,
        ge=0,
        description=(
            "Seconds that streams in flight may take to finish on a group being removed (scale-down, an old "
            "revision); an engine's pods leave sooner once it has no request left."
        ),
    )


class ScorerWeights(ApiModel):
    """Weights of the router's scorers for this model."""

    outstanding_tokens: float = Field(
        default=1.0, ge=0, description="Weight of the outstanding-tokens (load) scorer."
    )
    # 0.25, the router's own default (router/core.py DEFAULT_WEIGHTS says what bench-router measured at 1.0).
    prefix_cache: float = Field(default=0.25, ge=0, description="Weight of the prefix-cache locality scorer.")
    # 0 by default: scraped engine metrics lag by up to a scrape behind the router's own accounting, and
    # bench-router measured them making TTFT p99 worse whenever the router sees all the traffic.
    kv_cache: float = Field(
        default=0.0,
        ge=0,
        description="Weight of the KV-cache occupancy scorer (scraped; useful when traffic bypasses the router).",
    )
    queue: float = Field(
        default=0.0,
        ge=0,
        description="Weight of the waiting-requests scorer (scraped; useful when traffic bypasses the router).",
    )


class Routing(ApiModel):
    """How the router chooses a replica for this model."""

    weights: ScorerWeights = Field(default_factory=ScorerWeights, description="Scorer weights.")
    tokenizer: str | None = Field(
        default=None,
        description="Tokenizer the router uses for prefix matching; unset matches character blocks.",
    )


class ModelDeploymentSpec(ApiModel):
    """A model served by tensor-parallel replica groups of GPU pods."""

    model_config = rules(
        cel(
            f"self.engine.kind == 'Custom' || self.model.weights.uri.matches('{engines.SUPPORTED_MODEL_URI}')",
            f"for engine kinds vLLM and SGLang the weights URI must be {engines.SUPPORTED_MODEL_URI_HELP}",
            ".model.weights.uri",
        ),
        cel(
            "self.engine.kind == 'Custom' || !has(self.model.tokenizer) || "
            f"self.model.tokenizer.uri.matches('{engines.SUPPORTED_MODEL_URI}')",
            f"for engine kinds vLLM and SGLang the tokenizer URI must be {engines.SUPPORTED_MODEL_URI_HELP}",
            ".model.tokenizer.uri",
        ),
    )

    model: ModelArtifact = Field(description="The model: weights, tokenizer and the name clients use.")
    engine: Engine = Field(description="The inference engine container.")
    parallelism: Parallelism = Field(
        default_factory=Parallelism, description="How a group is split across GPUs and pods."
    )
    replicas: int = Field(
        default=1, ge=0, le=1000, description="Number of replica groups. Changing it makes no revision."
    )
    placement: Placement = Field(
        default_factory=Placement, description="Where groups go on the GPU topology."
    )
    rollout: Rollout = Field(default_factory=Rollout, description="How new revisions replace running ones.")
    routing: Routing = Field(default_factory=Routing, description="How the router chooses a replica.")
    paused: bool = Field(
        default=False, description="Holds the rollout at its current step until set back to false."
    )

    @model_validator(mode="after")
    def _engine_contract(self) -> ModelDeploymentSpec:
        """The CRD's CEL rules again, for objects that reached the operator without them (an older CRD)."""
        kind = self.engine.kind
        if kind is EngineKind.CUSTOM:
            return self
        problems = engines.conflicting_args(kind, list(self.engine.args))
        artifacts = [("spec.model.weights.uri", self.model.weights)]
        if self.model.tokenizer is not None:
            artifacts.append(("spec.model.tokenizer.uri", self.model.tokenizer))
        for path, artifact in artifacts:
            if not re.match(engines.SUPPORTED_MODEL_URI, artifact.uri):
                problems.append(
                    f"{path}: {artifact.uri!r} is not a URI engine kind {kind.value} can load; "
                    f"use {engines.SUPPORTED_MODEL_URI_HELP}"
                )
        tokenizer = self.model.tokenizer
        if (
            kind is EngineKind.SGLANG
            and tokenizer is not None
            and tokenizer.uri.startswith(engines.HF_SCHEME)
            and "@" in tokenizer.uri
        ):
            problems.append(
                "spec.model.tokenizer.uri: SGLang has no tokenizer revision flag; drop the @REVISION or point at "
                "a local copy of the tokenizer"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


# --------------------------------------------------------------------------- ModelDeployment: status


class Condition(ApiModel):
    """A condition in the Kubernetes convention (metav1.Condition)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    type: str = Field(description="Condition type, e.g. Available.")
    status: str = Field(description="True, False or Unknown.")
    reason: str | None = Field(default=None, description="One-word CamelCase reason.")
    message: str | None = Field(default=None, description="Human-readable details.")
    last_transition_time: str | None = Field(default=None, description="When the status last changed.")
    observed_generation: int | None = Field(
        default=None, description="The generation the condition was set for."
    )


class GroupStatus(ApiModel):
    """One replica group as the operator last observed it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    index: int = Field(description="Group index.")
    revision: str = Field(description="Revision the group runs.")
    phase: str = Field(description="Pending, Placed, Ready, Failed or Terminating.")
    nodes: list[str] = Field(default_factory=list, description="Node of each rank, leader first.")
    domain: str | None = Field(
        default=None, description="The innermost topology domain holding the whole group."
    )
    ready_pods: int = Field(default=0, description="Ready pods of the group.")
    pods: int = Field(default=0, description="Pods the group needs.")
    message: str | None = Field(default=None, description="Why the group is not Ready, when it is not.")


class RevisionWeight(ApiModel):
    """The share of traffic the router sends to a revision."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    revision: str = Field(description="Revision hash.")
    weight: int = Field(ge=0, le=100, description="Traffic weight, 0-100.")


class ShadowStatus(ApiModel):
    """Requests copied to a revision whose responses are discarded."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    revision: str = Field(description="Revision that receives the copies.")
    fraction: float = Field(ge=0, le=1, description="Fraction of requests copied.")


class RevisionRecord(ApiModel):
    """A revision the deployment has run, for history and undo."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    revision: str = Field(description="Revision hash.")
    created: str | None = Field(default=None, description="When the revision first appeared.")
    template: dict[str, Any] | None = Field(
        default=None,
        description="The revisioned part of the spec, to restore on undo.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class RolloutStatus(ApiModel):
    """Where a rollout stands."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    phase: str | None = Field(
        default=None, description="Healthy, Progressing, Paused, Promoting, RollingBack or RolledBack."
    )
    step: int | None = Field(default=None, description="Index of the current step.")
    step_started: str | None = Field(default=None, description="When the current step began.")
    reason: str | None = Field(default=None, description="Why the rollout last changed phase.")
    stable_revision: str | None = Field(
        default=None, description="The revision that serves while the rollout runs."
    )
    canary_revision: str | None = Field(default=None, description="The revision being rolled out.")
    analysis: dict[str, Any] | None = Field(
        default=None,
        description="The last analysis: per metric, counts per revision, statistic and decision.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )
    state: dict[str, Any] | None = Field(
        default=None,
        description="The rollout state machine's own state (restart-safe).",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class ModelDeploymentStatus(ApiModel):
    """What the operator observed; the router reads traffic and shadow."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    observed_generation: int | None = Field(default=None, description="The generation this status describes.")
    replicas: int = Field(
        default=0, description="Groups that exist (placed or not), the scale subresource's status."
    )
    placed_replicas: int = Field(default=0, description="Groups with every pod placed on a node.")
    ready_replicas: int = Field(default=0, description="Groups with every pod Ready.")
    updated_replicas: int = Field(default=0, description="Groups at the update revision.")
    selector: str | None = Field(
        default=None, description="Label selector of the engine pods (scale subresource)."
    )
    current_revision: str | None = Field(default=None, description="The revision serving most traffic.")
    update_revision: str | None = Field(default=None, description="The revision of the current spec.")
    revision_history: list[RevisionRecord] = Field(
        default_factory=list, description="Recent revisions, newest last."
    )
    groups: list[GroupStatus] = Field(default_factory=list, description="Every group.")
    traffic: list[RevisionWeight] = Field(default_factory=list, description="Traffic weight per revision.")
    shadow: ShadowStatus | None = Field(default=None, description="Shadow copies, during a shadow step.")
    rollout: RolloutStatus | None = Field(
        default=None, description="The rollout in progress or last finished."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Available, Progressing, Degraded, InsufficientCapacity.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


# --------------------------------------------------------------------------- InferenceAutoscaler


class ScaleTargetRef(ApiModel):
    """Any resource with a scale subresource: a ModelDeployment, a LeaderWorkerSet, a Deployment."""

    api_version: str = Field(default=labels.API_VERSION, description="API version of the target.")
    kind: str = Field(default="ModelDeployment", min_length=1, description="Kind of the target.")
    name: str = Field(min_length=1, description="Name of the target, in the autoscaler's namespace.")


class SignalKind(StrEnum):
    QUEUED_TOKENS = "QueuedTokens"
    WAITING_REQUESTS = "WaitingRequests"
    TOKEN_LOAD = "TokenLoad"  # tokens waiting plus tokens running (KV-occupied), per group
    KV_CACHE_USAGE = "KVCacheUsage"
    TTFT_P95 = "TTFTP95"
    PROMQL = "PromQL"


class Signal(ApiModel):
    """A measurement with a target per group; the autoscaler keeps each signal near its target."""

    model_config = rules(
        cel("self.kind != 'PromQL' || has(self.query)", "a PromQL signal needs a query", ".query")
    )

    kind: SignalKind = Field(
        description="What is measured: QueuedTokens (prompt tokens waiting), WaitingRequests, TokenLoad (tokens "
        "waiting plus KV-occupied tokens), KVCacheUsage (mean fraction of the KV cache in use), TTFTP95 (seconds, "
        "against an SLO: never asks for fewer groups), PromQL (the query's value, a total across groups)."
    )
    target: float = Field(
        gt=0,
        description="Target value per group (tokens for QueuedTokens and TokenLoad, a fraction for KVCacheUsage, "
        "seconds for TTFTP95).",
    )
    query: str | None = Field(
        default=None,
        description="PromQL that returns the value; overrides the default for vLLM's metrics. $namespace and $target are substituted.",
    )


class ScalingRule(ApiModel):
    """A rate limit on scaling in one direction."""

    max_groups: int = Field(default=4, ge=1, description="Groups added (or removed) at most per period.")
    period_seconds: int = Field(default=60, ge=1, description="The rate limit's period.")
    stabilization_window_seconds: int = Field(
        default=0, ge=0, description="Act on the most conservative recommendation over this window."
    )


def _default_scale_up() -> ScalingRule:
    # 4 groups per 15 s, the HPA's period; chosen on the autoscaler bench's tuning trace (seed 11) and reported on
    # its evaluation traces (see BACKLOG_MAX_FACTOR in tokenyard.autoscaler.policy).
    return ScalingRule(max_groups=4, period_seconds=15)


def _default_scale_down() -> ScalingRule:
    return ScalingRule(max_groups=1, period_seconds=120, stabilization_window_seconds=300)


class AutoscalerMode(StrEnum):
    AUTO = "Auto"
    RECOMMEND_ONLY = "RecommendOnly"


class InferenceAutoscalerSpec(ApiModel):
    """Scales replica groups from queue depth, KV-cache occupancy and latency read from Prometheus."""

    model_config = rules(
        cel(
            "self.minReplicas <= self.maxReplicas", "minReplicas must not exceed maxReplicas", ".minReplicas"
        ),
        # A panic window shorter than the interval holds at most one sample: it cannot tell a burst from noise.
        cel(
            "self.panicWindowSeconds >= self.intervalSeconds",
            "panicWindowSeconds must be at least intervalSeconds (each decision takes one sample)",
            ".panicWindowSeconds",
        ),
        cel(
            "self.panicWindowSeconds <= self.stableWindowSeconds",
            "panicWindowSeconds must not exceed stableWindowSeconds",
            ".panicWindowSeconds",
        ),
    )

    scale_target_ref: ScaleTargetRef = Field(description="The resource whose scale subresource is written.")
    min_replicas: int = Field(default=1, ge=0, description="Fewest groups.")
    max_replicas: int = Field(ge=1, le=1000, description="Most groups.")
    mode: AutoscalerMode = Field(
        default=AutoscalerMode.AUTO,
        description="Auto writes the scale; RecommendOnly only publishes the recommendation.",
    )
    signals: list[Signal] = Field(
        default_factory=lambda: [Signal(kind=SignalKind.QUEUED_TOKENS, target=2000)],
        min_length=1,
        max_length=8,
        description="Signals with targets; the largest recommendation wins.",
    )
    interval_seconds: int = Field(
        default=5, ge=1, description="How often to decide (and sample every signal)."
    )
    stable_window_seconds: int = Field(default=60, ge=1, description="Window averaged for normal decisions.")
    panic_window_seconds: int = Field(
        default=10,
        ge=1,
        description="Short window that can scale up fast in a burst; at least intervalSeconds.",
    )
    panic_threshold: float = Field(
        default=2.0, gt=1, description="Panic when the short window asks this many times the current groups."
    )
    tolerance: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="No action while every signal is within this fraction of its target.",
    )
    cold_start_seconds: int = Field(
        default=120,
        ge=0,
        description="Time for a new group to load its model; scale this far ahead of the trend.",
    )
    stale_after_seconds: int = Field(
        default=60, ge=1, description="Samples older than this count as missing."
    )
    spare_groups: int = Field(
        default=0,
        ge=0,
        description=(
            "Burst reserve: groups' worth of load added to what each total signal (TokenLoad, QueuedTokens, "
            "WaitingRequests, PromQL) asks for, so that a burst arriving faster than coldStartSeconds finds "
            "capacity already serving. 0: none."
        ),
    )
    scale_up: ScalingRule = Field(default_factory=_default_scale_up, description="Scale-up rate limit.")
    scale_down: ScalingRule = Field(
        default_factory=_default_scale_down, description="Scale-down rate limit and stabilisation."
    )


class SignalStatus(ApiModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    name: str | None = Field(
        default=None,
        description="The signal's name: its kind, with its index in spec.signals when a kind repeats.",
    )
    kind: str = Field(description="Signal kind.")
    value: float | None = Field(default=None, description="Last value; unset when there was no data.")
    target: float | None = Field(default=None, description="Target value per group.")
    sampled: str | None = Field(default=None, description="When the value was read.")


class ScalingDecisionStatus(ApiModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    direction: str = Field(description="Up, Down or Hold.")
    desired: int = Field(description="Desired groups.")
    reason: str = Field(description="Why.")
    time: str | None = Field(default=None, description="When the decision was made.")


class InferenceAutoscalerStatus(ApiModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    observed_generation: int | None = Field(default=None, description="The generation this status describes.")
    current_replicas: int | None = Field(default=None, description="Groups the target has.")
    desired_replicas: int | None = Field(default=None, description="Groups the autoscaler wants.")
    signals: list[SignalStatus] = Field(default_factory=list, description="Last value of each signal.")
    last_decision: ScalingDecisionStatus | None = Field(default=None, description="The last decision.")
    last_scale_time: str | None = Field(default=None, description="When the target was last scaled.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="AbleToScale, ScalingActive, ScalingLimited.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
