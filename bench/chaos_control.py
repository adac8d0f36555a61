"""Chaos for the control side around the operator: Prometheus and the API server taken away under the
autoscaler, the canary analysis, the router's discovery and the simulator's pod runner.

`bench/chaos_operator.py` runs these after its operator kills, on the same DevCluster, through a
`ControlStack`: a real Prometheus (scraping the engines through Kubernetes service discovery and the
router's metrics), the simulator's pod runner serving every engine pod on its pod IP, one router discovering
the stack's namespace, and the autoscaler. Scenarios:

* ``prometheus-autoscaler``: Prometheus stopped; once the autoscaler says it has no data, a person scales
  the idle ModelDeployment up to 3 groups by hand (idle engines: with data the autoscaler would take it back
  to 1). Counted while Prometheus is down: scale-downs (must be 0). Then Prometheus is started again on the
  same port and data folder, and the autoscaler must scale down again (time from Prometheus back). Also
  reported: the decisions it wrote while Prometheus was down (holding was a decision, not a stalled loop),
  and whether its scale-down came before Prometheus had scraped the engine again, that is, on the samples
  from before the outage, which Prometheus serves for its 5-minute lookback after a restart.
* ``prometheus-canary``: a canary rollout under client load through the router, good and bad revisions in
  turn (a bad one fails half of its requests). Prometheus is stopped once the rollout reaches its analysis
  step; counted while it is down: rollbacks and promotions (must be 0: the analysis cannot judge). Then
  Prometheus returns and the rollout must end as the revision deserves (good: promoted, bad: rolled back),
  time from Prometheus back.
* ``apiserver-restart``: the kube-apiserver stopped for a few seconds and started again on the same port
  (etcd and every client keep running), then one new change: the InferenceAutoscaler's minReplicas raised
  by one. The chain of reactions is timed from the API server being back: the autoscaler writes the scale,
  the operator creates the group's pod, the pod runner serves it on its pod IP, the router lists it. Each
  component's own lag (from the reaction before it) must stay under ``RESUME_BOUND_SECONDS``, and no
  component may have been restarted (same pid, still alive).

The pure part (counting over sampled series, the verdict and the exit code) is tested in
`tests/unit/bench/test_chaos_verdict.py`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kubernetes import client  # noqa: E402
from tokenyard.core import labels  # noqa: E402
from tokenyard.devcluster.cluster import free_port  # noqa: E402

from tests.integration.conftest import (  # noqa: E402
    ManagedProcess,
    engine_scrape_config,
    poll_until,
    prometheus_process,
    prometheus_query,
    sim_pods_process,
)

# What must be zero in every scenario's figures for the run to pass (the keys each scenario reports).
MUST_BE_ZERO = (
    "duplicate_trials",
    "orphan_pods",
    "below_bound_samples",
    "timeouts",
    "outcomes_against_analysis",
    "scale_downs_on_missing_data",
    "rollbacks_on_missing_data",
    "promotions_on_missing_data",
    "not_acting_after_return",
    "not_resumed",
    "component_restarts",
)

SAMPLE_SECONDS = 0.2
# A decision the operator took from data read just before Prometheus went away may land this much later.
DECISION_GRACE_SECONDS = 1.0
OUTAGE_SECONDS = 12.0  # how long Prometheus stays down: several autoscaler passes and analysis looks
ACT_AGAIN_TIMEOUT_SECONDS = 120.0
RESUME_BOUND_SECONDS = 30.0  # a component's own lag after the API server is back
RESUME_TIMEOUT_SECONDS = 120.0
ROLLBACK_PHASES = frozenset({"RollingBack", "RolledBack"})
PROMOTION_PHASES = frozenset({"Promoting", "Healthy"})


# ---------------------------------------------------------------------------------------------- pure core
Samples = Sequence[tuple[float, Any]]


def decreases_between(samples: Samples, start: float, end: float) -> int:
    """How often a sampled count went down, counting the steps whose later sample is in [start, end)."""
    return sum(
        1
        for (_, before), (t, after) in zip(samples, samples[1:], strict=False)
        if start <= t < end and before is not None and after is not None and after < before
    )


def changes_between(samples: Samples, start: float, end: float) -> int:
    """How often a sampled value changed, counting the steps whose later sample is in [start, end)."""
    return sum(
        1
        for (_, before), (t, after) in zip(samples, samples[1:], strict=False)
        if start <= t < end and after != before
    )


def entries_between(samples: Samples, states: Iterable[str], start: float, end: float) -> int:
    """How often a sampled state entered one of `states` from outside them, at a sample in [start, end)."""
    wanted = frozenset(states)
    return sum(
        1
        for (_, before), (t, after) in zip(samples, samples[1:], strict=False)
        if start <= t < end and after in wanted and before not in wanted
    )


def rollout_outcome(phase: str, current_revision: str | None, update_revision: str | None) -> str | None:
    """Where a rollout ended, from its status: "promoted", "rolled-back", or None while it has not."""
    if phase == "Healthy" and current_revision == update_revision:
        return "promoted"
    if phase == "RolledBack" and current_revision != update_revision:
        return "rolled-back"
    return None


def outcome_follows_analysis(outcome: str | None, decision: str | None) -> bool:
    """A finished rollout went where its analysis said: promoted on Pass, rolled back on Fail."""
    return (outcome, decision) in (("promoted", "Pass"), ("rolled-back", "Fail"))


def verdict(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every must-be-zero figure that is not zero, as "scenario: key = value" (empty: the run passes)."""
    return [
        f"{scenario}: {key} = {figures[key]}"
        for scenario, figures in results.items()
        for key in MUST_BE_ZERO
        if figures.get(key)
    ]


