"""What the chart renders is what runs: the operator's, the router's and the autoscaler's container command,
arguments and environment are read from the pods the chart's workloads made in the local control plane and run,
exactly, as local processes — each with the token of its own ServiceAccount, mounted where the kubelet mounts it
— against real engines (the simulator), a real Redis and a real Prometheus; a request is served through that
router. A typo in a template (a flag, an env name, a fieldRef, an RBAC rule) fails here. And `helm upgrade`
from the previous chart version leaves the running engines alone.

How a pod's container becomes a local process, and the only differences from the kubelet:
- the image's entrypoint `tokenyard` is the venv's `tokenyard` console script (the same package);
- env: the container's `env` resolved as the kubelet does (values, fieldRefs from the pod, `$(VAR)` expansion),
  plus the image's HOME/TMPDIR (a scratch folder here) and PATH;
- the ServiceAccount token, CA and namespace are bind-mounted at /var/run/secrets/kubernetes.io/serviceaccount in
  a private mount namespace (`unshare`), as the kubelet's projected volume is, so `--in-cluster` and Kopf's
  service-account login read them exactly as in a pod;
- in-cluster addresses point at the loopback servers that stand in for them: the `kubernetes` Service the
  kubelet announces in KUBERNETES_SERVICE_HOST/PORT (`kubernetes_service_env`), and Prometheus' and Redis'
  Service DNS names, replaced in args and env by the `substitutions` each test lists (every entry must be used,
  so the list cannot go stale).
Ports are chart values (free loopback ports), since every process here shares one network namespace.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
import uuid
from io import BytesIO
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from tokenyard.core import labels
from tokenyard.devcluster.cluster import free_port

from tests.integration import test_chart_install as chart_install
from tests.integration.conftest import (
    ROOT,
    ManagedProcess,
    engine_scrape_config,
    prometheus_process,
    sim_pods_process,
    wait_for,
)
from tests.integration.router.conftest import RedisProcess, parse_metric
from tests.integration.test_chart_install import CHART, REFUSAL, helm, install

pytestmark = pytest.mark.integration
helm_binary = chart_install.helm_binary  # the module fixture of the chart install tests, shared

# The image's ENTRYPOINT (Dockerfile) and what stands for it here: the console script of the same package.
IMAGE_ENTRYPOINT = "tokenyard"
CONSOLE_SCRIPT = Path(sys.executable).parent / "tokenyard"
# Where the kubelet mounts a pod's ServiceAccount token (kubernetes' and Kopf's in-cluster loaders read it there).
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
# The default of values.yaml `prometheusUrl`: the Prometheus Operator's Service in `monitoring`.
PROMETHEUS_IN_CLUSTER = "http://prometheus-operated.monitoring.svc:9090"
# What a user sets `router.redisUrl` to: a Redis Service of the release namespace (formatted with it).
REDIS_IN_CLUSTER = "redis://redis.{namespace}.svc.cluster.local:6379/0"
SERVED_MODEL = "chart/llama-8b"
ENGINE = {
    "model": {"servedModelName": SERVED_MODEL, "weights": {"uri": "hf://meta-llama/Llama-3.1-8B"}},
    "engine": {"image": "vllm/vllm-openai:v0.13.0"},
    "parallelism": {"tensor": 1},
}


# ------------------------------------------------------------------------------------- pod spec -> process


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in command, args and env values: a defined variable is replaced, an
    undefined reference stays as written, `$$` is a literal `$`."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def field_value(pod: dict, path: str) -> str:
    """A downward-API fieldRef of the pod, for the paths the kubelet supports in env."""
    meta = pod["metadata"]
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if keyed:
        return meta.get(keyed.group(1), {}).get(keyed.group(2), "")
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": pod.get("status", {}).get("podIP", ""),
    }
    if path not in simple:
        raise AssertionError(f"pod {meta['name']}: fieldRef {path!r} is not one this test resolves")
    return simple[path]


def container_env(pod: dict, container: dict) -> dict[str, str]:
    """The container's `env`, resolved in order as the kubelet resolves it."""
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(var["value"], env)
        elif "fieldRef" in (var.get("valueFrom") or {}):
            env[var["name"]] = field_value(pod, var["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            raise AssertionError(f"env {var['name']} of {pod['metadata']['name']}: source not resolved here")
    return env


def container_argv(container: dict, env: dict[str, str]) -> list[str]:
    """`command + args` after `$(VAR)` expansion, the image's entrypoint mapped to the venv's console script."""
    command = container.get("command") or [IMAGE_ENTRYPOINT]
    assert command[0] == IMAGE_ENTRYPOINT, f"the image runs only {IMAGE_ENTRYPOINT}, the chart says {command}"
    argv = [expand(arg, env) for arg in [*command, *container.get("args", [])]]
    return [str(CONSOLE_SCRIPT), *argv[1:]]


def substitute(text: str, substitutions: dict[str, str], used: set[str]) -> str:
    for in_cluster, local in substitutions.items():
        if in_cluster in text:
            used.add(in_cluster)
            text = text.replace(in_cluster, local)
    return text


def kubernetes_service_env(api_server: str) -> dict[str, str]:
    """The env the kubelet adds to every container for the `kubernetes` Service (its ClusterIP and 443 in a
    cluster; in-cluster clients dial it), pointed at the local API server on loopback."""
    api = re.fullmatch(r"https://(127\.[0-9.]+):(\d+)", api_server)
    assert api, f"the local API server is not on loopback: {api_server}"
    return {"KUBERNETES_SERVICE_HOST": api.group(1), "KUBERNETES_SERVICE_PORT": api.group(2)}


def service_account_files(kubectl, devcluster, namespace: str, account: str, folder: Path) -> Path:
    """What the kubelet's projected volume holds for `account`: a fresh token, the API server's CA, the namespace."""
    folder.mkdir(parents=True)
    token = kubectl.run("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    (folder / "token").write_text(token)
    # kube-apiserver's self-signed serving certificate (its --cert-dir), which names 127.0.0.1
    shutil.copy(devcluster.state_dir / "pki" / "apiserver.crt", folder / "ca.crt")
    (folder / "namespace").write_text(namespace)
    return folder


# The private mount namespace of one process: a tmpfs over /var/run (the host's stays untouched) holding the
# ServiceAccount folder, then exec of the command (same pid, so the stop signal reaches it).
MOUNT_AND_EXEC = (
    'mount -t tmpfs pod-run /var/run && mkdir -p "$1" && mount --bind "$0" "$1" && shift && exec "$@"'
)


# A private mount namespace (mount propagation private: nothing leaks to the host); without root, inside a user
# namespace of its own.
UNSHARE = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]


def unshare_available() -> str | None:
    """Why a private mount namespace cannot be made here, or None when it can."""
    probe = subprocess.run(
        [*UNSHARE, "sh", "-c", "mount -t tmpfs probe /var/run"],
        capture_output=True,
        text=True,
    )
    return None if probe.returncode == 0 else f"{' '.join(UNSHARE)} failed: {probe.stderr.strip()}"


class PodProcess(ManagedProcess):
    """One container of a pod the chart made, run as a local process the way the kubelet would start it."""

    def __init__(
        self,
        pod: dict,
        container: str,
        account_dir: Path,
        substitutions: dict,
        service_env: dict,
        folder: Path,
    ):
        spec = next(c for c in pod["spec"]["containers"] if c["name"] == container)
        env = container_env(pod, spec)
        used: set[str] = set()
        argv = [substitute(arg, substitutions, used) for arg in container_argv(spec, env)]
        env = {name: substitute(value, substitutions, used) for name, value in env.items()} | service_env
        scratch = folder / "tmp"
        scratch.mkdir(parents=True)
        env.update(PATH=f"{CONSOLE_SCRIPT.parent}:/usr/bin:/bin", HOME=str(scratch), TMPDIR=str(scratch))
        self.used_substitutions = used
        self.argv, self.container_env, self.spec = argv, env, spec
        wrapped = [*UNSHARE, "sh", "-c", MOUNT_AND_EXEC]
        super().__init__(
            [*wrapped, str(account_dir), SERVICE_ACCOUNT_MOUNT, *argv], folder / f"{container}.log"
        )

    def start(self) -> PodProcess:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.container_env,
            )
        return self

    def http_probes(self) -> list[str]:
        """The URLs of the container's HTTP liveness and readiness probes, as the kubelet would call them."""
        ports = {p.get("name"): p["containerPort"] for p in self.spec.get("ports", [])}
        urls = []
        for kind in ("livenessProbe", "readinessProbe"):
            get = (self.spec.get(kind) or {}).get("httpGet")
            if get:
                port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
                urls.append(f"http://127.0.0.1:{port}{get.get('path', '/')}")
        return urls

    def check_healthy(self) -> None:
        """Fail the test at once (not at a wait's deadline) when the process has exited or been refused by the
        API server: a bad flag, env value or RBAC rule shows within seconds, and the log says which."""
        if not self.alive():
            pytest.fail(f"{self.argv} exited:\n{self.log()[-3000:]}")
        # timestamps dropped first: their milliseconds once read ",403" on a clean run
        messages = re.sub(r"^\[[^\]]*\]|^\S+ \S+ ", "", self.log(), flags=re.MULTILINE)
        refusal = REFUSAL.search(messages)
        if refusal:
            pytest.fail(f"{self.argv} was refused ({refusal.group()!r}):\n{self.log()[-3000:]}")


def chart_pod(kubectl, namespace: str, release: str, component: str, chart_label: str | None = None) -> dict:
    """A pod of the chart's `component` workload (of the chart version `chart_label`, when given), once made."""

    def pods():
        out = kubectl.run(
            "get",
            "pods",
            "-n",
            namespace,
            "-l",
            f"app.kubernetes.io/instance={release},app.kubernetes.io/component={component}",
            "-o",
            "json",
        ).stdout
        items = [
            p
            for p in json.loads(out)["items"]
            if not p["metadata"].get("deletionTimestamp")
            and (chart_label is None or p["metadata"]["labels"].get("helm.sh/chart") == chart_label)
        ]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    return wait_for(
        pods, timeout=60, what=f"a {component} pod of release {release} ({chart_label or 'any'})"
    )[0]


def run_component(kubectl, devcluster, namespace, pod: dict, container: str, substitutions, folder: Path):
    account = pod["spec"]["serviceAccountName"]
    account_dir = service_account_files(kubectl, devcluster, namespace, account, folder / "serviceaccount")
    service_env = kubernetes_service_env(devcluster.server)
    return PodProcess(pod, container, account_dir, substitutions, service_env, folder).start()


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def post_completion(url: str) -> dict:
    body = json.dumps({"model": SERVED_MODEL, "prompt": "hello chart", "max_tokens": 4}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def create(kube_api, namespace: str, plural: str, kind: str, name: str, spec: dict) -> None:
    body = {"apiVersion": labels.API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, plural, body
    )


def get(kube_api, namespace: str, plural: str, name: str) -> dict:
    return client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        labels.GROUP, labels.VERSION, namespace, plural, name
    )


@pytest.fixture(scope="module")
def mount_namespaces():
    reason = unshare_available()
    if reason:
        pytest.skip(f"a pod's ServiceAccount mount needs a private mount namespace: {reason}")


def stop_all(processes: list[ManagedProcess]) -> None:
    """Stop the processes a test started (by pid, SIGTERM), the last started first."""
    for process in reversed(processes):
        process.stop()
    processes.clear()


def chart_values(release: str, namespace: str, ports: dict[str, int]) -> list[str]:
    """Values for a release on this machine: a peering object of its own, the test namespace only, quick
    resyncs, and free loopback ports (the processes share one network namespace)."""
    return [
        f"operator.peering.name={release}-peering",
        f"operator.watchNamespaces={{{namespace}}}",
        "operator.resyncSeconds=2",
        "operator.bindTimeoutSeconds=5",
        *(f"{key}={port}" for key, port in ports.items()),
    ]


def test_the_rendered_commands_run_and_serve_through_the_router(
    helm_binary,
    devcluster,
    kubectl,
    kube_api,
    namespace,
    mount_namespaces,
    tmp_path,
):
    release = f"ty-{uuid.uuid4().hex[:6]}"
    ports = {
        key: free_port()
        for key in (
            "operator.metricsPort",
            "operator.livenessPort",
            "router.httpPort",
            "router.grpcPort",
            "router.metricsPort",
            "autoscaler.metricsPort",
        )
    }
    started: list[ManagedProcess] = []
    redis = RedisProcess(free_port())
    redis.start()
    try:
        prometheus, prometheus_url = prometheus_process(tmp_path, [engine_scrape_config(devcluster)])
        started.append(prometheus)
        install(
            helm_binary,
            devcluster.kubeconfig,
            release,
            namespace,
            *chart_values(release, namespace, ports),
            f"router.redisUrl={REDIS_IN_CLUSTER.format(namespace=namespace)}",
            "autoscaler.interval=1",
        )
        # Every in-cluster address the chart renders with these values, and its loopback stand-in.
        substitutions = {
            PROMETHEUS_IN_CLUSTER: prometheus_url,
            REDIS_IN_CLUSTER.format(namespace=namespace): redis.url,
        }
        processes = {}
        for component in ("operator", "router", "autoscaler"):
            pod = chart_pod(kubectl, namespace, release, component)
            processes[component] = run_component(
                kubectl, devcluster, namespace, pod, component, substitutions, tmp_path / component
            )
            started.append(processes[component])
        started.append(sim_pods_process(devcluster.kubeconfig, tmp_path / "sim-pods.log").start())
        used = set().union(*(p.used_substitutions for p in processes.values()))
        assert used == set(substitutions), f"substitutions never used: {set(substitutions) - used}"

        create(
            kube_api, namespace, "modeldeployments", "ModelDeployment", "charted", {**ENGINE, "replicas": 1}
        )
        router = f"http://127.0.0.1:{ports['router.httpPort']}"

        def answer():
            for process in processes.values():
                process.check_healthy()
            return post_completion(f"{router}/v1/completions")

        reply = wait_for(
            answer,
            timeout=90,
            interval=0.5,
            what=f"an answer through the chart's router (logs in {tmp_path})",
        )
        assert reply["usage"]["completion_tokens"] == 4, reply
        # The router shares its state through the (substituted) Redis, and says so.
        router_metrics = http_get(f"http://127.0.0.1:{ports['router.metricsPort']}/metrics")
        assert parse_metric(router_metrics, "tokenyard_router_redis_up") == 1.0

        # The autoscaler reads the engine's queue from the (substituted) Prometheus and writes its status.
        create(
            kube_api,
            namespace,
            "inferenceautoscalers",
            "InferenceAutoscaler",
            "charted",
            {
                "scaleTargetRef": {"name": "charted"},
                "minReplicas": 1,
                "maxReplicas": 2,
                "mode": "RecommendOnly",
                "intervalSeconds": 1,
                "signals": [{"kind": "WaitingRequests", "target": 4}],
            },
        )

        def signal_read():
            processes["autoscaler"].check_healthy()
            status = get(kube_api, namespace, "inferenceautoscalers", "charted").get("status", {})
            signals = status.get("signals") or [{}]
            return status.get("currentReplicas") == 1 and signals[0].get("value") is not None and status

        wait_for(signal_read, timeout=60, interval=0.5, what="the autoscaler's status with a signal read")
        # The operator (chart's liveness and metrics flags) reports the group Ready.
        operator_metrics = http_get(f"http://127.0.0.1:{ports['operator.metricsPort']}/metrics")
        assert (
            parse_metric(operator_metrics, "tokenyard_operator_groups", deployment="charted", phase="Ready")
            == 1.0
        )
        probes = [url for process in processes.values() for url in process.http_probes()]
        assert len(probes) >= 3, f"expected the operator's, router's and autoscaler's HTTP probes: {probes}"
        for url in probes:  # the kubelet would restart (or never route to) a pod whose probe fails
            with urllib.request.urlopen(url, timeout=5) as response:
                assert response.status == 200, f"probe {url}: {response.status}"
        for process in processes.values():
            process.check_healthy()
    finally:
        stop_all(started)
        redis.stop()
        helm(helm_binary, devcluster.kubeconfig, "uninstall", release, "--namespace", namespace, "--wait")


# ----------------------------------------------------------------------------------------------- upgrade


CHART_YAML = "charts/tokenyard/Chart.yaml"


def git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, timeout=60, check=check)


