"""Chaos for the operator: SIGKILL it at a random point of a change and measure what was lost.

A fresh DevCluster (etcd, kube-apiserver, controller-manager, kube-scheduler, kwok) is started in a temporary
folder, the CRDs are applied and the operator runs as a child process with the integration tier's fast
settings (resync 2 s, bind timeout 5 s). Pods become Ready through kwok; no engines run. Scenarios, each in a
fresh namespace, each trial from a converged starting point:

* scale-up: replicas 1 -> 4;
* scale-down: replicas 4 -> 1;
* revision update: `spec.engine.args` changed (``--seed=N``) on 3 groups, RollingUpdate maxSurge 1,
  maxUnavailable 0;
* canary steps: a Canary rollout of 2 groups (weight 50, then an analysis of the router's metrics in a real
  Prometheus) under client load through the router, engines served by the simulator; good and bad revisions
  (half of a bad one's requests fail) in turn, the kill at a random point of the steps. Besides the figures
  below, the rollout must end where its analysis says (promoted on Pass, rolled back on Fail) and never
  stay stuck.

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

Then the control-side scenarios of `bench/chaos_control.py` (Prometheus stopped under the autoscaler and under
a canary analysis, the API server restarted under every controller) run on the same cluster.

The run exits 1 when any must-be-zero figure (`chaos_control.MUST_BE_ZERO`: duplicates, orphans, samples
below the bound, timeouts, rollouts ending against their analysis, scale-downs, rollbacks or promotions on
missing data, components not acting again or not resuming, component restarts) is not zero, or when a
scenario broke down; it prints the failures, the table and the final JSON line either way.

Run: ``.venv/bin/python bench/chaos_operator.py`` from the repository root. ``CHAOS_TRIALS`` (default 10),
``CHAOS_QUICK=1`` (3 kill trials, 2 outage trials, 1 restart), ``CHAOS_SEED`` (default: random, printed),
``CHAOS_TIMEOUT_SECONDS`` (default 120), ``CHAOS_ONLY=canary-steps,apiserver-restart`` (a comma-separated
subset of the scenario names). Everything listens and dials on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import chaos_control as control  # noqa: E402
import pytest  # noqa: E402
from kubernetes import client  # noqa: E402
from results_io import write_results  # noqa: E402
from tokenyard.core import labels  # noqa: E402
from tokenyard.devcluster.binaries import ensure_binaries  # noqa: E402
from tokenyard.devcluster.cluster import DevCluster  # noqa: E402

from tests.integration.conftest import CRD_DIR, Kubectl, operator_process, poll_until  # noqa: E402
from tests.integration.test_rollouts_e2e import Load, deployment  # noqa: E402
from tests.integration.test_rollouts_e2e import start as start_canary  # noqa: E402

QUICK = os.environ.get("CHAOS_QUICK") == "1"
TRIALS = 3 if QUICK else int(os.environ.get("CHAOS_TRIALS", "10"))
OUTAGE_TRIALS = 2 if QUICK else 4  # good and bad revisions in turn for the canary
RESTART_TRIALS = 1 if QUICK else 3
SEED = (
    int(os.environ["CHAOS_SEED"]) if os.environ.get("CHAOS_SEED") else random.SystemRandom().randrange(2**31)
)
CONVERGE_TIMEOUT_SECONDS = float(os.environ.get("CHAOS_TIMEOUT_SECONDS", "120"))
SETUP_TIMEOUT_SECONDS = 120.0
# The operator settles a change in 1.5-3 s here: kills later than that land on a finished change.
KILL_DELAY_SECONDS = (0.0, 1.5)
# A canary rollout (weight step, analysis of ~100 requests a revision) takes about this long under the load.
CANARY_KILL_DELAY_SECONDS = (0.0, 10.0)
APISERVER_DOWN_SECONDS = (2.0, 10.0)
SAMPLE_SECONDS = 0.2
GROUP, VERSION, PLURAL = labels.GROUP, labels.VERSION, "modeldeployments"
NAME = "chaos"
CANARY_NAME = "web"  # the name `tests/integration/test_rollouts_e2e.deployment` gives
CANARY_REPLICAS = 2
MAX_SURGE, MAX_UNAVAILABLE = 1, 0


@dataclass(frozen=True)
class Scenario:
    name: str
    replicas_before: int
    replicas_after: int
    update: bool = False  # change spec.engine.args instead of replicas
    canary: bool = False  # a canary rollout of a new revision (the stack's namespace, under load)

    @property
    def group_limit(self) -> int:
        if self.canary:  # the stable groups stay until the fully grown canary is promoted
            return 2 * self.replicas_after
        return max(self.replicas_before, self.replicas_after) + MAX_SURGE

    @property
    def ready_bound(self) -> int:
        if self.canary:
            return self.replicas_after
        if self.update:
            return self.replicas_after - MAX_UNAVAILABLE
        return min(self.replicas_before, self.replicas_after)


SCENARIOS = [
    Scenario("scale-up", 1, 4),
    Scenario("scale-down", 4, 1),
    Scenario("revision-update", 3, 3, update=True),
]
CANARY = Scenario("canary-steps", CANARY_REPLICAS, CANARY_REPLICAS, canary=True)
CONTROL_SCENARIOS = ("prometheus-canary", "prometheus-autoscaler", "apiserver-restart")
ALL_SCENARIOS = (*(s.name for s in SCENARIOS), CANARY.name, *CONTROL_SCENARIOS)


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
    bad_revision: bool = False  # canary: the revision fails half of its requests
    outcome: str | None = None  # canary: "promoted" or "rolled-back"
    decision: str | None = None  # canary: the analysis' last decision
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


def converged(obj: dict, replicas: int, pods: list, revision_field: str = "updateRevision") -> bool:
    """Every group and live pod Ready at the status' `revision_field` (the current revision once a canary
    rollout has finished, which is not the spec's after a rollback)."""
    status = obj.get("status") or {}
    revision = status.get(revision_field)
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


