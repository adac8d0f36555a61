"""Fixtures of the integration tier: one real local control plane per test session, a namespace per test.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok) starts only when a
test asks for it, in a temporary folder on free ports, and every process it started is stopped at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from tokenyard.core.process import stop_process
from tokenyard.devcluster.binaries import ensure_binaries
from tokenyard.devcluster.cluster import DevCluster

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "charts" / "tokenyard" / "crds"


def poll_until(check, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """Poll `check` until it returns a truthy value (and return it); TimeoutError naming `what`, with the last
    error `check` raised, when the deadline passes. For scripts; tests use `wait_for`."""
    deadline = time.monotonic() + timeout
    last_error = None
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


def wait_for(check, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """`poll_until` that fails the test when the deadline passes."""
    try:
        return poll_until(check, timeout, interval, what)
    except TimeoutError as e:
        pytest.fail(str(e))


class Kubectl:
    """The real kubectl against the test cluster."""

    def __init__(self, binary: Path, kubeconfig: Path):
        self.binary, self.kubeconfig = binary, kubeconfig

    def run(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def apply(self, manifest: dict | str, namespace: str, check: bool = True) -> subprocess.CompletedProcess:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        return self.run("apply", "-n", namespace, "-f", "-", input=text, check=check)


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


@pytest.fixture
def namespace(devcluster, kube_api):
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    # Pods are admitted only once the ServiceAccount controller has made the namespace's default account.
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        what=f"default ServiceAccount in {name}",
    )
    yield name
    core.delete_namespace(name)


class ManagedProcess:
    """A `python -m tokenyard.<component>` child process with its log in a file, stopped by its pid."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None):
        self.args, self.log_path, self.env = args, log_path, env or {}
        self.proc: subprocess.Popen | None = None

    def start(self) -> ManagedProcess:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *self.args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env},
        )
        log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout=timeout, sig=sig)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


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
    """Prometheus' Kubernetes service discovery of the engine leaders, against the local API server."""
    from tokenyard.devcluster.cluster import ADMIN_TOKEN

    keep = lambda label, value: {"source_labels": [label], "regex": value, "action": "keep"}  # noqa: E731
    copy = lambda label, target: {"source_labels": [label], "target_label": target}  # noqa: E731
    return {
        "job_name": "engines",
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "kubernetes_sd_configs": [
            {
                "role": "pod",
                "api_server": devcluster.server,
                "tls_config": {"insecure_skip_verify": True},
                "authorization": {"credentials": ADMIN_TOKEN},
            }
        ],
        "relabel_configs": [
            keep("__meta_kubernetes_pod_label_app_kubernetes_io_component", "engine"),
            keep("__meta_kubernetes_pod_label_tokenyard_dev_role", "leader"),
            keep("__meta_kubernetes_pod_container_port_name", "http"),
            copy("__meta_kubernetes_namespace", "namespace"),
            copy("__meta_kubernetes_pod_label_tokenyard_dev_model_deployment", "model_deployment"),
            copy("__meta_kubernetes_pod_label_tokenyard_dev_revision", "revision"),
            copy("__meta_kubernetes_pod_name", "pod"),
        ],
    }


def prometheus_process(folder: Path, scrape_configs: list[dict]) -> tuple[ManagedProcess, str]:
    """A real Prometheus on a free loopback port, scraping every second: the one `make binaries` builds (it
    has Kubernetes service discovery, which Debian's package lacks)."""
    import socket

    binary = ensure_binaries(build=False).prometheus
    if binary is None:
        pytest.fail("no prometheus in the binary cache; `make binaries` builds it")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = folder / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": scrape_configs,
            }
        )
    )
    process = ManagedProcess([], folder / "prometheus.log")
    process.args = [
        f"--config.file={config}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    log = open(process.log_path, "ab")
    process.proc = subprocess.Popen(
        [binary, *process.args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _http_ok(f"{url}/-/ready"), timeout=30, what="Prometheus to be ready")
    return process, url


def _http_ok(url: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200


def prometheus_query(url: str, query: str) -> list[dict]:
    import json
    import urllib.parse
    import urllib.request

    with urllib.request.urlopen(
        f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=5
    ) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


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