def exit_code(failures: Sequence[str], errors: Sequence[str] = ()) -> int:
    """0 when nothing must-be-zero was lost and no scenario broke down, 1 otherwise."""
    return 1 if failures or errors else 0


def seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def show(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f}s"


# ---------------------------------------------------------------------------------------------- adapters
class Sampler:
    """Reads a value every `SAMPLE_SECONDS` on a thread, keeping (monotonic time, value); a read that raises
    (the API server away) costs one sample, not the scenario."""

    def __init__(self, read: Callable[[], Any], interval: float = SAMPLE_SECONDS):
        self.read, self.interval = read, interval
        self.samples: list[tuple[float, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-sampler")

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.samples.append((time.monotonic(), self.read()))
            except Exception:  # noqa: BLE001 - see the class comment
                pass
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def http_json(url: str, timeout: float = 3.0, raw: bool = False) -> Any:
    """The JSON body of a GET (raw: the body as bytes), an exception for anything but a 2xx."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body = response.read()
    return body if raw else json.loads(body)


def condition(obj: Mapping, kind: str) -> Mapping:
    return {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}.get(kind, {})


@dataclass
class ControlStack:
    """Prometheus (restartable on the same port and data), the pod runner, one router and the autoscaler,
    around a namespace of their own. Prometheus comes first (`start_prometheus`: the operator's analysis needs
    its URL), the rest with `start_components`; `stop` stops what it started, by pid."""

    cluster: Any
    folder: Path
    namespace: str
    prometheus: Any = None
    prometheus_url: str = ""
    router_url: str = ""
    router_metrics_port: int = 0
    processes: dict[str, Any] = field(default_factory=dict)

    def start_prometheus(self) -> None:
        self.router_metrics_port = free_port()
        router_job = {
            "job_name": "router",
            "static_configs": [{"targets": [f"127.0.0.1:{self.router_metrics_port}"]}],
        }
        self.prometheus, self.prometheus_url = prometheus_process(
            self.folder, [engine_scrape_config(self.cluster), router_job]
        )
        self.processes["prometheus"] = self.prometheus

    def start_components(self) -> None:
        """The pod runner, the router (discovering `namespace`) and the autoscaler."""
        kubeconfig = str(self.cluster.kubeconfig)
        router_port = free_port()
        self.router_url = f"http://127.0.0.1:{router_port}"
        self.processes["sim-pods"] = sim_pods_process(
            self.cluster.kubeconfig, self.folder / "sim-pods.log", time_scale=0.02
        ).start()
        self.processes["router"] = ManagedProcess(
            ["tokenyard.router", "--kubeconfig", kubeconfig, "--namespace", self.namespace,
             "--port", str(router_port), "--grpc-port", "-1", "--metrics-port", str(self.router_metrics_port)],
            self.folder / "router.log",
        ).start()  # fmt: skip
        self.processes["autoscaler"] = ManagedProcess(
            ["tokenyard.autoscaler", "--prometheus-url", self.prometheus_url, "--kubeconfig", kubeconfig,
             "--interval", "1", "--metrics-host", "127.0.0.1", "--metrics-port", "0",
             "--lease-namespace", self.namespace],
            self.folder / "autoscaler.log",
        ).start()  # fmt: skip

    def stop(self) -> None:
        for process in reversed(list(self.processes.values())):
            process.stop()

    def stop_prometheus(self) -> float:
        self.prometheus.stop()
        return time.monotonic()

    def restart_prometheus(self) -> float:
        self.prometheus.start()
        poll_until(lambda: http_json(f"{self.prometheus_url}/-/ready", raw=True), 60, what="Prometheus again")
        return time.monotonic()

    def router_replicas(self, model: str) -> int:
        models = http_json(f"{self.router_url}/v1/models")["data"]
        return next((m["replicas"] for m in models if m["id"] == model), 0)


class Objects:
    """The stack namespace's ModelDeployments and InferenceAutoscalers, through the admin client."""

    def __init__(self, cluster, namespace: str):
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(cluster.api())
        self.core = client.CoreV1Api(cluster.api())

    def _args(self, plural: str) -> tuple:
        return (labels.GROUP, labels.VERSION, self.namespace, plural)

    def create(self, plural: str, body: dict) -> None:
        self.custom.create_namespaced_custom_object(*self._args(plural), body)

    def get(self, plural: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(*self._args(plural), name)

    def patch(self, plural: str, name: str, body: dict) -> None:
        self.custom.patch_namespaced_custom_object(*self._args(plural), name, body)

    def engine_pods(self, deployment: str) -> list:
        selector = f"{labels.COMPONENT}={labels.COMPONENT_ENGINE},{labels.MODEL_DEPLOYMENT}={deployment}"
        return self.core.list_namespaced_pod(self.namespace, label_selector=selector).items


def idle_deployment(name: str, replicas: int) -> dict:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            # a model the simulator has a preset for
            "model": {"servedModelName": name, "weights": {"uri": "hf://meta-llama/Llama-3.1-8B"}},
            "engine": {"image": "vllm/vllm-openai:v0.13.0"},
            "parallelism": {"tensor": 1},
            "replicas": replicas,
        },
    }


def autoscaler_for(name: str, min_replicas: int, max_replicas: int, waiting_target: float) -> dict:
    return {
        "apiVersion": labels.API_VERSION,
        "kind": "InferenceAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"name": name},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "intervalSeconds": 1,
            "stableWindowSeconds": 3,
            "panicWindowSeconds": 2,
            "signals": [{"kind": "WaitingRequests", "target": waiting_target}],
            "scaleUp": {"maxGroups": 4, "periodSeconds": 1},
            "scaleDown": {"maxGroups": 4, "periodSeconds": 1, "stabilizationWindowSeconds": 3},
            "coldStartSeconds": 0,
        },
    }


