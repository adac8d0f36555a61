"""Serve the engine pods of a Kubernetes cluster: one simulated engine per group leader, on the pod's IP.

The decision is pure: `engine_options_for_pod(pod, node_labels, defaults)` turns a pod (as the API server's JSON,
camelCase keys) and its node's labels into the engine to serve, or None when the pod should not be served
(not a leader, not bound, no IP yet, terminating, finished, a `--headless` or non-zero node rank worker).
`PodRunner` is the thin adapter: a thread lists and watches pods with the `kubernetes` client and hands every
event to the event loop, which starts, restarts or stops engines so that the running set matches the pods.

Where the engine comes from:
- A vLLM or SGLang pod (its engine container has a `command`, as the operator renders it): the container's
  `command + args` go through the engine's own command-line parser (`tokenyard.sim.engine_args`), exactly as the
  real engine would read them: model (and so the preset), served name, TP/PP, context length, concurrency, block
  size, prefix caching, multi-node role. The host is the pod IP; the port is the command line's, else the
  container port. An unknown flag makes the pod unservable (PodConfigError naming the pod and the flag), as it
  would crash the real engine at start.
- A Custom pod (no `command`): today's TOKENYARD_* environment (preset TOKENYARD_SIM_MODEL, TP, served name).
Either way TOKENYARD_SIM_* env is the simulator's side channel: fault knobs, time scale, and the preset when the
model's name does not tell it (TOKENYARD_SIM_MODEL).

Pod IPs in the local cluster are loopback addresses (127.0.0.0/8), so an engine bound to a pod's IP is reachable
exactly as the real pod would be.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from dataclasses import dataclass, replace
from typing import Any

from tokenyard.core import labels as L
from tokenyard.sim.engine_args import EngineArgsError, engine_options_from_argv
from tokenyard.sim.model import PresetError, gpu_preset, model_preset
from tokenyard.sim.options import EngineOptions, FaultKnobs, env_value, knobs_from_env
from tokenyard.sim.server import SimEngine

log = logging.getLogger("tokenyard.sim.pods")

DEFAULT_ENGINE_PORT = 8000
DEFAULT_MODEL_PRESET = "llama-3.1-8b"
POD_SELECTOR = f"{L.COMPONENT}={L.COMPONENT_ENGINE},{L.ROLE}={L.ROLE_LEADER}"
STOP_DRAIN_S = 5.0
WATCH_SECONDS = 5  # short watches: the watch thread notices a stop only between events or at a watch's end
REQUEST_TIMEOUT_S = 10.0  # no API call may hang the runner: a dead API server is retried, not waited on  # the pod is gone: in-flight requests get a short grace, as on a real SIGTERM


class PodConfigError(ValueError):
    """The pod asks for an engine the simulator cannot build; the message names the pod and the field (or flag)."""

    def __init__(self, message: str, flag: str | None = None) -> None:
        super().__init__(message)
        self.flag = flag


@dataclass(frozen=True)
class RunnerDefaults:
    time_scale: float = 1.0
    gpu: str = "h100-sxm"
    model: str = DEFAULT_MODEL_PRESET


def pod_key(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _engine_container(pod: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The container that exposes the port named "http" (else the first one) and that port."""
    containers = (pod.get("spec") or {}).get("containers") or []
    for container in containers:
        for port in container.get("ports") or []:
            if port.get("name") == L.ENGINE_PORT_NAME and port.get("containerPort"):
                return container, int(port["containerPort"])
    return (containers[0] if containers else {}), 0


