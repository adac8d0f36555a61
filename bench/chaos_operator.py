"""Chaos for the operator: SIGKILL it at a random point of a change and measure what was lost.

A fresh DevCluster (etcd, kube-apiserver, controller-manager, kube-scheduler, kwok) is started in a temporary
folder, the CRDs are applied and the operator runs as a child process with the integration tier's fast
settings (resync 2 s, bind timeout 5 s). Pods become Ready through kwok; no engines run. Scenarios, each in a
fresh namespace, each trial from a converged starting point:

* scale-up: replicas 1 -> 4;
* scale-down: replicas 4 -> 1;
* revision update: `spec.engine.args` changed (``--seed=N``) on 3 groups, RollingUpdate maxSurge 1,
  maxUnavailable 0.

A trial applies the change, SIGKILLs the operator after a random delay in [0, 1.5] s (seeded RNG, seed printed),
starts a fresh operator and waits for convergence (observedGeneration current, status.readyReplicas ==
replicas, every group Ready at status.updateRevision, exactly one live pod per group) or a timeout. The pod
list is sampled every ~0.2 s meanwhile. Measured per trial:

* duplicates: samples with two live pods of the same group index, rank and revision, or with more groups
  than max(replicas before, after) + maxSurge;
* orphans: engine pods after convergence that the ModelDeployment's status.groups do not include, or that are
  not owned by it;
* below-bound samples: samples with fewer Ready groups than the availability bound (replicas - maxUnavailable
  for the update; min(replicas before, after) for scaling), and the minimum seen;
* time to converge, from the change to convergence.

Run: ``.venv/bin/python bench/chaos_operator.py`` from the repository root. ``CHAOS_TRIALS`` (default 10),
``CHAOS_QUICK=1`` (3 trials), ``CHAOS_SEED`` (default: random, printed), ``CHAOS_TIMEOUT_SECONDS`` (default
120). Everything listens and dials on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client  # noqa: E402
from tokenyard.core import labels  # noqa: E402
from tokenyard.devcluster.binaries import ensure_binaries  # noqa: E402
from tokenyard.devcluster.cluster import DevCluster  # noqa: E402

from tests.integration.conftest import CRD_DIR, Kubectl, operator_process, poll_until  # noqa: E402

QUICK = os.environ.get("CHAOS_QUICK") == "1"
TRIALS = 3 if QUICK else int(os.environ.get("CHAOS_TRIALS", "10"))
SEED = (
    int(os.environ["CHAOS_SEED"]) if os.environ.get("CHAOS_SEED") else random.SystemRandom().randrange(2**31)
)
CONVERGE_TIMEOUT_SECONDS = float(os.environ.get("CHAOS_TIMEOUT_SECONDS", "120"))
SETUP_TIMEOUT_SECONDS = 120.0
# The operator settles a change in 1.5-3 s here: kills later than that land on a finished change.
KILL_DELAY_SECONDS = (0.0, 1.5)
SAMPLE_SECONDS = 0.2
GROUP, VERSION, PLURAL = labels.GROUP, labels.VERSION, "modeldeployments"
NAME = "chaos"
MAX_SURGE, MAX_UNAVAILABLE = 1, 0


@dataclass(frozen=True)
class Scenario:
    name: str
    replicas_before: int
    replicas_after: int
    update: bool  # change spec.engine.args instead of replicas

    @property
    def group_limit(self) -> int:
        return max(self.replicas_before, self.replicas_after) + MAX_SURGE

    @property
    def ready_bound(self) -> int:
        if self.update:
            return self.replicas_after - MAX_UNAVAILABLE
        return min(self.replicas_before, self.replicas_after)


SCENARIOS = [
    Scenario("scale-up", 1, 4, update=False),
    Scenario("scale-down", 4, 1, update=False),
    Scenario("revision-update", 3, 3, update=True),
]


@dataclass
class Trial:
    kill_after_s: float
    mid_change: bool = False  # the change had not converged yet when the operator was killed
    converge_s: float | None = None  # None: timed out
    duplicate_samples: int = 0
    below_bound_samples: int = 0
    min_ready_groups: int | None = None
    max_groups: int = 0
    orphans: int = 0
    samples: int = 0
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- pure helpers
def pod_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def assess(pods: list, pods_per_group: int = 1) -> tuple[bool, int, int]:
    """(duplicate member seen, groups, Ready groups) of one sample of live engine pods."""
    live = [p for p in pods if not p.metadata.deletion_timestamp]
    members: dict[tuple[str, str, str], int] = {}
    groups: dict[tuple[str, str], list] = {}
    for p in live:
        lab = p.metadata.labels or {}
        key = (lab.get(labels.GROUP_INDEX, "?"), lab.get(labels.RANK, "0"), lab.get(labels.REVISION, ""))
        members[key] = members.get(key, 0) + 1
        groups.setdefault((key[0], key[2]), []).append(p)
    duplicate = any(n > 1 for n in members.values())
    ready = sum(1 for g in groups.values() if len(g) == pods_per_group and all(pod_ready(p) for p in g))
    return duplicate, len(groups), ready


def converged(obj: dict, replicas: int, pods: list) -> bool:
    status = obj.get("status") or {}
    revision = status.get("updateRevision")
    groups = status.get("groups") or []
    live = [p for p in pods if not p.metadata.deletion_timestamp]
    return (
        status.get("observedGeneration") == obj["metadata"].get("generation")
        and status.get("readyReplicas") == replicas
        and status.get("replicas") == replicas
        and len(groups) == replicas
        and all(g.get("phase") == "Ready" and g.get("revision") == revision for g in groups)
        and len(live) == replicas
        and all(pod_ready(p) and p.metadata.labels.get(labels.REVISION) == revision for p in live)
    )


def orphans(obj: dict, pods: list) -> list[str]:
    """Engine pods that the ModelDeployment's groups do not include, or that it does not own."""
    status = obj.get("status") or {}
    known = {(str(g["index"]), g["revision"]) for g in status.get("groups") or []}
    uid = obj["metadata"]["uid"]
    found = []
    for p in pods:
        if p.metadata.deletion_timestamp:
            continue
        lab = p.metadata.labels or {}
        owned = any(o.uid == uid for o in (p.metadata.owner_references or []))
        if not owned or (lab.get(labels.GROUP_INDEX), lab.get(labels.REVISION)) not in known:
            found.append(p.metadata.name)
    return found


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# ---------------------------------------------------------------------------------------------- the harness
class Harness:
    def __init__(self, cluster: DevCluster, folder: Path):
        self.cluster = cluster
        self.custom = client.CustomObjectsApi(cluster.api())
        self.core = client.CoreV1Api(cluster.api())
        self.sampler_core = client.CoreV1Api(cluster.api())  # its own connection pool, for the sampler thread
        self.operator = operator_process(cluster.kubeconfig, folder / "operator.log")

    def new_namespace(self, scenario: str) -> str:
        ns = f"chaos-{scenario}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": ns}})
        poll_until(
            lambda: self.core.read_namespaced_service_account("default", ns),
            60,
            what=f"ServiceAccount in {ns}",
        )
        return ns

    def get(self, ns: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME)

    def pods(self, ns: str, core=None) -> list:
        selector = f"{labels.COMPONENT}={labels.COMPONENT_ENGINE},{labels.MODEL_DEPLOYMENT}={NAME}"
        return (core or self.core).list_namespaced_pod(ns, label_selector=selector).items

    def all_engine_pods(self, ns: str) -> list:
        return self.core.list_namespaced_pod(
            ns, label_selector=f"{labels.COMPONENT}={labels.COMPONENT_ENGINE}"
        ).items

    def patch(self, ns: str, spec: dict) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, NAME, {"spec": spec})

    def converged_check(self, ns: str, replicas: int):
        return lambda: converged(self.get(ns), replicas, self.pods(ns))

    def create(self, ns: str, replicas: int) -> None:
        body = {
            "apiVersion": labels.API_VERSION,
            "kind": "ModelDeployment",
            "metadata": {"name": NAME},
            "spec": {
                "model": {"weights": {"uri": "hf://org/chaos"}},
                "engine": {"image": "vllm/vllm-openai:v0.13.0", "args": ["--seed=0"]},
                "parallelism": {"tensor": 1},
                "replicas": replicas,
                "rollout": {
                    "strategy": "RollingUpdate",
                    "maxSurge": MAX_SURGE,
                    "maxUnavailable": MAX_UNAVAILABLE,
                },
            },
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        poll_until(
            self.converged_check(ns, replicas), SETUP_TIMEOUT_SECONDS, what=f"{replicas} groups in {ns}"
        )

    def trial(self, ns: str, scenario: Scenario, seed_arg: int, delay: float) -> Trial:
        # A converged starting point (the operator is alive here; this part is not measured).
        if not scenario.update:
            self.patch(ns, {"replicas": scenario.replicas_before})
            poll_until(
                self.converged_check(ns, scenario.replicas_before),
                SETUP_TIMEOUT_SECONDS,
                what="the start state",
            )
        result = Trial(kill_after_s=delay)
        stop = threading.Event()

        def record(pods: list) -> None:
            duplicate, groups, ready = assess(pods)
            result.samples += 1
            result.max_groups = max(result.max_groups, groups)
            if duplicate or groups > scenario.group_limit:
                result.duplicate_samples += 1
            if ready < scenario.ready_bound:
                result.below_bound_samples += 1
            low = result.min_ready_groups
            result.min_ready_groups = ready if low is None else min(low, ready)

        def sample() -> None:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    record(self.pods(ns, self.sampler_core))
                except Exception:  # noqa: BLE001 - an API hiccup costs one sample, not the trial
                    stop.wait(SAMPLE_SECONDS)
                    continue
                stop.wait(max(0.0, SAMPLE_SECONDS - (time.monotonic() - started)))

        sampler = threading.Thread(target=sample, daemon=True, name="chaos-sampler")
        sampler.start()
        try:
            started = time.monotonic()
            if scenario.update:
                self.patch(ns, {"engine": {"args": [f"--seed={seed_arg}"]}})
            else:
                self.patch(ns, {"replicas": scenario.replicas_after})
            time.sleep(max(0.0, started + delay - time.monotonic()))
            try:
                result.mid_change = not self.converged_check(ns, scenario.replicas_after)()
            except Exception:  # noqa: BLE001 - unknown: count it as mid-change
                result.mid_change = True
            self.operator.stop(sig=signal.SIGKILL)
            self.operator.start()
            try:
                poll_until(
                    self.converged_check(ns, scenario.replicas_after),
                    CONVERGE_TIMEOUT_SECONDS,
                    what="convergence",
                )
                result.converge_s = time.monotonic() - started
            except TimeoutError as e:
                result.notes.append(str(e))
        finally:
            stop.set()
            sampler.join(timeout=5)
        record(self.pods(ns))  # the converged (or timed-out) state itself, which the last sample may precede
        result.orphans = len(orphans(self.get(ns), self.all_engine_pods(ns)))
        return result


def summarize(scenario: Scenario, trials: list[Trial]) -> dict:
    times = [t.converge_s for t in trials if t.converge_s is not None]
    mins = [t.min_ready_groups for t in trials if t.min_ready_groups is not None]
    p50 = percentile(times, 0.5)
    return {
        "trials": len(trials),
        "kills_mid_change": sum(1 for t in trials if t.mid_change),
        "duplicate_trials": sum(1 for t in trials if t.duplicate_samples),
        "duplicate_samples": sum(t.duplicate_samples for t in trials),
        "max_groups_seen": max((t.max_groups for t in trials), default=0),
        "group_limit": scenario.group_limit,
        "orphan_pods": sum(t.orphans for t in trials),
        "below_bound_samples": sum(t.below_bound_samples for t in trials),
        "min_ready_groups": min(mins) if mins else None,
        "ready_bound_groups": scenario.ready_bound,
        "samples": sum(t.samples for t in trials),
        "timeouts": sum(1 for t in trials if t.converge_s is None),
        "converge_p50_seconds": round(p50, 2) if p50 is not None else None,
        "converge_max_seconds": round(max(times), 2) if times else None,
        "kill_after_seconds": [round(t.kill_after_s, 2) for t in trials],
    }


def fmt(value) -> str:
    return "-" if value is None else (f"{value:.2f}" if isinstance(value, float) else str(value))


def main() -> int:
    rng = random.Random(SEED)
    print(
        f"chaos_operator: seed {SEED} (CHAOS_SEED={SEED} repeats the kill delays), {TRIALS} trials per scenario"
    )
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="tokenyard-chaos-") as tmp:
        folder = Path(tmp)
        cluster = DevCluster(folder / "cluster")
        harness = None
        try:
            cluster.start()
            kubectl = Kubectl(ensure_binaries(build=False).kubectl, cluster.kubeconfig)
            kubectl.run("apply", "--server-side", "-f", str(CRD_DIR))
            kubectl.run("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
            harness = Harness(cluster, folder)
            harness.operator.start()
            for scenario in SCENARIOS:
                ns = harness.new_namespace(scenario.name)
                harness.create(ns, scenario.replicas_before)
                trials = []
                for i in range(TRIALS):
                    delay = rng.uniform(*KILL_DELAY_SECONDS)
                    t = harness.trial(ns, scenario, seed_arg=i + 1, delay=delay)
                    trials.append(t)
                    print(
                        f"  {scenario.name} #{i + 1}: kill at {delay:.2f}s"
                        f" ({'mid-change' if t.mid_change else 'after convergence'}), converged "
                        f"{fmt(t.converge_s)}s, dup samples {t.duplicate_samples}, orphans {t.orphans}, "
                        f"min ready {fmt(t.min_ready_groups)}/{scenario.ready_bound}, samples {t.samples}"
                        + (f" [{'; '.join(t.notes)}]" if t.notes else ""),
                        flush=True,
                    )
                results[scenario.name] = summarize(scenario, trials)
                harness.core.delete_namespace(ns)
        finally:
            if harness is not None:
                harness.operator.stop()
            cluster.stop()

    header = (
        "scenario",
        "trials",
        "mid-change kills",
        "duplicates",
        "orphans",
        "below-bound",
        "min-ready/bound",
        "timeouts",
        "p50 s",
        "max s",
    )
    rows = [
        (
            name,
            r["trials"],
            r["kills_mid_change"],
            f"{r['duplicate_trials']} ({r['duplicate_samples']} smp)",
            r["orphan_pods"],
            f"{r['below_bound_samples']}/{r['samples']} smp",
            f"{fmt(r['min_ready_groups'])}/{r['ready_bound_groups']}",
            r["timeouts"],
            fmt(r["converge_p50_seconds"]),
            fmt(r["converge_max_seconds"]),
        )
        for name, r in results.items()
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)))
    print(json.dumps({"bench": "chaos_operator", "seed": SEED, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