def wait_ready_groups(objects: Objects, name: str, replicas: int, timeout: float = 120.0) -> None:
    poll_until(
        lambda: (objects.get("modeldeployments", name).get("status") or {}).get("readyReplicas") == replicas,
        timeout,
        what=f"{replicas} ready groups of {name}",
    )


# ---------------------------------------------------------------------------------------------- scenarios
def autoscaled_idle_target(
    stack: ControlStack, objects: Objects, name: str, max_replicas: int, waiting_target: float
) -> None:
    """One idle group of `name` served by the simulator and scraped by Prometheus, and an InferenceAutoscaler
    (minReplicas 1) that has read its data once."""
    objects.create("modeldeployments", idle_deployment(name, 1))
    wait_ready_groups(objects, name, 1)
    poll_until(
        lambda: prometheus_query(
            stack.prometheus_url,
            f'vllm:num_requests_waiting{{namespace="{stack.namespace}",model_deployment="{name}"}}',
        ),
        60,
        what=f"Prometheus to scrape the engine of {name}",
    )
    objects.create("inferenceautoscalers", autoscaler_for(name, 1, max_replicas, waiting_target))
    poll_until(
        lambda: condition(objects.get("inferenceautoscalers", name), "ScalingActive").get("status") == "True",
        60,
        what=f"the autoscaler reading the data of {name}",
    )


