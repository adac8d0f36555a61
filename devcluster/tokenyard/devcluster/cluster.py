"""A real local Kubernetes control plane with fake GPU nodes.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as processes bound to 127.0.0.1,
each in its own process group so that stopping the cluster stops everything it started. The state folder holds
the certificates, keys, etcd data, logs, the admin kubeconfig and `state.json` (process ids and ports), which is
what lets `python -m tokenyard.devcluster down` stop a cluster that another process started.

Addresses: the API server, etcd and the controllers listen on loopback; kwok hands out pod IPs from
`POD_CIDR` inside 127.0.0.0/8, so a process listening on a pod's IP is reachable exactly like a pod. The
service CIDR is a range nothing dials (no kube-proxy runs here); it only names ClusterIPs.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tokenyard.devcluster.binaries import Binaries, ensure_binaries
from tokenyard.devcluster.topology import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE, Topology

# The default range of pod IPs; each cluster takes a /16 of 127.0.0.0/8 where nothing listens yet (unused_pod_cidr).
POD_CIDR = "127.1.0.0/16"
# Not dialled by anything: no kube-proxy runs, and the operator's group Services are headless.
SERVICE_CIDR = "127.96.0.0/16"
ADMIN_TOKEN = "tokenyard-admin-token"
DEFAULT_API_PORT = 6443
START_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


class ClusterError(RuntimeError):
    """The control plane could not start, or is not running."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        # As the servers do: connections of a stopped server lingering in TIME_WAIT do not make a port taken.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass
class ClusterState:
    """What a running cluster needs to be found and stopped again: persisted as state.json."""

    api_port: int
    etcd_port: int
    etcd_peer_port: int
    controller_manager_port: int
    scheduler_port: int
    kwok_port: int
    pids: dict[str, int] = field(default_factory=dict)
    # each process' start time (clock ticks after boot, /proc/PID/stat): after a reboot or a crash the pids
    # in this file may belong to someone else's processes, and `down` must not signal those
    started: dict[str, int] = field(default_factory=dict)
    topology: str = ""
    pod_cidr: str = POD_CIDR


