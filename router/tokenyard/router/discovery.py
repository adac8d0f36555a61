"""Where requests can go: the replicas of each served model, its traffic split and its shadow.

Two sources produce the same ``ModelView``s: Kubernetes (``models_from_cluster``, a pure function of pod and
ModelDeployment dicts as the API returns them; ``kube.py`` feeds it from watches) and static backends from
flags or a file (``parse_backend``, ``load_static_config``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml
from tokenyard.core import engines, labels


@dataclass(frozen=True)
class Endpoint:
    name: str  # pod name of the group leader, or the static backend's name
    url: str  # http://host:port, no trailing slash
    revision: str = ""


@dataclass(frozen=True)
class Shadow:
    revision: str
    fraction: float


@dataclass(frozen=True)
class ModelView:
    """Everything the router needs to route one served model name."""

    served_name: str
    endpoints: tuple[Endpoint, ...] = ()
    traffic: tuple[tuple[str, float], ...] = ()  # (revision, weight 0..100); empty = any revision
    shadow: Shadow | None = None
    weights: Mapping[str, float] | None = None  # spec.routing.weights; None = the router's defaults
    deployment: str = ""  # the ModelDeployment's namespace/name, for logs
    namespace: str = ""  # the ModelDeployment's namespace (a metric label); '' for static backends
    tokenizer: str | None = None  # spec.routing.tokenizer: how prompts are cut into blocks; None = characters
    # Requests each replica runs at once, as configured (--max-num-seqs in spec.engine.args, or the router's
    # --engine-max-num-seqs for static backends); None = not configured, learned from /metrics if it binds.
    batch_size: int | None = None


class ConfigError(ValueError):
    """Bad router configuration; the message names the flag, file or field."""


# --- Kubernetes ---------------------------------------------------------------------------------------------


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _engine_port(pod: Mapping[str, Any]) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or ():
        for port in container.get("ports") or ():
            if port.get("name") == labels.ENGINE_PORT_NAME:
                return int(port.get("containerPort"))
    return None


def _traffic(status: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    return tuple(
        (str(item["revision"]), float(item.get("weight", 0)))
        for item in status.get("traffic") or ()
        if item.get("revision")
    )


def _shadow(status: Mapping[str, Any]) -> Shadow | None:
    shadow = status.get("shadow") or None
    if not shadow or not shadow.get("revision"):
        return None
    fraction = min(1.0, max(0.0, float(shadow.get("fraction", 0))))
    return Shadow(str(shadow["revision"]), fraction) if fraction > 0 else None


def ready_leaders(pods: Iterable[Mapping[str, Any]], deployment: str) -> tuple[Endpoint, ...]:
    """Leaders of the groups of ``deployment`` whose every pod is Ready (a group is a gang: it serves only
    whole) and whose leader has an IP and an ``http`` port."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for pod in pods:
        meta_labels = (pod.get("metadata") or {}).get("labels") or {}
        if meta_labels.get(labels.COMPONENT) != labels.COMPONENT_ENGINE:
            continue
        if meta_labels.get(labels.MODEL_DEPLOYMENT) != deployment:
            continue
        key = (meta_labels.get(labels.REVISION, ""), meta_labels.get(labels.GROUP_INDEX, ""))
        groups[key].append(pod)
    endpoints = []
    for (revision, _group), members in sorted(groups.items()):
        leaders = [
            p for p in members if (p["metadata"].get("labels") or {}).get(labels.ROLE) == labels.ROLE_LEADER
        ]
        if len(leaders) != 1:
            continue
        leader = leaders[0]
        annotations = leader["metadata"].get("annotations") or {}
        try:
            group_size = int(annotations.get(labels.ANNOTATION_GROUP_SIZE, "1"))
        except ValueError:
            continue
        ready = [p for p in members if _pod_ready(p)]
        if len(ready) < group_size or len(members) < group_size or not _pod_ready(leader):
            continue
        pod_ip = (leader.get("status") or {}).get("podIP")
        port = _engine_port(leader)
        if not pod_ip or port is None:
            continue
        host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
        endpoints.append(Endpoint(leader["metadata"]["name"], f"http://{host}:{port}", revision))
    return tuple(endpoints)