def rollout_finished(obj: dict, previous_update_revision: str | None) -> str | None:
    """The outcome of the rollout of a revision newer than `previous_update_revision`, once it has finished."""
    status = obj.get("status") or {}
    if status.get("updateRevision") == previous_update_revision:
        return None  # the operator has not seen the change yet
    phase, _ = control.rollout_view(obj)
    return control.rollout_outcome(phase, status.get("currentRevision"), status.get("updateRevision"))


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


# bench/chaos_serving.py's scenarios, which `make chaos` runs after this script with the same CHAOS_ONLY: left
# to it here (chaos_serving checks that its runners are exactly these).
SERVING_SCENARIOS = ("router-kill", "redis-restart", "engine-crash", "engine-hang")


def selected(only: str | None) -> set[str]:
    """This script's scenarios that `CHAOS_ONLY` names (all when unset); a name neither this script nor
    chaos_serving knows is an error naming the known ones."""
    if not only:
        return set(ALL_SCENARIOS)
    names = {n.strip() for n in only.split(",") if n.strip()}
    unknown = names - set(ALL_SCENARIOS) - set(SERVING_SCENARIOS)
    if unknown:
        known = ", ".join([*ALL_SCENARIOS, *SERVING_SCENARIOS])
        raise SystemExit(f"CHAOS_ONLY: unknown scenario(s) {', '.join(sorted(unknown))}; known: {known}")
    return names & set(ALL_SCENARIOS)