def _insecure_tls() -> ssl.SSLContext:
    # The API server's serving certificate is self-signed, made at start in the cert folder.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class DevCluster:
    """Start, stop and inspect one local control plane living in `state_dir`."""

    def __init__(self, state_dir: Path, topology: Topology | None = None, api_port: int | None = None):
        self.state_dir = Path(state_dir)
        self.topology = topology or Topology()
        self.requested_api_port = api_port
        self.state: ClusterState | None = None
        self._procs: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------ paths
    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def server(self) -> str:
        assert self.state is not None
        return f"https://127.0.0.1:{self.state.api_port}"

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 120.0) -> None:
        """Start every component, create the fake GPU nodes, return when they are Ready."""
        if self.load() and self.running():
            raise ClusterError(
                f"a cluster is already running from {self.state_dir} (API {self.server}); stop it first"
            )
        binaries = ensure_binaries()
        api_port = self.requested_api_port or free_port()
        if not port_is_free(api_port):
            raise ClusterError(
                f"port {api_port} on 127.0.0.1 is taken by another process; choose another API port"
            )
        self.state = ClusterState(
            api_port=api_port,
            etcd_port=free_port(),
            etcd_peer_port=free_port(),
            controller_manager_port=free_port(),
            scheduler_port=free_port(),
            kwok_port=free_port(),
            topology=self.topology.describe(),
            pod_cidr=unused_pod_cidr(),
        )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        # Every `up` is a fresh cluster: objects left in etcd by an earlier run (nodes, pods of a topology that
        # may differ) would make this one's state depend on history.
        shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
        self._write_credentials()
        deadline = time.monotonic() + timeout
        try:
            self._spawn("etcd", self._etcd_cmd(binaries))
            self._await(
                lambda: self._http_ok(f"http://127.0.0.1:{self.state.etcd_port}/health"), "etcd", deadline
            )
            self._spawn("kube-apiserver", self._apiserver_cmd(binaries))
            self._await(
                lambda: self._http_ok(f"{self.server}/readyz", token=True), "kube-apiserver", deadline
            )
            self._spawn("kube-controller-manager", self._controller_manager_cmd(binaries))
            self._spawn("kube-scheduler", self._scheduler_cmd(binaries))
            self._create_nodes()
            self._spawn("kwok", self._kwok_cmd(binaries))
            self._await(self._nodes_ready, "kwok to mark the nodes Ready", deadline)
            self._await(
                lambda: self._http_ok(f"https://127.0.0.1:{self.state.scheduler_port}/healthz"),
                "kube-scheduler",
                deadline,
            )
            self._await(
                self._default_service_account, "kube-controller-manager (default ServiceAccount)", deadline
            )
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = 10.0) -> None:
        """Stop every process this cluster started (by pid, whole process group), newest first."""
        if self.state is None and not self.load():
            return
        pids = {name: pid for name, pid in self.state.pids.items() if self._ours(name)}
        for name in reversed(START_ORDER):
            pid = pids.get(name)
            if pid:
                _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name in reversed(START_ORDER):
            pid = pids.get(name)
            if not pid:
                continue
            while _alive(pid) and time.monotonic() < deadline:
                self._reap(name)
                time.sleep(0.05)
            if _alive(pid):
                _signal_group(pid, signal.SIGKILL)
            self._reap(name, block=True)
        self.state.pids, self.state.started = {}, {}
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()

    def restart_apiserver(self, down_seconds: float = 0.0, timeout: float = 60.0) -> None:
        """Stop the kube-apiserver, keep it down for `down_seconds`, start it again on the same port with the
        same certificates (etcd and every client keep running), and return once it is ready. For chaos tests:
        every watch of every client breaks and must resume by itself."""
        if self.state is None or "kube-apiserver" not in self.state.pids:
            raise ClusterError("no kube-apiserver of this cluster is running; start the cluster first")
        pid = self.state.pids["kube-apiserver"]
        _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while _alive(pid) and time.monotonic() < deadline:
            self._reap("kube-apiserver")
            time.sleep(0.05)
        if _alive(pid):
            _signal_group(pid, signal.SIGKILL)
        self._reap("kube-apiserver", block=True)
        time.sleep(down_seconds)
        self._spawn("kube-apiserver", self._apiserver_cmd(ensure_binaries(build=False)))
        self._await(
            lambda: self._http_ok(f"{self.server}/readyz", token=True),
            "kube-apiserver",
            time.monotonic() + timeout,
        )

    def load(self) -> bool:
        """Read state.json of a cluster started earlier (maybe by another process)."""
        if not self.state_file.exists():
            return False
        self.state = ClusterState(**json.loads(self.state_file.read_text()))
        return True

    def running(self) -> bool:
        return (
            self.state is not None and bool(self.state.pids) and all(self._ours(n) for n in self.state.pids)
        )

    def _ours(self, name: str) -> bool:
        """The recorded process is alive and is the one this cluster started (not a reused pid)."""
        pid = self.state.pids.get(name, 0)
        recorded = self.state.started.get(name)
        return _alive(pid) and (recorded is None or _start_ticks(pid) == recorded)

    def status(self) -> dict[str, object]:
        if self.state is None and not self.load():
            return {"running": False, "stateDir": str(self.state_dir)}
        return {
            "running": self.running(),
            "apiServer": self.server,
            "kubeconfig": str(self.kubeconfig),
            "topology": self.state.topology,
            "processes": {
                name: {"pid": pid, "alive": self._ours(name)} for name, pid in self.state.pids.items()
            },
            "apiReady": self._http_ok(f"{self.server}/readyz", token=True),
        }

    # ------------------------------------------------------------------ nodes
    def api(self):
        """A `kubernetes` ApiClient for the admin."""
        import urllib3
        from kubernetes import config

        # The serving certificate is self-signed and the kubeconfig says so; the warning per request is noise.
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        return config.new_client_from_config(str(self.kubeconfig))

    def add_nodes(self, nodes: list[dict], gpus: int | None = None) -> None:
        """Create fake GPU nodes (kwok takes them over through the annotation) with their GPU capacity."""
        from kubernetes import client

        core = client.CoreV1Api(self.api())
        status = self.topology.node_status()
        if gpus is not None:
            for key in ("capacity", "allocatable"):
                status["status"][key]["nvidia.com/gpu"] = str(gpus)
        for node in nodes:
            node["metadata"].setdefault("annotations", {})[KWOK_ANNOTATION] = KWOK_ANNOTATION_VALUE
            core.create_node(node)
            # The API server drops status on create; capacity goes through the status subresource.
            core.patch_node_status(node["metadata"]["name"], status)

    def _create_nodes(self) -> None:
        self.add_nodes(self.topology.nodes())

    def _nodes_ready(self) -> bool:
        from kubernetes import client

        nodes = client.CoreV1Api(self.api()).list_node().items
        return bool(nodes) and all(
            any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or [])) for n in nodes
        )

    def _default_service_account(self) -> bool:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            client.CoreV1Api(self.api()).read_namespaced_service_account("default", "default")
        except ApiException:
            return False
        return True

    # ------------------------------------------------------------------ processes
    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.log_dir / f"{name}.log", "ab")
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        log.close()
        self._procs[name] = proc
        self.state.pids[name] = proc.pid
        self.state.started[name] = _start_ticks(proc.pid) or 0
        self.state_file.write_text(json.dumps(asdict(self.state), indent=2))

    def _reap(self, name: str, block: bool = False) -> None:
        proc = self._procs.get(name)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5 if block else 0)
        else:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(self.state.pids.get(name, 0), 0 if block else os.WNOHANG)

    def _await(self, check, what: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    tail = _tail(self.log_dir / f"{name}.log")
                    raise ClusterError(
                        f"{name} exited with code {proc.returncode} while waiting for {what}:\n{tail}"
                    )
            try:
                if check():
                    return
            except Exception:  # the component is still coming up; its errors are expected until then
                pass
            time.sleep(0.2)
        raise ClusterError(f"timed out waiting for {what}; logs in {self.log_dir}")

    def _http_ok(self, url: str, token: bool = False) -> bool:
        request = urllib.request.Request(url)
        if token:
            request.add_header("Authorization", f"Bearer {ADMIN_TOKEN}")
        try:
            with urllib.request.urlopen(request, timeout=2, context=_insecure_tls()) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    # ------------------------------------------------------------------ credentials and commands
    def _write_credentials(self) -> None:
        pki = self.state_dir / "pki"
        pki.mkdir(exist_ok=True)
        key, pub = pki / "sa.key", pki / "sa.pub"
        if not key.exists():
            subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True)
            subprocess.run(
                ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(pub)],
                check=True,
                capture_output=True,
            )
        (pki / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "tokenyard-dev",
                            "cluster": {"server": self.server, "insecure-skip-tls-verify": True},
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
                    "contexts": [
                        {"name": "tokenyard-dev", "context": {"cluster": "tokenyard-dev", "user": "admin"}}
                    ],
                    "current-context": "tokenyard-dev",
                },
                indent=2,
            )
        )
        os.chmod(self.kubeconfig, 0o600)

    def _etcd_cmd(self, b: Binaries) -> list[str]:
        s = self.state
        return [
            str(b.etcd),
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{s.etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{s.etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{s.etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{s.etcd_peer_port}",
            f"--initial-cluster=default=http://127.0.0.1:{s.etcd_peer_port}",
            "--listen-metrics-urls=",
            "--unsafe-no-fsync",  # a throw-away test cluster: durability traded for speed on small disks
            "--quota-backend-bytes=2147483648",
        ]

    def _apiserver_cmd(self, b: Binaries) -> list[str]:
        s, pki = self.state, self.state_dir / "pki"
        return [
            str(b.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{s.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={s.api_port}",
            f"--cert-dir={pki}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            "--endpoint-reconciler-type=none",
            # New nodes would get a not-ready taint that only the node lifecycle controller removes; that
            # controller is off here (see the controller manager's flags), so the taint is not added at all.
            "--disable-admission-plugins=TaintNodesByCondition",
        ]

    def _controller_manager_cmd(self, b: Binaries) -> list[str]:
        s = self.state
        return [
            str(b.kube_controller_manager),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={s.controller_manager_port}",
            "--leader-elect=false",
            f"--service-account-private-key-file={self.state_dir / 'pki' / 'sa.key'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # No cloud, no node IPAM (kwok assigns pod IPs), no certificate signing. No node lifecycle either:
            # every fake node's heartbeat comes from one kwok process, so a node that misses its lease here only
            # means the machine was too busy for a moment, and marking its pods NotReady (which kwok never
            # reverts) would be wrong. Node failures are simulated by deleting pods or nodes.
            "--controllers=*,-node-ipam-controller,-cloud-node-lifecycle-controller,-service-lb-controller,"
            "-node-route-controller,-certificatesigningrequest-signing-controller,-node-lifecycle-controller,"
            "-taint-eviction-controller",
            "--concurrent-gc-syncs=5",
            "--profiling=false",
        ]

    def _scheduler_cmd(self, b: Binaries) -> list[str]:
        return [
            str(b.kube_scheduler),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.state.scheduler_port}",
            "--leader-elect=false",
            "--profiling=false",
        ]

    def _kwok_cmd(self, b: Binaries) -> list[str]:
        return [
            str(b.kwok),
            f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}={KWOK_ANNOTATION_VALUE}",
            f"--cidr={self.state.pod_cidr}",
            "--node-ip=127.0.0.1",
            f"--server-address=127.0.0.1:{self.state.kwok_port}",
        ]


def unused_pod_cidr() -> str:
    """A /16 of 127.0.0.0/8 for a new cluster's pod IPs in which no process listens. kwok hands out pod IPs from
    the start of its range, so two clusters on one machine (parallel test sessions, a demo beside the tests)
    sharing a range would put their engines on the same addresses: one's router would reach the other's
    engines. 127.0.x (127.0.0.1) and the service range 127.96.x stay out."""
    taken: set[int] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # LISTEN; the address is little-endian hex: 127.1.0.3 is 0300017F
                address = int(local.split(":")[0], 16)
                if address & 0xFF == 127:
                    taken.add((address >> 8) & 0xFF)
    free = [octet for octet in range(1, 96) if octet not in taken]
    return f"127.{random.choice(free or range(1, 96))}.0.0/16"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as gone
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                return False
    return True


def _start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks after boot (field 22 of /proc/PID/stat); None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
