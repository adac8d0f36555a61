"""The whole local stack on a running DevCluster: what `make demo` runs and what the live-dashboard test runs.

- the CRDs; the operator, the router and the autoscaler as local processes; the simulator serving every engine pod
  on its 127.x pod IP; a real Prometheus with the chart's plain-Prometheus scrape configuration.
- Each component process is also a pod in the cluster (`tokenyard-system`, labelled as the chart labels its
  pods, with the same container port names), and it listens on that pod's IP. kwok gives such a pod a 127.x IP
  and keeps it Running, exactly as it does for the engine pods the simulator serves. So Prometheus finds the
  components through Kubernetes service discovery, as it would in a real cluster, and the scrape configuration is
  the chart's, unchanged. (A Service or EndpointSlice pointing at a host process cannot be used instead: the API
  server refuses loopback addresses in both.)
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from tokenyard.core.process import ManagedProcess
from tokenyard.devcluster import prometheus
from tokenyard.devcluster.binaries import ensure_binaries
from tokenyard.devcluster.cluster import ADMIN_TOKEN, DevCluster, free_port

ROOT = Path(__file__).resolve().parents[3]
CRD_DIR = ROOT / "charts" / "tokenyard" / "crds"
EXAMPLE_DEPLOYMENT = ROOT / "examples" / "llama-8b-tp4.yaml"
EXAMPLE_AUTOSCALER = ROOT / "examples" / "autoscaler.yaml"
SYSTEM_NAMESPACE = "tokenyard-system"
# The chart's default image: what these pods would run in a real cluster (kwok never pulls it). Its tag is the
# package's version, which the chart's appVersion equals (tests/unit/test_image.py holds them together).
IMAGE = f"ghcr.io/tokenyard/tokenyard:{importlib.metadata.version('tokenyard')}"

# The example autoscaler decides on minutes (a 60 s window, one group removed per 2 minutes after 5 minutes of
# calm), as a real fleet whose groups take minutes to load should. The simulator loads a model at once, so the
# demo compresses those minutes to seconds and a whole scale-out and scale-in fits in a few minutes.
DEMO_AUTOSCALER_TIMING = {
    "intervalSeconds": 2,
    "stableWindowSeconds": 20,
    "panicWindowSeconds": 6,
    "coldStartSeconds": 0,
    "scaleUp": {"maxGroups": 2, "periodSeconds": 6},
    "scaleDown": {"maxGroups": 1, "periodSeconds": 8, "stabilizationWindowSeconds": 20},
}
# A few sequences per engine, so that a laptop's load generator can fill the queue that the autoscaler reads
# (vLLM's own flag; the simulator reads it from the rendered command line).
DEMO_ENGINE_ARGS = ["--max-num-seqs=4"]


def merged(base: dict, overlay: dict) -> dict:
    """`base` with `overlay`'s keys set, recursively for mappings (a JSON merge patch without deletions)."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        out[key] = (
            merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def demo_deployment(replicas: int = 1) -> dict:
    """examples/llama-8b-tp4.yaml with the demo's engine limit, starting from `replicas` groups."""
    mdep = yaml.safe_load(EXAMPLE_DEPLOYMENT.read_text())
    mdep["spec"]["engine"]["args"] = [*mdep["spec"]["engine"].get("args", []), *DEMO_ENGINE_ARGS]
    mdep["spec"]["replicas"] = replicas
    return mdep


def demo_autoscaler() -> dict:
    """examples/autoscaler.yaml with the demo's compressed timing."""
    return merged(yaml.safe_load(EXAMPLE_AUTOSCALER.read_text()), {"spec": DEMO_AUTOSCALER_TIMING})


def component_pod(component: str, ports: dict[str, int]) -> dict:
    """A pod standing for a local process of `component`, with the labels of the chart's pods and the process'
    ports under their chart names."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{prometheus.RELEASE}-{component}-local",
            "namespace": SYSTEM_NAMESPACE,
            "labels": {
                "app.kubernetes.io/name": "tokenyard",
                "app.kubernetes.io/instance": prometheus.RELEASE,
                "app.kubernetes.io/component": component,
                "app.kubernetes.io/part-of": "tokenyard",
            },
            "annotations": {"tokenyard.dev/served-by": "a local process of `make demo` on this pod's IP"},
        },
        "spec": {
            "containers": [
                {
                    "name": component,
                    "image": IMAGE,
                    "ports": [{"name": name, "containerPort": port} for name, port in ports.items()],
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message has its arguments and stderr."""