def prometheus_outage_under_autoscaler(stack: ControlStack, trials: int, log: Callable[[str], None]) -> dict:
    name = "scaled"
    objects = Objects(stack.cluster, stack.namespace)
    autoscaled_idle_target(stack, objects, name, max_replicas=3, waiting_target=2)

    def scaling_active() -> str | None:
        return condition(objects.get("inferenceautoscalers", name), "ScalingActive").get("status")

    def replicas() -> int:
        return objects.get("modeldeployments", name)["spec"]["replicas"]

    def replicas_and_decision() -> tuple[int, str | None]:
        decision = (objects.get("inferenceautoscalers", name).get("status") or {}).get("lastDecision") or {}
        return replicas(), decision.get("time")

    rows = []
    for i in range(trials):
        row: dict[str, Any] = {"notes": [], "on_pre_outage_data": False}
        with Sampler(replicas_and_decision) as sampled:
            stopped_wall, stopped_at = time.time(), stack.stop_prometheus()
            noticed = poll_until(
                lambda: scaling_active() == "False" and time.monotonic(), 60, what="ScalingActive=False"
            )
            row["noticed_s"] = noticed - stopped_at
            # A person scales up while the data is missing: the idle engines would have it back at 1 with data.
            objects.patch("modeldeployments", name, {"spec": {"replicas": 3}})
            scaled_at = time.monotonic()
            time.sleep(max(0.0, stopped_at + OUTAGE_SECONDS - time.monotonic()))
            back_at = stack.restart_prometheus()
            row["act_again_s"] = None
            try:
                poll_until(lambda: replicas() < 3, ACT_AGAIN_TIMEOUT_SECONDS, what="a scale-down with data")
                row["act_again_s"] = time.monotonic() - back_at
                # Had Prometheus scraped the engine since it came back? If not, the scale-down read the last
                # samples from before the outage (Prometheus answers them for 5 minutes, its lookback).
                newest = prometheus_query(
                    stack.prometheus_url,
                    f'max(timestamp(vllm:num_requests_waiting{{namespace="{stack.namespace}",'
                    f'model_deployment="{name}"}}))',
                )
                row["on_pre_outage_data"] = bool(newest) and float(newest[0]["value"][1]) < stopped_wall
            except TimeoutError as e:
                row["notes"].append(str(e))
        counts = [(t, n) for t, (n, _) in sampled.samples]
        decisions = [(t, d) for t, (_, d) in sampled.samples]
        row["scale_downs_on_missing_data"] = decreases_between(counts, stopped_at, back_at)
        # Each pass while down writes a decision (its time changes): holding was a choice, not a stalled loop.
        row["decisions_while_down"] = changes_between(decisions, scaled_at, back_at)
        rows.append(row)
        log(
            f"  prometheus-autoscaler #{i + 1}: no-data noticed {row['noticed_s']:.2f}s, "
            f"scale-downs while down {row['scale_downs_on_missing_data']} (in {row['decisions_while_down']} "
            f"decisions after the manual scale-up), scaled down again "
            f"{show(row['act_again_s'])} after Prometheus was back"
            + (
                " on samples from before the outage (no fresh scrape yet)"
                if row["on_pre_outage_data"]
                else ""
            )
            + (f" [{'; '.join(row['notes'])}]" if row["notes"] else "")
        )
    acts = [r["act_again_s"] for r in rows if r["act_again_s"] is not None]
    return {
        "trials": trials,
        "outage_seconds": OUTAGE_SECONDS,
        "scale_downs_on_missing_data": sum(r["scale_downs_on_missing_data"] for r in rows),
        "not_acting_after_return": sum(1 for r in rows if r["act_again_s"] is None),
        "decisions_while_down": sum(r["decisions_while_down"] for r in rows),
        # Reported, not judged: the autoscaler does not look at how old the samples behind a reading are.
        "scale_downs_on_pre_outage_data": sum(1 for r in rows if r["on_pre_outage_data"]),
        "no_data_noticed_max_seconds": seconds(max(r["noticed_s"] for r in rows)) if rows else None,
        "act_again_max_seconds": seconds(max(acts)) if acts else None,
    }


