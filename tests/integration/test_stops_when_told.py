"""Every long-running component stops when told (issue 19): SIGTERM after the API server (and Prometheus, and
Redis) start to hang — connections accepted, never answered, the hardest kind of "down" for a client without
timeouts — and the process exits 0 within its drain budget instead of waiting on them forever."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client
from tokenyard.autoscaler.controller import DRAIN_SECONDS, LEASE_NAME, RELEASE_SECONDS

from tests.integration.conftest import (
    CuttableProxy,
    ManagedProcess,
    kubeconfig_through,
    operator_process,
    wait_for,
)

pytestmark = pytest.mark.integration

ROUTER_DRAIN_S = 3.0
# Each component's whole budget after SIGTERM (its drain, then interpreter exit).
BUDGET_S = {
    "autoscaler": DRAIN_SECONDS + RELEASE_SECONDS + 3.0,
    "router": ROUTER_DRAIN_S + 5.0,
    "sim-pods": 10.0,
    "operator": 15.0,
    # the chart's default: a StatefulSet of replicas in a Kopf peering, whose stop says goodbye to the peering
    "operator-peering": 15.0,
}
PEERING = "stop-test"


def api_server_address(kubeconfig) -> tuple[str, int]:
    url = urlsplit(yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
    return url.hostname, url.port


@pytest.fixture
def hanging_server():
    """A loopback port that accepts connections (into its backlog) and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def start(component: str, kubeconfig, namespace: str, hanging: str, log) -> ManagedProcess:
    if component == "autoscaler":
        args = ["tokenyard.autoscaler", "--kubeconfig", str(kubeconfig), "--prometheus-url", f"http://{hanging}",
                "--lease-namespace", namespace, "--interval", "0.5"]  # fmt: skip
    elif component == "router":
        args = ["tokenyard.router", "--kubeconfig", str(kubeconfig), "--namespace", namespace, "--port", "0",
                "--grpc-port", "0", "--metrics-port", "0", "--redis-url", f"redis://{hanging}",
                "--drain-timeout", str(ROUTER_DRAIN_S)]  # fmt: skip
    elif component == "sim-pods":
        args = ["tokenyard.sim", "pods", "--kubeconfig", str(kubeconfig)]
    elif component == "operator-peering":
        peering = ("--peering", PEERING, "--priority", "1")
        return operator_process(kubeconfig, log, "--namespace", namespace, *peering).start()
    else:
        return operator_process(kubeconfig, log, "--namespace", namespace).start()
    return ManagedProcess(args, log).start()


def working(component: str, process: ManagedProcess, kube_api, namespace: str) -> bool:
    """The component has done its first real work against the API server."""
    if component == "autoscaler":
        lease = client.CoordinationV1Api(kube_api).read_namespaced_lease(LEASE_NAME, namespace)
        return bool(lease.spec.holder_identity)
    if component == "operator" and "Initial authentication has finished" not in process.log():
        return False
    if component == "operator-peering" and "Resuming operations" not in process.log():
        return False  # a peered replica starts paused and resumes once the peering says it may work
    return time.monotonic() - process.started_at > 4.0


@pytest.mark.parametrize("component", list(BUDGET_S))
def test_sigterm_with_its_dependencies_hanging_exits_within_budget(
    component, devcluster, kube_api, namespace, hanging_server, tmp_path
):
    if component == "operator-peering":
        client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
            "kopf.dev", "v1", namespace, "kopfpeerings",
            {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": PEERING}},
        )  # fmt: skip
    api_proxy = CuttableProxy(*api_server_address(devcluster.kubeconfig))
    kubeconfig = kubeconfig_through(devcluster.kubeconfig, api_proxy.port, tmp_path / "kubeconfig")
    log = tmp_path / f"{component}.log"
    process = start(component, kubeconfig, namespace, hanging_server, log)
    process.started_at = time.monotonic()
    try:
        wait_for(
            lambda: working(component, process, kube_api, namespace), timeout=30, what=f"{component} working"
        )
        assert process.alive(), process.log()[-2000:]
        api_proxy.cut()
        started = time.monotonic()
        process.proc.terminate()
        budget = BUDGET_S[component]
        try:
            code = process.proc.wait(timeout=budget + 15)
        except Exception:
            pytest.fail(
                f"{component} still running {budget + 15:.0f}s after SIGTERM:\n{process.log()[-3000:]}"
            )
        took = time.monotonic() - started
        assert code == 0, process.log()[-3000:]
        assert took <= budget, (
            f"{component} exited after {took:.1f}s, budget {budget}s:\n{process.log()[-2000:]}"
        )
    finally:
        process.stop(timeout=5)
        api_proxy.close()