# ---------------------------------------------------------------------------------------------- the harness
class Harness:
    def __init__(self, cluster: DevCluster, folder: Path, prometheus_url: str):
        self.cluster = cluster
        self.custom = client.CustomObjectsApi(cluster.api())
        self.core = client.CoreV1Api(cluster.api())
        self.sampler_core = client.CoreV1Api(cluster.api())  # its own connection pool, for the sampler thread
        self.operator = operator_process(
            cluster.kubeconfig, folder / "operator.log", "--prometheus-url", prometheus_url
        )

    def new_namespace(self, scenario: str) -> str:
        ns = f"chaos-{scenario}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": ns}})
        poll_until(
            lambda: self.core.read_namespaced_service_account("default", ns),
            60,
            what=f"ServiceAccount in {ns}",
        )
        return ns

    def get(self, ns: str, name: str = NAME) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def pods(self, ns: str, core=None, name: str = NAME) -> list:
        selector = f"{labels.COMPONENT}={labels.COMPONENT_ENGINE},{labels.MODEL_DEPLOYMENT}={name}"
        return (core or self.core).list_namespaced_pod(ns, label_selector=selector).items

    def all_engine_pods(self, ns: str, name: str | None = None) -> list:
        selector = f"{labels.COMPONENT}={labels.COMPONENT_ENGINE}"
        if name:
            selector += f",{labels.MODEL_DEPLOYMENT}={name}"
        return self.core.list_namespaced_pod(ns, label_selector=selector).items

    def patch(self, ns: str, spec: dict, name: str = NAME) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": spec})

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

    def measured_kill(self, ns: str, name: str, scenario: Scenario, result: Trial, change, settled) -> None:
        """Sample the pods of `name` while `change()` is applied, the operator is SIGKILLed `result.kill_after_s`
        later and restarted, until `settled()` (or the timeout); fill `result` in."""
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
                    record(self.pods(ns, self.sampler_core, name))
                except Exception:  # noqa: BLE001 - an API hiccup costs one sample, not the trial
                    stop.wait(SAMPLE_SECONDS)
                    continue
                stop.wait(max(0.0, SAMPLE_SECONDS - (time.monotonic() - started)))

        sampler = threading.Thread(target=sample, daemon=True, name="chaos-sampler")
        sampler.start()
        try:
            started = time.monotonic()
            change()
            time.sleep(max(0.0, started + result.kill_after_s - time.monotonic()))
            try:
                result.mid_change = not settled()
            except Exception:  # noqa: BLE001 - unknown: count it as mid-change
                result.mid_change = True
            self.operator.stop(sig=signal.SIGKILL)
            self.operator.start()
            try:
                poll_until(settled, CONVERGE_TIMEOUT_SECONDS, what="convergence")
                result.converge_s = time.monotonic() - started
            except TimeoutError as e:
                result.notes.append(str(e))
        finally:
            stop.set()
            sampler.join(timeout=5)
        record(
            self.pods(ns, name=name)
        )  # the converged (or timed-out) state itself, which the last sample may precede
        result.orphans = len(orphans(self.get(ns, name), self.all_engine_pods(ns, name)))

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
        if scenario.update:
            change = lambda: self.patch(ns, {"engine": {"args": [f"--seed={seed_arg}"]}})  # noqa: E731
        else:
            change = lambda: self.patch(ns, {"replicas": scenario.replicas_after})  # noqa: E731
        self.measured_kill(
            ns, NAME, scenario, result, change, self.converged_check(ns, scenario.replicas_after)
        )
        return result

    def canary_trial(self, ns: str, trial_no: int, bad: bool, delay: float) -> Trial:
        """A new revision (bad: half its requests fail) rolled out by canary steps; the operator killed
        `delay` s into the steps. Settled: finished (promoted or rolled back) and back to one revision."""
        result = Trial(kill_after_s=delay, bad_revision=bad)
        before = (self.get(ns, CANARY_NAME).get("status") or {}).get("updateRevision")

        def settled() -> bool:
            obj = self.get(ns, CANARY_NAME)
            return rollout_finished(obj, before) is not None and converged(
                obj, CANARY_REPLICAS, self.pods(ns, name=CANARY_NAME), revision_field="currentRevision"
            )

        def change() -> None:
            self.patch(ns, {"engine": {"env": control.canary_env(trial_no, bad)}}, name=CANARY_NAME)

        self.measured_kill(ns, CANARY_NAME, CANARY, result, change, settled)
        obj = self.get(ns, CANARY_NAME)
        result.outcome = rollout_finished(obj, before)
        result.decision = control.rollout_view(obj)[1]
        return result


def summarize(scenario: Scenario, trials: list[Trial]) -> dict:
    times = [t.converge_s for t in trials if t.converge_s is not None]
    mins = [t.min_ready_groups for t in trials if t.min_ready_groups is not None]
    p50 = percentile(times, 0.5)
    figures = {
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
    if scenario.canary:
        finished = [t for t in trials if t.outcome]
        figures.update(
            bad_revisions=sum(1 for t in trials if t.bad_revision),
            promoted=sum(1 for t in finished if t.outcome == "promoted"),
            rolled_back=sum(1 for t in finished if t.outcome == "rolled-back"),
            outcomes_against_analysis=sum(
                1 for t in finished if not control.outcome_follows_analysis(t.outcome, t.decision)
            ),
            outcomes_as_deserved=sum(
                1 for t in finished if t.outcome == ("rolled-back" if t.bad_revision else "promoted")
            ),
        )
    return figures


def fmt(value) -> str:
    return "-" if value is None else (f"{value:.2f}" if isinstance(value, float) else str(value))


def print_table(header: tuple, rows: list[tuple]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    for row in (header, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=True)))