def canary_rollout(weight: int = 50, min_requests: int = 100, window_s: int = 30) -> dict:
    """The rollout of the canary scenarios: one weight step, then an analysis of the router's metrics, looking
    every 2 s. The margin is wide (10 points) because a bad revision here fails half its requests and the
    router soon ejects its failing replicas, so its share of requests is small: the analysis rolls back only
    once 5 bad canary requests are expected under the margin, which at 2 points took a minute of load."""
    return {
        "strategy": "Canary",
        "drainSeconds": 2,
        "analysis": {"minRequests": min_requests, "alpha": 0.05, "margin": 0.1, "intervalSeconds": 2},
        "steps": [{"setWeight": weight}, {"analysis": {"timeoutSeconds": window_s}}],
    }


def canary_env(trial: int, bad: bool) -> list[dict]:
    """A new revision per trial (the environment is part of the revision hash); a bad one fails half."""
    env = [{"name": "CHAOS_TRIAL", "value": str(trial)}]
    return env + ([{"name": labels.ENV_SIM_ERROR_RATE, "value": "0.5"}] if bad else [])


def rollout_view(obj: Mapping) -> tuple[str | None, str | None]:
    rollout = (obj.get("status") or {}).get("rollout") or {}
    return rollout.get("phase"), (rollout.get("analysis") or {}).get("decision")