def chart_version(revision: str | None = None) -> str | None:
    """Chart.yaml's version in the work tree, or at a git revision (None where the chart did not exist)."""
    if revision is None:
        text = (CHART / "Chart.yaml").read_text()
    else:
        shown = git("show", f"{revision}:{CHART_YAML}", check=False)
        if shown.returncode != 0:
            return None
        text = shown.stdout.decode()
    return str(yaml.safe_load(text)["version"])


def previous_chart(folder: Path) -> tuple[Path, str]:
    """The chart as it last stood at its previous version, from git history (read-only: `git show`/`git
    archive` touch neither the index nor the work tree): the parent of the commit that set the current version,
    or HEAD while the new version is not committed yet."""
    current = chart_version()
    touching_version = git("log", "--format=%H", "-G", "^version:", "--", CHART_YAML).stdout.decode().split()
    bump = next(
        (c for c in touching_version if chart_version(c) == current and chart_version(f"{c}^") != current),
        None,
    )
    revision = f"{bump}^" if bump else "HEAD"
    previous = chart_version(revision)
    assert previous not in (None, current), (
        f"no previous chart version to upgrade from (work tree {current}, {revision} {previous}): "
        "bump `version` in Chart.yaml"
    )
    archive = git("archive", "--format=tar", revision, "charts/tokenyard").stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "charts" / "tokenyard", previous


