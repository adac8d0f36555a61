"""The operator's timings on the local cluster, side by side with a plain Deployment of the same pods.

A fresh DevCluster (etcd, kube-apiserver, controller-manager, kube-scheduler, kwok; 16 fake nodes x 8 GPUs) is
started in a temporary folder, the CRDs are applied and the operator runs as a child process. Measured:

* apply to Ready: wall time from the create call of a ModelDeployment to `status.readyReplicas` equal to the
  groups wanted, every group `Ready`, and every engine pod Ready — for 20 groups of TP=4 (one pod each) and for
  6 groups of TP=16 (two pods of 8 GPUs each; 10 would need 160 GPUs, the cluster has 128);
* killed pod to group Ready: one pod of the 20-group deployment deleted with grace 0, until the deployment has
  20 Ready groups again, the killed pod gone and every live pod Ready; and for a TP=16 group, its worker
  deleted until the whole gang is recreated (no pod of the old gang left) and Ready;
* the Kubernetes baseline: a Deployment (apps/v1) of 20 pods requesting 4 `nvidia.com/gpu` each, placed by
  kube-scheduler and the ReplicaSet controller: create to 20 ready, and a deleted pod to 20 ready again.

kwok marks pods Running and Ready on both sides, so the figures compare control-plane work only. Deployments are
deleted between runs and the pods awaited gone, so each run starts on an empty cluster. The claim is the ratio
(tokenyard / Deployment) within one run, not the absolute seconds.

Run: ``.venv/bin/python bench/bench_operator_cluster.py`` from the repository root (``BENCH_QUICK=1``: 2 kills
instead of 5).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from results_io import write_results
from tokenyard.core import labels
from tokenyard.core.process import stop_process
from tokenyard.devcluster.binaries import ensure_binaries
from tokenyard.devcluster.cluster import DevCluster

QUICK = os.environ.get("BENCH_QUICK") == "1"
KILLS = 2 if QUICK else 5
NAMESPACE = "bench"
ROOT = Path(__file__).resolve().parents[1]
CRD_DIR = ROOT / "charts" / "tokenyard" / "crds"
PLURAL = "modeldeployments"
POLL_SECONDS = 0.1
STEP_TIMEOUT_SECONDS = 180.0
OPERATOR_ENV = {"TOKENYARD_RESYNC_SECONDS": "2"}

SMALL_GROUPS, SMALL_TENSOR = 20, 4  # 20 pods x 4 GPUs: 80 of the 128 GPUs
LARGE_GROUPS, LARGE_TENSOR = 6, 16  # 6 gangs x 2 pods x 8 GPUs: 96 of the 128 GPUs
BASELINE_PODS, BASELINE_GPUS = 20, 4


# ---------------------------------------------------------------------------------------------- pure helpers
def pod_is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def live(pods: list) -> list:
    return [p for p in pods if not p.metadata.deletion_timestamp]


def model_deployment_converged(obj: dict, groups: int, pods: list, pods_per_group: int) -> bool:
    """The operator reports `groups` Ready groups for the current generation and the pods agree."""
    status = obj.get("status") or {}
    ready_groups = [g for g in status.get("groups", []) if g.get("phase") == "Ready"]
    return (
        status.get("observedGeneration") == obj["metadata"].get("generation")
        and status.get("readyReplicas") == groups
        and len(ready_groups) == groups
        and len(pods) == groups * pods_per_group
        and all(pod_is_ready(p) for p in pods)
    )


def summary(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples), max(samples)


def ratio(ours: float, baseline: float) -> float | None:
    return round(ours / baseline, 2) if baseline > 0 else None


# ---------------------------------------------------------------------------------------------- adapters
class Timeout(RuntimeError):
    """A benchmark step did not reach its condition before its deadline."""


def wait_until(check: Callable[[], object], what: str, timeout: float = STEP_TIMEOUT_SECONDS) -> object:
    """Poll `check` every POLL_SECONDS; raise naming `what` (and the last API error) when the deadline passes."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except ApiException as e:  # a transient API answer while objects settle; reported if it persists
            last_error = e
        time.sleep(POLL_SECONDS)
    raise Timeout(
        f"timed out after {timeout:.0f}s waiting for {what}"
        + (f" (last error: {last_error})" if last_error else "")
    )