def print_results(results: dict[str, dict]) -> None:
    kills = {n: r for n, r in results.items() if "kills_mid_change" in r}
    if kills:
        print_kill_table(kills)
    others = {n: r for n, r in results.items() if n not in kills}
    if others:
        print()
        print_control_table(others)


def print_kill_table(kills: dict[str, dict]) -> None:
    print_table(
        ("scenario", "trials", "mid-change kills", "duplicates", "orphans", "below-bound", "min-ready/bound",
         "timeouts", "outcome vs analysis", "p50 s", "max s"),
        [
            (
                name, r["trials"], r["kills_mid_change"],
                f"{r['duplicate_trials']} ({r['duplicate_samples']} smp)", r["orphan_pods"],
                f"{r['below_bound_samples']}/{r['samples']} smp",
                f"{fmt(r['min_ready_groups'])}/{r['ready_bound_groups']}", r["timeouts"],
                f"{r['outcomes_against_analysis']} against, {r['promoted']}+/{r['rolled_back']}-"
                if "promoted" in r else "-",
                fmt(r["converge_p50_seconds"]), fmt(r["converge_max_seconds"]),
            )
            for name, r in kills.items()
        ],
    )  # fmt: skip


def print_control_table(others: dict[str, dict]) -> None:
    """The control-side scenarios: their must-be-zero figures, and their worst times."""
    print_table(
        ("scenario", "trials", "must be 0", "worst seconds"),
        [
            (
                name,
                r.get("trials", "-"),
                ", ".join(f"{k}={r[k]}" for k in control.MUST_BE_ZERO if k in r) or r.get("error", "-"),
                ", ".join(
                    f"{k.removesuffix('_max_seconds')}={fmt(v)}"
                    for k, v in r.items()
                    if k.endswith("_max_seconds")
                ),
            )
            for name, r in others.items()
        ],
    )