def prometheus_outage_under_canary(
    stack: ControlStack,
    get: Callable[[], dict],
    update: Callable[[dict], None],
    trials: int,
    first_trial: int,
    log: Callable[[str], None],
) -> dict:
    """`get`/`update` read and patch the canary ModelDeployment (running, under load through the router)."""
    rows = []
    for i in range(trials):
        bad = i % 2 == 1
        row: dict[str, Any] = {"bad": bad, "notes": []}
        before = (get().get("status") or {}).get("updateRevision")
        update({"engine": {"env": canary_env(first_trial + i, bad)}})

        def at_analysis(before: str | None = before) -> bool:
            obj = get()
            status = obj.get("status") or {}
            rollout = status.get("rollout") or {}
            return status.get("updateRevision") != before and rollout.get("step") == 1

        with Sampler(lambda: rollout_view(get())[0]) as sampled:
            try:
                poll_until(at_analysis, 120, interval=0.1, what="the analysis step")
            except TimeoutError as e:
                row["notes"].append(str(e))
            stopped_at = stack.stop_prometheus()
            phase_at_stop = rollout_view(get())[0]
            paused = poll_until(
                lambda: (
                    (get()["status"].get("rollout") or {}).get("phase")
                    in ("Paused", *ROLLBACK_PHASES, "Healthy")
                    and time.monotonic()
                ),
                60,
                what="the rollout to pause",
            )
            row["paused_after_s"] = paused - stopped_at
            row["paused_reason"] = ((get()["status"].get("rollout") or {}).get("state") or {}).get(
                "pauseReason"
            )
            time.sleep(max(0.0, stopped_at + OUTAGE_SECONDS - time.monotonic()))
            back_at = stack.restart_prometheus()
            outcome, row["act_again_s"] = None, None
            try:
                obj = poll_until(
                    lambda: (
                        (o := get())
                        and rollout_outcome(
                            rollout_view(o)[0],
                            o["status"].get("currentRevision"),
                            o["status"].get("updateRevision"),
                        )
                        and o
                    ),
                    ACT_AGAIN_TIMEOUT_SECONDS,
                    interval=0.2,
                    what="the rollout to finish",
                )
                status = obj["status"]
                outcome = rollout_outcome(
                    rollout_view(obj)[0], status.get("currentRevision"), status.get("updateRevision")
                )
                row["decision"] = rollout_view(obj)[1]
                row["act_again_s"] = time.monotonic() - back_at
            except TimeoutError as e:
                row["notes"].append(f"{e}; rollout {get()['status'].get('rollout')}")
        # A decision already taken when Prometheus went away (the phase had left the analysis) is not counted.
        decided_before = phase_at_stop in ROLLBACK_PHASES or phase_at_stop in PROMOTION_PHASES
        window = (stopped_at + DECISION_GRACE_SECONDS, back_at)
        row["decided_before_outage"] = decided_before
        row["rollbacks_on_missing_data"] = (
            0 if decided_before else entries_between(sampled.samples, ROLLBACK_PHASES, *window)
        )
        row["promotions_on_missing_data"] = (
            0 if decided_before else entries_between(sampled.samples, PROMOTION_PHASES, *window)
        )
        row["outcome"] = outcome
        row["expected"] = outcome == ("rolled-back" if bad else "promoted")
        rows.append(row)
        log(
            f"  prometheus-canary #{i + 1} ({'bad' if bad else 'good'} revision): paused "
            f"{row['paused_after_s']:.2f}s after the stop ({row['paused_reason']}), rollbacks while down "
            f"{row['rollbacks_on_missing_data']}, promotions while down {row['promotions_on_missing_data']}, "
            f"then {outcome} ({row.get('decision')}) {show(row['act_again_s'])} after Prometheus was back"
            + (" [decided before the outage]" if decided_before else "")
            + (f" [{'; '.join(row['notes'])}]" if row["notes"] else "")
        )
    acts = [r["act_again_s"] for r in rows if r["act_again_s"] is not None]
    return {
        "trials": trials,
        "bad_revisions": sum(1 for r in rows if r["bad"]),
        "outage_seconds": OUTAGE_SECONDS,
        "decided_before_outage": sum(1 for r in rows if r["decided_before_outage"]),
        "rollbacks_on_missing_data": sum(r["rollbacks_on_missing_data"] for r in rows),
        "promotions_on_missing_data": sum(r["promotions_on_missing_data"] for r in rows),
        "paused_inconclusive": sum(1 for r in rows if r["paused_reason"] == "AnalysisInconclusive"),
        "not_acting_after_return": sum(1 for r in rows if r["act_again_s"] is None),
        "outcomes_against_analysis": sum(
            1 for r in rows if r["outcome"] and not outcome_follows_analysis(r["outcome"], r.get("decision"))
        ),
        "outcomes_as_deserved": sum(1 for r in rows if r["expected"]),
        "act_again_max_seconds": seconds(max(acts)) if acts else None,
    }


# What each reaction in the chain after the minReplicas change follows: "back" is the API server being ready
# again, "pod-bound" kube-scheduler binding the new pod, "pod-ready" kwok marking it Ready (those two are not
# ours: timed for comparison, not judged).
TRIGGERS = {
    "autoscaler": "back",
    "operator": "autoscaler",
    "pod-bound": "operator",
    "pod-ready": "pod-bound",
    "sim-pods": "pod-ready",
    "router": "pod-ready",
}
COMPONENTS = ("autoscaler", "operator", "sim-pods", "router")
OTHERS = ("pod-bound", "pod-ready")


def own_lags(reacted: Mapping[str, float], triggers: Mapping[str, str] = TRIGGERS) -> dict[str, float]:
    """Each reaction's delay after its trigger, for the reactions whose trigger was seen too. Both are sampled
    by the same poll, so a reaction seen in the same poll as its trigger counts 0, never less."""
    return {
        k: max(0.0, reacted[k] - reacted[t]) for k, t in triggers.items() if k in reacted and t in reacted
    }