@dataclass
class Apis:
    custom: client.CustomObjectsApi
    core: client.CoreV1Api
    apps: client.AppsV1Api

    def pods(self, selector: str) -> list:
        return live(self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)

    def any_pods(self, selector: str) -> bool:
        return bool(self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)


def start_operator(kubeconfig: Path, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenyard.operator", "--kubeconfig", str(kubeconfig), "--metrics-port", "0"],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **OPERATOR_ENV},
        cwd=ROOT,
    )
    log.close()
    return proc


def kubectl(binary: Path, kubeconfig: Path, *args: str) -> None:
    result = subprocess.run(
        [str(binary), f"--kubeconfig={kubeconfig}", *args], capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")


# ---------------------------------------------------------------------------------------------- tokenyard side
def model_deployment(name: str, tensor: int, replicas: int) -> dict:
    spec = {
        "model": {"weights": {"uri": f"hf://bench/{name}"}},
        "engine": {"image": "vllm/vllm-openai:v0.13.0"},
        "parallelism": {"tensor": tensor},
        "replicas": replicas,
    }
    return {
        "apiVersion": labels.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def mdep_selector(name: str) -> str:
    return f"{labels.MODEL_DEPLOYMENT}={name}"


def mdep_converged(apis: Apis, name: str, groups: int, pods_per_group: int) -> Callable[[], bool]:
    def check() -> bool:
        obj = apis.custom.get_namespaced_custom_object(labels.GROUP, labels.VERSION, NAMESPACE, PLURAL, name)
        return model_deployment_converged(obj, groups, apis.pods(mdep_selector(name)), pods_per_group)

    return check


def apply_model_deployment(apis: Apis, name: str, tensor: int, groups: int, pods_per_group: int) -> float:
    started = time.monotonic()
    apis.custom.create_namespaced_custom_object(
        labels.GROUP, labels.VERSION, NAMESPACE, PLURAL, model_deployment(name, tensor, groups)
    )
    wait_until(mdep_converged(apis, name, groups, pods_per_group), f"{groups} Ready groups of {name}")
    return time.monotonic() - started


def delete_model_deployment(apis: Apis, name: str) -> None:
    apis.custom.delete_namespaced_custom_object(labels.GROUP, labels.VERSION, NAMESPACE, PLURAL, name)
    wait_until(lambda: not apis.any_pods(mdep_selector(name)), f"the pods of {name} to be gone")


def kill_and_await(
    apis: Apis, selector: str, victim, converged: Callable[[], bool], gang_selector: str | None = None
) -> float:
    """Delete `victim` (grace 0); return the seconds until `converged` holds and no pod of the victim's gang
    (`gang_selector`, taken before the kill; the victim alone without one) is left: the gang is all new pods."""
    old_gang = {victim.metadata.uid} | (
        {p.metadata.uid for p in apis.pods(gang_selector)} if gang_selector else set()
    )
    started = time.monotonic()
    apis.core.delete_namespaced_pod(victim.metadata.name, NAMESPACE, grace_period_seconds=0)

    def recovered() -> bool:
        uids = {p.metadata.uid for p in apis.pods(selector)}
        return not (uids & old_gang) and converged()

    wait_until(recovered, f"recovery after deleting pod {victim.metadata.name}")
    return time.monotonic() - started


def bench_tokenyard(apis: Apis) -> dict[str, float]:
    # Warm-up, not timed: the operator's start-up (kopf's watches, the first node listing) would otherwise be
    # counted in the first apply.
    apply_model_deployment(apis, "warmup", 1, 1, 1)
    delete_model_deployment(apis, "warmup")
    results: dict[str, float] = {}
    name = "small"
    results["apply_20_groups_ready_s"] = apply_model_deployment(apis, name, SMALL_TENSOR, SMALL_GROUPS, 1)
    converged = mdep_converged(apis, name, SMALL_GROUPS, 1)
    kills = []
    for i in range(KILLS):
        # A different group each time, so every kill replaces a pod that has not been replaced before.
        pods = sorted(
            apis.pods(mdep_selector(name)), key=lambda p: int(p.metadata.labels[labels.GROUP_INDEX])
        )
        victim = pods[(i * 7) % len(pods)]
        gang = f"{mdep_selector(name)},{labels.GROUP_INDEX}={victim.metadata.labels[labels.GROUP_INDEX]}"
        kills.append(kill_and_await(apis, mdep_selector(name), victim, converged, gang))
    results["pod_kill_to_group_ready_p50_s"], results["pod_kill_to_group_ready_max_s"] = summary(kills)
    results["_pod_kill_samples_s"] = kills
    delete_model_deployment(apis, name)

    name = "large"
    results["apply_6_tp16_groups_ready_s"] = apply_model_deployment(apis, name, LARGE_TENSOR, LARGE_GROUPS, 2)
    workers = apis.pods(f"{mdep_selector(name)},{labels.ROLE}={labels.ROLE_WORKER}")
    victim = sorted(workers, key=lambda p: int(p.metadata.labels[labels.GROUP_INDEX]))[0]
    gang = f"{mdep_selector(name)},{labels.GROUP_INDEX}={victim.metadata.labels[labels.GROUP_INDEX]}"
    results["tp16_worker_kill_to_gang_ready_s"] = kill_and_await(
        apis, mdep_selector(name), victim, mdep_converged(apis, name, LARGE_GROUPS, 2), gang
    )
    delete_model_deployment(apis, name)
    return results


# ---------------------------------------------------------------------------------------------- baseline side
BASELINE_NAME = "baseline"
BASELINE_SELECTOR = "app=bench-baseline"


def baseline_deployment(replicas: int = BASELINE_PODS) -> dict:
    container = {
        "name": "engine",
        "image": "vllm/vllm-openai:v0.13.0",
        "resources": {
            "limits": {labels.GPU_RESOURCE: str(BASELINE_GPUS)},
            "requests": {labels.GPU_RESOURCE: str(BASELINE_GPUS)},
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": BASELINE_NAME},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "bench-baseline"}},
            "template": {
                "metadata": {"labels": {"app": "bench-baseline"}},
                "spec": {"containers": [container]},
            },
        },
    }


def baseline_converged(apis: Apis) -> bool:
    deployment = apis.apps.read_namespaced_deployment(BASELINE_NAME, NAMESPACE)
    pods = apis.pods(BASELINE_SELECTOR)
    return (
        (deployment.status.ready_replicas or 0) == BASELINE_PODS
        and len(pods) == BASELINE_PODS
        and all(pod_is_ready(p) for p in pods)
    )


def bench_baseline(apis: Apis) -> dict[str, float]:
    # Warm-up, not timed, as on the tokenyard side: one pod through the Deployment and ReplicaSet controllers.
    apis.apps.create_namespaced_deployment(NAMESPACE, baseline_deployment(replicas=1))
    wait_until(
        lambda: (
            (apis.apps.read_namespaced_deployment(BASELINE_NAME, NAMESPACE).status.ready_replicas or 0) == 1
        ),
        "the warm-up pod",
    )
    delete_baseline(apis)
    results: dict[str, float] = {}
    started = time.monotonic()
    apis.apps.create_namespaced_deployment(NAMESPACE, baseline_deployment())
    wait_until(lambda: baseline_converged(apis), f"{BASELINE_PODS} ready pods of the Deployment")
    results["apply_20_pods_ready_s"] = time.monotonic() - started
    kills = []
    for i in range(KILLS):
        pods = sorted(apis.pods(BASELINE_SELECTOR), key=lambda p: p.metadata.name)
        victim = pods[(i * 7) % len(pods)]
        kills.append(kill_and_await(apis, BASELINE_SELECTOR, victim, lambda: baseline_converged(apis)))
    results["pod_kill_to_ready_p50_s"], results["pod_kill_to_ready_max_s"] = summary(kills)
    results["_pod_kill_samples_s"] = kills
    delete_baseline(apis)
    return results


def delete_baseline(apis: Apis) -> None:
    apis.apps.delete_namespaced_deployment(BASELINE_NAME, NAMESPACE, propagation_policy="Foreground")

    def gone() -> bool:
        try:
            apis.apps.read_namespaced_deployment(BASELINE_NAME, NAMESPACE)
        except ApiException as e:
            if e.status == 404:
                return not apis.any_pods(BASELINE_SELECTOR)
            raise
        return False

    wait_until(gone, "the Deployment and its pods to be gone")


# ---------------------------------------------------------------------------------------------- report
def comparison_rows(
    ours: dict[str, float], baseline: dict[str, float]
) -> list[tuple[str, float, float | None]]:
    """(measure, tokenyard's seconds, the Deployment's seconds or None where it has no counterpart)."""
    return [
        (
            "apply -> all ready (20 x 4 GPUs, 1 pod each)",
            ours["apply_20_groups_ready_s"],
            baseline["apply_20_pods_ready_s"],
        ),
        (
            "killed pod -> ready again, p50",
            ours["pod_kill_to_group_ready_p50_s"],
            baseline["pod_kill_to_ready_p50_s"],
        ),
        (
            "killed pod -> ready again, max",
            ours["pod_kill_to_group_ready_max_s"],
            baseline["pod_kill_to_ready_max_s"],
        ),
        ("apply -> all ready (6 TP=16 gangs, 2 pods each)", ours["apply_6_tp16_groups_ready_s"], None),
        ("TP=16 worker killed -> gang recreated, ready", ours["tp16_worker_kill_to_gang_ready_s"], None),
    ]


def print_table(ours: dict[str, float], baseline: dict[str, float]) -> None:
    print(f"\n{'measure':<50} {'tokenyard s':>12} {'Deployment s':>13} {'ratio':>7}")
    for label, mine, theirs in comparison_rows(ours, baseline):
        theirs_text = f"{theirs:13.2f}" if theirs is not None else f"{'-':>13}"
        ratio_value = ratio(mine, theirs) if theirs is not None else None
        ratio_text = f"{ratio_value:7.2f}" if ratio_value is not None else f"{'-':>7}"
        print(f"{label:<50} {mine:12.2f} {theirs_text} {ratio_text}")
    print(
        f"kills per side: {KILLS}; tokenyard samples {[round(s, 2) for s in ours['_pod_kill_samples_s']]}, "
        f"Deployment samples {[round(s, 2) for s in baseline['_pod_kill_samples_s']]}"
    )


def main() -> int:
    binaries = ensure_binaries(build=False)
    with tempfile.TemporaryDirectory(prefix="bench-operator-cluster-") as folder:
        cluster = DevCluster(Path(folder) / "cluster")
        operator: subprocess.Popen | None = None
        try:
            cluster.start()
            kubectl(binaries.kubectl, cluster.kubeconfig, "apply", "--server-side", "-f", str(CRD_DIR))
            kubectl(
                binaries.kubectl,
                cluster.kubeconfig,
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd",
                "--all",
            )
            api = cluster.api()
            apis = Apis(client.CustomObjectsApi(api), client.CoreV1Api(api), client.AppsV1Api(api))
            apis.core.create_namespace({"metadata": {"name": NAMESPACE}})
            wait_until(
                lambda: apis.core.read_namespaced_service_account("default", NAMESPACE),
                "the default ServiceAccount",
            )
            operator = start_operator(cluster.kubeconfig, Path(folder) / "operator.log")
            print(
                f"cluster {cluster.server} ({cluster.topology.describe()}), operator pid {operator.pid}",
                flush=True,
            )
            try:
                ours = bench_tokenyard(apis)
                print(
                    f"tokenyard done: {json.dumps({k: v for k, v in ours.items() if not k.startswith('_')})}",
                    flush=True,
                )
                theirs = bench_baseline(apis)
            except Timeout:
                if operator.poll() is not None:
                    print(f"the operator exited with code {operator.returncode}", file=sys.stderr)
                log = (Path(folder) / "operator.log").read_text(errors="replace")
                print("operator log tail:\n" + "\n".join(log.splitlines()[-40:]), file=sys.stderr)
                raise
        finally:
            if operator is not None:
                stop_process(operator)
            cluster.stop()
    print_table(ours, theirs)
    public = lambda d: {k: round(v, 3) for k, v in d.items() if not k.startswith("_")}  # noqa: E731
    final = {
        "bench": "operator_cluster",
        "results": {"tokenyard": public(ours), "deployment_baseline": public(theirs)},
        # the table's pairs, for bench/report.py
        "comparison": [
            {
                "measure": label,
                "tokenyard_s": round(mine, 3),
                "deployment_s": None if other is None else round(other, 3),
            }
            for label, mine, other in comparison_rows(ours, theirs)
        ],
    }
    print(json.dumps(final))
    write_results("operator_cluster", final)
    return 0


if __name__ == "__main__":
    sys.exit(main())