def models_from_cluster(
    pods: Iterable[Mapping[str, Any]], deployments: Iterable[Mapping[str, Any]]
) -> dict[str, ModelView]:
    """Served model name -> ModelView, from the pods and ModelDeployments of one namespace."""
    pods = list(pods)
    views: dict[str, ModelView] = {}
    for deployment in deployments:
        meta = deployment.get("metadata") or {}
        spec = deployment.get("spec") or {}
        status = deployment.get("status") or {}
        name = meta.get("name", "")
        served = ((spec.get("model") or {}).get("servedModelName")) or name
        routing = spec.get("routing") or {}
        weights = routing.get("weights")
        engine = spec.get("engine") or {}
        views[served] = ModelView(
            served_name=served,
            endpoints=ready_leaders(pods, name),
            traffic=_traffic(status),
            shadow=_shadow(status),
            weights={str(k): float(v) for k, v in weights.items()} if weights else None,
            deployment=f"{meta.get('namespace', '')}/{name}",
            namespace=str(meta.get("namespace") or ""),
            tokenizer=routing.get("tokenizer") or None,
            # the operator renders vLLM unless told otherwise (the CRD's default kind)
            batch_size=engines.configured_batch_size(
                engine.get("kind") or engines.EngineKind.VLLM, list(engine.get("args") or ())
            ),
        )
    return views


# --- static backends ----------------------------------------------------------------------------------------


def parse_backend(spec: str) -> Endpoint:
    """``URL``, ``NAME=URL`` or either with ``#REVISION``: ``a=http://127.0.0.1:8001#v2``."""
    text = spec.strip()
    revision = ""
    if "#" in text:
        text, revision = text.rsplit("#", 1)
    name = ""
    if "=" in text.split("://", 1)[0]:
        name, text = text.split("=", 1)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ConfigError(f"--backend {spec!r}: expected [NAME=]http://HOST:PORT[#REVISION]")
    url = f"{parts.scheme}://{parts.netloc}"
    return Endpoint(name or parts.netloc, url, revision)


def parse_traffic(items: Iterable[str], flag: str = "--traffic") -> tuple[tuple[str, float], ...]:
    traffic = []
    for item in items:
        revision, sep, weight = item.partition("=")
        try:
            value = float(weight)
        except ValueError:
            value = -1
        if not sep or not revision or not 0 <= value <= 100:
            raise ConfigError(f"{flag} {item!r}: expected REVISION=WEIGHT with WEIGHT in 0..100")
        traffic.append((revision, value))
    return tuple(traffic)


def parse_shadow(item: str | None) -> Shadow | None:
    if not item:
        return None
    revision, sep, fraction = item.partition("=")
    try:
        value = float(fraction)
    except ValueError:
        value = -1
    if not sep or not revision or not 0 <= value <= 1:
        raise ConfigError(f"--shadow {item!r}: expected REVISION=FRACTION with FRACTION in 0..1")
    return Shadow(revision, value) if value > 0 else None


@dataclass
class StaticConfig:
    """Backends not bound to a model name (their served models are read from their /v1/models), plus the
    traffic split, shadow and scorer weights applied to every model they serve."""

    backends: list[Endpoint] = field(default_factory=list)
    traffic: tuple[tuple[str, float], ...] = ()
    shadow: Shadow | None = None
    weights: dict[str, float] | None = None
    batch_size: int | None = None  # each backend's --max-num-seqs, where the user gives it


def parse_batch_size(value: Any, source: str) -> int:
    """A configured batch size: a positive integer, else a ConfigError naming ``source``."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{source} {value!r}: expected the engines' --max-num-seqs, a positive integer")
    return int(text)


def load_static_config(path: str) -> StaticConfig:
    """A YAML file: ``backends: [URL-or-NAME=URL#REV, ...]``, ``traffic: {REV: WEIGHT}``,
    ``shadow: {revision: REV, fraction: F}``, ``routing: {weights: {...}}``, ``engine: {maxNumSeqs: N}``."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"--backends-file {path}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--backends-file {path}: expected a mapping at the top level")
    config = StaticConfig()
    for item in data.get("backends") or ():
        config.backends.append(parse_backend(str(item)))
    config.traffic = parse_traffic(f"{rev}={w}" for rev, w in (data.get("traffic") or {}).items())
    shadow = data.get("shadow")
    if shadow:
        config.shadow = parse_shadow(f"{shadow.get('revision')}={shadow.get('fraction')}")
    weights = (data.get("routing") or {}).get("weights")
    if weights:
        config.weights = {str(k): float(v) for k, v in weights.items()}
    batch_size = (data.get("engine") or {}).get("maxNumSeqs")
    if batch_size is not None:
        config.batch_size = parse_batch_size(batch_size, f"--backends-file {path}: engine.maxNumSeqs")
    return config
