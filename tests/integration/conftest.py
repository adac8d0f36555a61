"""Fixtures of the integration tier: one real local control plane per test session, a namespace per test.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok) starts only when a
test asks for it, in a temporary folder on free ports, and every process it started is stopped at the end.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from pathlib import Path

import pytest
import yaml
from tokenyard.core.process import ManagedProcess
from tokenyard.devcluster import prometheus
from tokenyard.devcluster.binaries import ensure_binaries
from tokenyard.devcluster.cluster import ADMIN_TOKEN, DevCluster, free_port
from tokenyard.devcluster.stack import Kubectl, poll_until

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "charts" / "tokenyard" / "crds"


def wait_for(check, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """`poll_until` that fails the test when the deadline passes."""
    try:
        return poll_until(check, timeout, interval, what)
    except TimeoutError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory):
    cluster = DevCluster(tmp_path_factory.mktemp("devcluster"))
    cluster.start()
    try:
        kubectl = Kubectl(ensure_binaries(build=False).kubectl, cluster.kubeconfig)
        kubectl.run("apply", "--server-side", "-f", str(CRD_DIR))
        kubectl.run("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kubectl(devcluster):
    return Kubectl(ensure_binaries(build=False).kubectl, devcluster.kubeconfig)


@pytest.fixture(scope="session")
def kube_api(devcluster):
    return devcluster.api()


@contextlib.contextmanager
def new_namespace(kube_api, prefix: str = "t-"):
    """A namespace of its own, ready for pods, deleted afterwards."""
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    # Pods are admitted only once the ServiceAccount controller has made the namespace's default account.
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        what=f"default ServiceAccount in {name}",
    )
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture
def namespace(devcluster, kube_api):
    with new_namespace(kube_api) as name:
        yield name


class WorkerThreads:
    """Client load from `workers` threads running `_run(worker)` until the context ends."""

    JOIN_SECONDS = 30.0

    def __init__(self, workers: int) -> None:
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(workers)]

    def _run(self, worker: int) -> None:
        raise NotImplementedError

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=self.JOIN_SECONDS)


OPERATOR_ENV = {"TOKENYARD_RESYNC_SECONDS": "2", "TOKENYARD_BIND_TIMEOUT_SECONDS": "5"}


def operator_process(
    kubeconfig: Path, log_path: Path, *extra: str, env: dict[str, str] | None = None
) -> ManagedProcess:
    args = ["tokenyard.operator", "--kubeconfig", str(kubeconfig), "--metrics-port", "0", *extra]
    return ManagedProcess(args, log_path, {**OPERATOR_ENV, **(env or {})})


def sim_pods_process(kubeconfig: Path, log_path: Path, time_scale: float = 0.05) -> ManagedProcess:
    args = ["tokenyard.sim", "pods", "--kubeconfig", str(kubeconfig), "--time-scale", str(time_scale)]
    return ManagedProcess(args, log_path)


def engine_scrape_config(devcluster: DevCluster) -> dict:
    """The chart's plain-Prometheus scrape job for the engine leaders (the labels its PodMonitor gives), reaching
    the local API server from outside the cluster."""
    (job,) = [
        job
        for job in prometheus.out_of_cluster(
            prometheus.chart_scrape_configs(ensure_binaries(build=False).helm, "default", interval="1s"),
            devcluster.server,
            ADMIN_TOKEN,
        )
        if job["job_name"] == "tokenyard-engines"
    ]
    return job


def prometheus_process(folder: Path, scrape_configs: list[dict]) -> tuple[ManagedProcess, str]:
    """A real Prometheus on a free loopback port, scraping every second: the one `make binaries` builds (it
    has Kubernetes service discovery, which Debian's package lacks)."""
    binary = ensure_binaries(build=False).prometheus
    if binary is None:
        pytest.fail("no prometheus in the binary cache; `make binaries` builds it")
    port = free_port()
    process = prometheus.prometheus_process(binary, folder, scrape_configs, port).start()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: prometheus.ready(url), timeout=30, what="Prometheus to be ready")
    return process, url


def prometheus_query(url: str, query: str) -> list[dict]:
    return prometheus.query(url, query, timeout=5)


class CuttableProxy:
    """A TCP proxy on 127.0.0.1 in front of a real server (TLS passes through untouched) that a test can cut:
    after `cut()`, bytes stop flowing on open connections and new connections are accepted but never answered —
    a server that hangs, the hardest kind of "down" for a client without timeouts."""

    def __init__(self, target_host: str, target_port: int) -> None:
        import socket
        import threading

        self.target = (target_host, target_port)
        self.cut_event = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: list = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def _accept(self) -> None:
        import socket
        import threading

        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            if self.cut_event.is_set():
                continue  # hold it open, never answer
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            self._sockets.append(upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source, sink) -> None:
        try:
            while not self.cut_event.is_set():
                data = source.recv(65536)
                if not data or self.cut_event.is_set():
                    break
                sink.sendall(data)
        except OSError:
            pass
        if not self.cut_event.is_set():  # a real close travels through; a cut leaves both ends hanging
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(2)

    def cut(self) -> None:
        self.cut_event.set()

    def close(self) -> None:
        self._closed = True
        for s in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                s.close()


def kubeconfig_through(kubeconfig: Path, proxy_port: int, out: Path) -> Path:
    """A copy of `kubeconfig` whose server is the proxy on `proxy_port` (same scheme and credentials)."""
    from urllib.parse import urlsplit

    doc = yaml.safe_load(kubeconfig.read_text())
    for cluster in doc["clusters"]:
        url = urlsplit(cluster["cluster"]["server"])
        cluster["cluster"]["server"] = f"{url.scheme}://127.0.0.1:{proxy_port}"
    out.write_text(yaml.safe_dump(doc))
    return out


def kubeconfig_as(kubeconfig: Path, kubectl: Kubectl, account: str, namespace: str, out: Path) -> Path:
    """A copy of `kubeconfig` that authenticates as ServiceAccount `namespace/account` (a fresh one-hour token),
    to run a component with exactly the access its RBAC gives it."""
    token = kubectl.run("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    doc = yaml.safe_load(kubeconfig.read_text())
    for user in doc["users"]:
        user["user"] = {"token": token}
    out.write_text(yaml.safe_dump(doc))
    return out