class Kubectl:
    """The real kubectl against one cluster (the demo prints the same commands for the user to run)."""

    def __init__(self, binary: Path, kubeconfig: Path):
        self.binary, self.kubeconfig = binary, kubeconfig

    @classmethod
    def of(cls, cluster: DevCluster) -> Kubectl:
        return cls(ensure_binaries(build=False).kubectl, cluster.kubeconfig)

    def command(self, *args: str) -> list[str]:
        return [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]

    def run(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(self.command(*args), input=input, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise KubectlError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def apply(
        self, manifest: dict | str, namespace: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        where = ["-n", namespace] if namespace else []
        return self.run("apply", *where, "-f", "-", input=text, check=check)

    def get(self, kind: str, name: str, namespace: str) -> dict:
        return json.loads(self.run("get", kind, name, "-n", namespace, "-o", "json").stdout)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200


def poll_until(check, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """Poll `check` until it returns a truthy value (and return it); TimeoutError naming `what`, with the last
    error `check` raised, when the deadline passes."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - the condition is still settling; report the last error on timeout
            last_error = e
        time.sleep(interval)
    raise TimeoutError(
        f"timed out after {timeout}s waiting for {what}"
        + (f" (last error: {last_error!r})" if last_error else "")
    )


@dataclass
class Stack:
    """The processes of the stack on `cluster`, their logs in `folder`; ModelDeployments in `namespace`."""

    cluster: DevCluster
    folder: Path
    namespace: str = "default"
    # served seconds per modelled second of the simulated engines (>1: slower than real, so that a light load
    # fills the queue)
    time_scale: float = 2.0
    operator_env: dict[str, str] = field(default_factory=dict)
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    router_url: str = ""
    prometheus_url: str = ""

    def __post_init__(self) -> None:
        self.kubectl = Kubectl.of(self.cluster)
        self.folder.mkdir(parents=True, exist_ok=True)

    def start(self, say=print) -> Stack:
        binaries = ensure_binaries(build=False)
        if binaries.prometheus is None or binaries.helm is None:
            raise RuntimeError(
                "prometheus or helm is missing from the binary cache; `make binaries` builds them"
            )
        say("CRDs and the tokenyard-system namespace")
        self.kubectl.run("apply", "--server-side", "-f", str(CRD_DIR))
        self.kubectl.run("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        for namespace in (SYSTEM_NAMESPACE, self.namespace):
            self.kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

        ports = {
            "operator": {"metrics": free_port()},
            "router": {"http": free_port(), "grpc": free_port(), "metrics": free_port()},
            "autoscaler": {"metrics": free_port()},
        }
        ips = self._component_pods(ports)

        say(
            "Prometheus with the chart's scrape configuration (helm template ... prometheus-scrape-config.yaml)"
        )
        scrape = prometheus.out_of_cluster(
            prometheus.chart_scrape_configs(binaries.helm, SYSTEM_NAMESPACE, interval="1s"),
            self.cluster.server,
            ADMIN_TOKEN,
        )
        prometheus_port = free_port()
        self.prometheus_url = f"http://127.0.0.1:{prometheus_port}"
        self._start(
            "prometheus",
            prometheus.prometheus_process(binaries.prometheus, self.folder, scrape, prometheus_port),
        )

        say("the operator, the simulated engines, the router and the autoscaler")
        kubeconfig = str(self.cluster.kubeconfig)
        self._start(
            "operator",
            ManagedProcess(
                [
                    "tokenyard.operator",
                    "--kubeconfig",
                    kubeconfig,
                    "--prometheus-url",
                    self.prometheus_url,
                    "--metrics-host",
                    ips["operator"],
                    "--metrics-port",
                    str(ports["operator"]["metrics"]),
                ],
                self.folder / "operator.log",
                env=self.operator_env,
            ),
        )
        self._start(
            "sim-pods",
            ManagedProcess(
                ["tokenyard.sim", "pods", "--kubeconfig", kubeconfig, "--time-scale", str(self.time_scale)],
                self.folder / "sim-pods.log",
            ),
        )
        router = ports["router"]
        self._start(
            "router",
            ManagedProcess(
                [
                    "tokenyard.router",
                    "--kubeconfig",
                    kubeconfig,
                    "--namespace",
                    self.namespace,
                    "--host",
                    ips["router"],
                    "--port",
                    str(router["http"]),
                    "--grpc-port",
                    str(router["grpc"]),
                    "--metrics-port",
                    str(router["metrics"]),
                ],
                self.folder / "router.log",
            ),
        )
        self._start(
            "autoscaler",
            ManagedProcess(
                [
                    "tokenyard.autoscaler",
                    "--prometheus-url",
                    self.prometheus_url,
                    "--kubeconfig",
                    kubeconfig,
                    "--interval",
                    "1",
                    "--lease-namespace",
                    SYSTEM_NAMESPACE,
                    "--metrics-host",
                    ips["autoscaler"],
                    "--metrics-port",
                    str(ports["autoscaler"]["metrics"]),
                ],
                self.folder / "autoscaler.log",
            ),
        )
        self.router_url = f"http://{ips['router']}:{router['http']}"
        poll_until(
            lambda: prometheus.ready(self.prometheus_url), 30, what=f"Prometheus at {self.prometheus_url}"
        )
        poll_until(lambda: _http_ok(f"{self.router_url}/health"), 60, what=f"the router at {self.router_url}")
        return self

    def _component_pods(self, ports: dict[str, dict[str, int]]) -> dict[str, str]:
        """Create (or re-create, after an earlier run) each component's pod; return each one's pod IP."""
        for component, its_ports in ports.items():
            pod = component_pod(component, its_ports)
            name = pod["metadata"]["name"]
            self.kubectl.run(
                "delete", "pod", name, "-n", SYSTEM_NAMESPACE, "--ignore-not-found", "--wait=true"
            )
            self.kubectl.apply(pod, SYSTEM_NAMESPACE)

        def ip(component: str) -> str:
            pod = self.kubectl.get("pod", f"{prometheus.RELEASE}-{component}-local", SYSTEM_NAMESPACE)
            return pod.get("status", {}).get("podIP", "")

        return {c: poll_until(lambda c=c: ip(c), 60, what=f"a pod IP for the {c} pod") for c in ports}

    def _start(self, name: str, process: ManagedProcess) -> None:
        self.processes[name] = process.start()

    def check_alive(self) -> None:
        """RuntimeError naming each process that exited, with the end of its log."""
        dead = [name for name, p in self.processes.items() if not p.alive()]
        if dead:
            tails = "\n".join(
                f"--- {n} ({self.processes[n].log_path}):\n{self.processes[n].log()[-1500:]}" for n in dead
            )
            raise RuntimeError(f"stopped unexpectedly: {', '.join(dead)}\n{tails}")

    def apply_demo_model(self, replicas: int = 1) -> tuple[str, str]:
        """The example ModelDeployment and its InferenceAutoscaler; returns (name, served model name)."""
        mdep = demo_deployment(replicas)
        self.kubectl.apply(mdep, self.namespace)
        self.kubectl.apply(demo_autoscaler(), self.namespace)
        return mdep["metadata"]["name"], mdep["spec"]["model"]["servedModelName"]

    def groups(self, name: str) -> tuple[int, int]:
        """(desired, ready) groups of ModelDeployment `name`."""
        obj = self.kubectl.get("mdep", name, self.namespace)
        return obj["spec"]["replicas"], obj.get("status", {}).get("readyReplicas", 0) or 0

    def stop(self) -> None:
        """Stop every process (the components before Prometheus, so its last scrapes see them go) and delete the
        component pods; the cluster itself keeps running."""
        for name in ("autoscaler", "router", "sim-pods", "operator", "prometheus"):
            if name in self.processes:
                self.processes[name].stop()
        names = [
            f"{prometheus.RELEASE}-{component}-local" for component in ("operator", "router", "autoscaler")
        ]
        # best effort: the cluster may be gone already
        self.kubectl.run(
            "delete", "pod", *names, "-n", SYSTEM_NAMESPACE, "--ignore-not-found", "--wait=false", check=False
        )