def main() -> int:
    only = selected(os.environ.get("CHAOS_ONLY"))
    if not only:
        print("chaos_operator: CHAOS_ONLY names no scenario of this script; nothing to run")
        return 0
    rng = random.Random(SEED)
    print(
        f"chaos_operator: seed {SEED} (CHAOS_SEED={SEED} repeats the kill delays), {TRIALS} trials per scenario,"
        f" scenarios: {', '.join(n for n in ALL_SCENARIOS if n in only)}"
    )
    results: dict[str, dict] = {}
    errors: list[str] = []

    def run(name: str, scenario) -> None:
        """One scenario; one that breaks down is reported and fails the run, the others still run."""
        try:
            results[name] = scenario()
        except BROKE_DOWN as e:
            traceback.print_exc()
            errors.append(f"{name}: {e!r}")
            results[name] = {"error": repr(e)[:200]}

    with tempfile.TemporaryDirectory(prefix="tokenyard-chaos-") as tmp:
        folder = Path(tmp)
        cluster = DevCluster(folder / "cluster")
        harness = stack = None
        try:
            cluster.start()
            kubectl = Kubectl(ensure_binaries(build=False).kubectl, cluster.kubeconfig)
            kubectl.run("apply", "--server-side", "-f", str(CRD_DIR))
            kubectl.run("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
            stack = control.ControlStack(cluster, folder, f"chaos-stack-{uuid.uuid4().hex[:6]}")
            stack.start_prometheus()  # first: the operator's analysis reads it
            harness = Harness(cluster, folder, stack.prometheus_url)
            harness.operator.start()

            def kills(scenario: Scenario) -> dict:
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
                harness.core.delete_namespace(ns)
                return summarize(scenario, trials)

            for scenario in SCENARIOS:
                if scenario.name in only:
                    run(scenario.name, lambda s=scenario: kills(s))

            if only & {CANARY.name, *CONTROL_SCENARIOS}:
                stack.namespace = harness.new_namespace("stack")
                stack.start_components()

            def canary_scenarios() -> None:
                body = deployment(control.canary_rollout())
                body["spec"]["replicas"] = CANARY_REPLICAS
                _, get = start_canary(harness.cluster.api(), stack.namespace, body, stack.router_url)
                with Load(stack.router_url, workers=3):

                    def canary_kills() -> dict:
                        trials = []
                        for i in range(TRIALS):
                            delay = rng.uniform(*CANARY_KILL_DELAY_SECONDS)
                            t = harness.canary_trial(stack.namespace, i + 1, bad=i % 2 == 1, delay=delay)
                            trials.append(t)
                            print(
                                f"  {CANARY.name} #{i + 1} ({'bad' if t.bad_revision else 'good'} revision): "
                                f"kill at {delay:.2f}s ({'mid-rollout' if t.mid_change else 'after it'}), "
                                f"{t.outcome} ({t.decision}) in {fmt(t.converge_s)}s, dup samples "
                                f"{t.duplicate_samples}, orphans {t.orphans}, min ready "
                                f"{fmt(t.min_ready_groups)}/{CANARY.ready_bound}, samples {t.samples}"
                                + (f" [{'; '.join(t.notes)}]" if t.notes else ""),
                                flush=True,
                            )
                        return summarize(CANARY, trials)

                    if CANARY.name in only:
                        run(CANARY.name, canary_kills)
                    if "prometheus-canary" in only:
                        update = lambda spec: harness.patch(stack.namespace, spec, name=CANARY_NAME)  # noqa: E731
                        run(
                            "prometheus-canary",
                            lambda: control.prometheus_outage_under_canary(
                                stack, get, update, OUTAGE_TRIALS, TRIALS + 1, log
                            ),
                        )

            if only & {CANARY.name, "prometheus-canary"}:
                try:  # the scenarios catch their own failures: what escapes is the canary's setup
                    canary_scenarios()
                except BROKE_DOWN as e:
                    traceback.print_exc()
                    errors.append(f"canary setup: {e!r}")
            if "prometheus-autoscaler" in only:
                run(
                    "prometheus-autoscaler",
                    lambda: control.prometheus_outage_under_autoscaler(
                        stack, max(1, OUTAGE_TRIALS // 2), log
                    ),
                )
            if "apiserver-restart" in only:
                run(
                    "apiserver-restart",
                    lambda: control.apiserver_restart(
                        stack,
                        harness.operator,
                        RESTART_TRIALS,
                        lambda: rng.uniform(*APISERVER_DOWN_SECONDS),
                        log,
                    ),
                )
        except BROKE_DOWN as e:  # the cluster or the stack did not come up: report it, fail the run
            traceback.print_exc()
            errors.append(f"setup: {e!r}")
        finally:
            if stack is not None:
                stack.stop()
            if harness is not None:
                harness.operator.stop()
            cluster.stop()
            if errors or control.verdict(results):
                kept = Path(tempfile.gettempdir()) / f"tokenyard-chaos-logs-{SEED}"
                shutil.copytree(
                    folder, kept, ignore=shutil.ignore_patterns("data", "etcd", "pki"), dirs_exist_ok=True
                )
                print(f"logs of the failed run kept in {kept}")

    print_results(results)
    failures = control.verdict(results)
    for line in [*failures, *errors]:
        print(f"FAIL {line}")
    print(
        "PASS: every must-be-zero figure is 0"
        if not (failures or errors)
        else f"{len(failures) + len(errors)} failure(s)"
    )
    outcome = {
        "bench": "chaos_operator",
        "seed": SEED,
        "passed": not (failures or errors),
        "failures": [*failures, *errors],
        "results": results,
    }
    write_results("chaos_operator", outcome)
    print(json.dumps(outcome))
    return control.exit_code(failures, errors)


# What a scenario that breaks down raises: any error, and the integration helpers' `pytest.fail` (a
# BaseException) from the waits they share with the tests.
BROKE_DOWN = (Exception, pytest.fail.Exception)


def log(line: str) -> None:
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