def _env(container: dict[str, Any]) -> dict[str, str]:
    # Only literal values: valueFrom (secrets, field refs) has no meaning for the simulator.
    return {
        e["name"]: e["value"]
        for e in container.get("env") or []
        if "name" in e and e.get("value") is not None
    }


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of a container's command and args: $(VAR) becomes the container's env value when
    VAR is defined (else stays as written); $$ is a literal $."""

    def one(match: re.Match) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _VAR_REF.sub(one, arg)


def engine_options_for_pod(
    pod: dict[str, Any], node_labels: dict[str, str], defaults: RunnerDefaults = RunnerDefaults()
) -> EngineOptions | None:
    """The engine to serve for `pod`, None when there is none to serve, PodConfigError when it is misconfigured."""
    meta = pod.get("metadata") or {}
    pod_labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    if pod_labels.get(L.COMPONENT) != L.COMPONENT_ENGINE or pod_labels.get(L.ROLE) != L.ROLE_LEADER:
        return None
    if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    pod_ip = status.get("podIP")
    if not pod_ip or not spec.get("nodeName"):
        return None

    key = pod_key(pod)
    container, port = _engine_container(pod)
    env = _env(container)

    def number(name: str, kind: type, default: Any) -> Any:
        try:
            return env_value(env, name, kind, default)
        except ValueError as e:
            raise PodConfigError(f"pod {key}: {e}") from None

    gpu_label = node_labels.get(L.NODE_GPU_PRODUCT)
    gpu = defaults.gpu
    if gpu_label:
        try:
            gpu = gpu_preset(gpu_label).name
        except PresetError:
            log.warning(
                "pod %s: node %s has unknown GPU product %r, using %s", key, spec["nodeName"], gpu_label, gpu
            )
    try:
        knobs = knobs_from_env(env)
    except ValueError as e:
        raise PodConfigError(f"pod {key}: {e}") from None
    time_scale = number(L.ENV_SIM_TIME_SCALE, float, defaults.time_scale)

    command = container.get("command") or []
    if command:  # vLLM / SGLang: the rendered command line is the truth
        argv = [_expand(str(a), env) for a in [*command, *(container.get("args") or [])]]
        try:
            options = engine_options_from_argv(
                argv,
                sim_model=env.get(L.ENV_SIM_MODEL_PRESET) or None,
                gpu=gpu,
                time_scale=time_scale,
                knobs=knobs,
                default_port=port or None,
            )
        except EngineArgsError as e:
            raise PodConfigError(f"pod {key}: container {container.get('name', '?')}: {e}", e.flag) from None
        if not options.serves_http:
            return None  # a worker: it runs the model's other ranks and serves no API
        options = replace(options, host=pod_ip)
    else:  # Custom: the TOKENYARD_* environment
        if not port:
            port = number(L.ENV_ENGINE_PORT, int, DEFAULT_ENGINE_PORT)
        try:
            model = model_preset(env.get(L.ENV_SIM_MODEL_PRESET) or defaults.model).name
        except PresetError as e:
            raise PodConfigError(f"pod {key}: env {L.ENV_SIM_MODEL_PRESET}: {e}") from None
        options = EngineOptions(
            model=model,
            gpu=gpu,
            tp=number(L.ENV_TENSOR_PARALLEL, int, 1),
            host=pod_ip,
            port=port,
            served_model_name=env.get(L.ENV_SERVED_MODEL_NAME) or None,
            time_scale=time_scale,
            max_num_seqs=number(L.ENV_SIM_MAX_NUM_SEQS, int, None),
            knobs=knobs,
        )
    try:
        options.validate()
    except ValueError as e:
        raise PodConfigError(f"pod {key}: {e}") from None
    return options


class PodRunner:
    """Keeps one SimEngine per served pod. Events come from a watch thread; engines live on the event loop."""

    def __init__(
        self, kubeconfig: str | None = None, time_scale: float = 1.0, default_gpu: str = "h100-sxm"
    ) -> None:
        self._kubeconfig = kubeconfig
        self.defaults = RunnerDefaults(time_scale=time_scale, gpu=gpu_preset(default_gpu).name)
        self.engines: dict[str, tuple[EngineOptions, SimEngine]] = {}
        self._events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._stop = threading.Event()
        self._tasks: list[asyncio.Task] = []
        self._nodes: dict[str, dict[str, str]] = {}

    async def start(self) -> None:
        from kubernetes import client, config

        if self._kubeconfig:
            config.load_kube_config(config_file=self._kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        self._api = client.CoreV1Api()
        self._serializer = client.ApiClient()
        loop = asyncio.get_running_loop()
        # A daemon thread, not asyncio.to_thread: a thread of the default executor is joined when the event loop
        # shuts down, so a call hanging on a dead API server would keep the process from exiting on SIGTERM.
        self._watcher = threading.Thread(
            target=self._watch_thread, args=(loop,), name="pod-watch", daemon=True
        )
        self._watcher.start()
        self._tasks.append(asyncio.create_task(self._apply_events(), name="pod-apply"))

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(engine.stop(STOP_DRAIN_S) for _, engine in self.engines.values()))
        self.engines.clear()

    # --- the watch thread (blocking client) ---------------------------------------------------------------------
    def _watch_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        def push(kind: str, payload: Any) -> None:
            if not self._stop.is_set():  # after a stop the loop may be closed
                loop.call_soon_threadsafe(self._events.put_nowait, (kind, payload))

        while not self._stop.is_set():
            try:
                listing = self._api.list_pod_for_all_namespaces(
                    label_selector=POD_SELECTOR, _request_timeout=REQUEST_TIMEOUT_S
                )
                push("SYNC", [self._serializer.sanitize_for_serialization(p) for p in listing.items])
                w = watch.Watch()
                for event in w.stream(
                    self._api.list_pod_for_all_namespaces,
                    label_selector=POD_SELECTOR,
                    resource_version=listing.metadata.resource_version,
                    # Short watches: this thread can only notice a stop between events or at the end of a
                    # watch, and SIGTERM must stop the runner well inside a pod's 30 s grace period.
                    timeout_seconds=WATCH_SECONDS,
                    # and the client's own bound, for a server that stops answering mid-watch
                    _request_timeout=(REQUEST_TIMEOUT_S, WATCH_SECONDS + REQUEST_TIMEOUT_S),
                ):
                    if self._stop.is_set():
                        w.stop()
                        return
                    if event["type"] == "ERROR":  # typically 410 Gone: the resource version expired
                        break
                    push(event["type"], self._serializer.sanitize_for_serialization(event["object"]))
            except ApiException as e:
                if e.status != 410:  # 410 Gone: the resource version expired; relist
                    log.warning("pod watch failed (%s %s); relisting in 2 s", e.status, e.reason)
                    self._stop.wait(2.0)
            except Exception as e:  # the API server restarting, a dropped connection
                log.warning("pod watch failed (%s); relisting in 2 s", e)
                self._stop.wait(2.0)

    def _node_labels(self, node_name: str) -> dict[str, str]:
        cached = self._nodes.get(node_name)
        if cached is None:
            node = self._api.read_node(node_name, _request_timeout=REQUEST_TIMEOUT_S)
            cached = dict(node.metadata.labels or {})
            self._nodes[node_name] = cached
        return cached

    # --- applying events on the loop ------------------------------------------------------------------------
    async def _apply_events(self) -> None:
        while True:
            kind, payload = await self._events.get()
            try:
                if kind == "SYNC":
                    seen = {pod_key(p) for p in payload}
                    for key in [k for k in self.engines if k not in seen]:
                        await self._stop_engine(key, "pod is gone")
                    for pod in payload:
                        await self._apply(pod)
                elif kind == "DELETED":
                    await self._stop_engine(pod_key(payload), "pod deleted")
                else:
                    await self._apply(payload)
            except Exception:
                log.exception("could not apply a %s pod event", kind)

    async def _apply(self, pod: dict[str, Any]) -> None:
        key = pod_key(pod)
        node_name = (pod.get("spec") or {}).get("nodeName")
        try:
            node_labels = await asyncio.to_thread(self._node_labels, node_name) if node_name else {}
            wanted = engine_options_for_pod(pod, node_labels, self.defaults)
        except PodConfigError as e:
            log.error("%s; not serving it", e)
            wanted = None
        current = self.engines.get(key)
        if current is not None and (wanted is None or _differs(current[0], wanted)):
            await self._stop_engine(key, "pod changed" if wanted else "pod no longer served")
            current = None
        if wanted is None or current is not None:
            return
        engine = SimEngine(wanted)
        try:
            await engine.start()
        except OSError as e:
            log.error("pod %s: cannot listen on %s:%d: %s", key, wanted.host, wanted.port, e)
            return
        self.engines[key] = (wanted, engine)
        log.info("pod %s: serving %s on %s", key, engine.model_name, engine.url)

    async def _stop_engine(self, key: str, why: str) -> None:
        entry = self.engines.pop(key, None)
        if entry is not None:
            log.info("pod %s: stopping its engine (%s)", key, why)
            await entry[1].stop(STOP_DRAIN_S)


def _differs(running: EngineOptions, wanted: EngineOptions) -> bool:
    # Knobs are not part of the identity: a knob changed through /sim/config must survive pod status updates.
    return replace(running, knobs=FaultKnobs()) != replace(wanted, knobs=FaultKnobs())