def engine_pods(kube_api, namespace: str, name: str) -> dict[str, tuple]:
    """uid -> (name, restart counts, start time) of the ModelDeployment's engine pods."""
    pods = client.CoreV1Api(kube_api).list_namespaced_pod(
        namespace, label_selector=f"{labels.MODEL_DEPLOYMENT}={name}"
    )
    return {
        p.metadata.uid: (
            p.metadata.name,
            tuple(s.restart_count for s in p.status.container_statuses or ()),
            p.status.start_time,
        )
        for p in pods.items
    }


def test_helm_upgrade_from_the_previous_chart_version_keeps_the_running_engines(
    helm_binary,
    devcluster,
    kubectl,
    kube_api,
    namespace,
    mount_namespaces,
    tmp_path,
):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the previous chart version comes from git history; this is not a git checkout")
    old_chart, old_version = previous_chart(tmp_path / "previous")
    release = f"ty-{uuid.uuid4().hex[:6]}"
    ports = {key: free_port() for key in ("operator.metricsPort", "operator.livenessPort")}
    values = chart_values(release, namespace, ports)
    # No Prometheus here (no rollout, so no analysis): its address is a loopback port nothing serves.
    substitutions = {PROMETHEUS_IN_CLUSTER: f"http://127.0.0.1:{free_port()}"}
    started: list[ManagedProcess] = []
    install(helm_binary, devcluster.kubeconfig, release, namespace, *values, chart=old_chart)
    try:
        pod = chart_pod(kubectl, namespace, release, "operator", f"tokenyard-{old_version}")
        old_operator = run_component(
            kubectl, devcluster, namespace, pod, "operator", substitutions, tmp_path / "old"
        )
        started.append(old_operator)
        started.append(sim_pods_process(devcluster.kubeconfig, tmp_path / "sim-pods.log").start())
        create(kube_api, namespace, "modeldeployments", "ModelDeployment", "kept", {**ENGINE, "replicas": 2})

        def ready():
            old_operator.check_healthy()
            status = get(kube_api, namespace, "modeldeployments", "kept").get("status", {})
            pods = engine_pods(kube_api, namespace, "kept")
            return status.get("readyReplicas") == 2 and len(pods) == 2 and (status, pods)

        before_status, before = wait_for(
            ready, timeout=60, interval=0.5, what="2 Ready groups under the old chart"
        )

        sets = [arg for value in values for arg in ("--set", value)]
        helm(
            helm_binary,
            devcluster.kubeconfig,
            "upgrade",
            release,
            str(CHART),
            "--namespace",
            namespace,
            *sets,
        )
        new_version = chart_version()
        pod = chart_pod(kubectl, namespace, release, "operator", f"tokenyard-{new_version}")
        # The StatefulSet replaces the operator's pod: the old process stops, the new chart's starts.
        old_operator.stop()
        new_operator = run_component(
            kubectl, devcluster, namespace, pod, "operator", substitutions, tmp_path / "new"
        )
        started.append(new_operator)

        metrics_url = f"http://127.0.0.1:{ports['operator.metricsPort']}/metrics"

        def reconciled_by_the_new_operator():
            # a fresh process: the gauge exists only once it has reconciled `kept` (and created any pods it wanted)
            new_operator.check_healthy()
            metrics = http_get(metrics_url)
            return parse_metric(metrics, "tokenyard_operator_groups", deployment="kept", phase="Ready") == 2.0

        wait_for(
            reconciled_by_the_new_operator, timeout=60, interval=0.5, what="the new operator's reconcile"
        )
        after_status = get(kube_api, namespace, "modeldeployments", "kept")["status"]
        assert engine_pods(kube_api, namespace, "kept") == before, (
            "the upgrade replaced or restarted engine pods"
        )
        assert after_status["currentRevision"] == before_status["currentRevision"]
        assert after_status.get("updateRevision") == before_status.get("updateRevision")
        new_operator.check_healthy()
    finally:
        stop_all(started)
        helm(helm_binary, devcluster.kubeconfig, "uninstall", release, "--namespace", namespace, "--wait")