def apiserver_restart(
    stack: ControlStack, operator, trials: int, down_seconds: Callable[[], float], log: Callable[[str], None]
) -> dict:
    """`operator` is the operator's ManagedProcess (its pid must not change); `down_seconds()` draws how long
    the API server stays down."""
    name = "watched"
    objects = Objects(stack.cluster, stack.namespace)
    # A WaitingRequests target no idle engine reaches: only minReplicas moves the count.
    autoscaled_idle_target(stack, objects, name, max_replicas=1 + trials, waiting_target=1000)
    poll_until(lambda: stack.router_replicas(name) == 1, 60, what="the router to list the first replica")
    processes = {
        **{k: stack.processes[k] for k in ("autoscaler", "sim-pods", "router")},
        "operator": operator,
    }

    def serving(pod) -> bool:
        port = next(p.container_port for c in pod.spec.containers for p in c.ports or () if p.name == "http")
        with urllib.request.urlopen(f"http://{pod.status.pod_ip}:{port}/health", timeout=1) as response:
            return response.status == 200

    def pod_ready(pod) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())

    rows = []
    for i in range(trials):
        wanted = 2 + i
        pids = {k: p.proc.pid for k, p in processes.items()}
        down = down_seconds()
        stack.cluster.restart_apiserver(down_seconds=down)
        reacted: dict[str, float] = {"back": time.monotonic()}
        poll_until(
            lambda wanted=wanted: (
                objects.patch("inferenceautoscalers", name, {"spec": {"minReplicas": wanted}}) or True
            ),
            30,
            what="the minReplicas change",
        )

        def newest_pod(wanted: int = wanted):
            pods = [p for p in objects.engine_pods(name) if not p.metadata.deletion_timestamp]
            return next(
                (p for p in pods if p.metadata.labels.get(labels.GROUP_INDEX) == str(wanted - 1)), None
            )

        checks = {
            "autoscaler": lambda wanted=wanted: (
                objects.get("modeldeployments", name)["spec"]["replicas"] >= wanted
            ),
            "operator": lambda: newest_pod() is not None,
            "pod-bound": lambda: bool(newest_pod().spec.node_name),
            "pod-ready": lambda: pod_ready(newest_pod()),
            "sim-pods": lambda: serving(newest_pod()),
            "router": lambda wanted=wanted: stack.router_replicas(name) >= wanted,
        }
        deadline = reacted["back"] + RESUME_TIMEOUT_SECONDS
        while len(reacted) <= len(checks) and time.monotonic() < deadline:
            for key, check in checks.items():
                try:
                    if key not in reacted and check():
                        reacted[key] = time.monotonic()
                except Exception:  # noqa: BLE001 - not there yet (no pod, no pod IP, engine not listening)
                    pass
            time.sleep(0.1)
        since_back = {k: reacted[k] - reacted["back"] for k in (*COMPONENTS, *OTHERS) if k in reacted}
        lag = own_lags(reacted)
        restarted = [k for k, p in processes.items() if not p.alive() or p.proc.pid != pids[k]]
        not_resumed = [k for k in COMPONENTS if k not in lag or lag[k] > RESUME_BOUND_SECONDS]
        if not_resumed:
            decision = (objects.get("inferenceautoscalers", name).get("status") or {}).get("lastDecision")
            log(f"    seen: {sorted(reacted)}; the autoscaler's last decision: {decision}")
        rows.append(
            {
                "down_s": down,
                "since_back": since_back,
                "lag": lag,
                "restarted": restarted,
                "not_resumed": not_resumed,
            }
        )
        log(
            f"  apiserver-restart #{i + 1}: down {down:.1f}s; reacted after the API server was back: "
            + ", ".join(f"{k} {since_back[k]:.2f}s (own lag {lag[k]:.2f}s)" for k in TRIGGERS if k in lag)
            + (f"; not resumed: {', '.join(not_resumed)}" if not_resumed else "")
            + (f"; restarted: {', '.join(restarted)}" if restarted else "")
        )
    return {
        "trials": trials,
        "down_seconds": [round(r["down_s"], 1) for r in rows],
        "resume_bound_seconds": RESUME_BOUND_SECONDS,
        "not_resumed": sum(len(r["not_resumed"]) for r in rows),
        "component_restarts": sum(len(r["restarted"]) for r in rows),
        **{
            f"{k.replace('-', '_')}_lag_max_seconds": seconds(
                max((r["lag"][k] for r in rows if k in r["lag"]), default=None)
            )
            for k in COMPONENTS
        },
        **{
            f"{k.replace('-', '_')}_since_back_max_seconds": seconds(
                max((r["since_back"][k] for r in rows if k in r["since_back"]), default=None)
            )
            for k in (*COMPONENTS, *OTHERS)
        },
    }
