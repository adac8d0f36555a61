"""The autoscaler stops when told (issue 19): SIGTERM while it holds the leader Lease, with the API server and
Prometheus hanging (connections accepted, never answered), and it exits 0 within its drain budget instead of
waiting on them forever."""

from __future__ import annotations

import socket
import time

import pytest
from kubernetes import client
from tokenyard.autoscaler.controller import DRAIN_SECONDS, LEASE_NAME, RELEASE_SECONDS

from tests.integration.conftest import CuttableProxy, ManagedProcess, kubeconfig_through, wait_for

pytestmark = pytest.mark.integration

# The process's whole budget after SIGTERM: the pass in flight, the Lease release, and interpreter exit.
EXIT_BUDGET_S = DRAIN_SECONDS + RELEASE_SECONDS + 3.0


def test_sigterm_with_the_api_server_and_prometheus_hanging_exits_within_the_drain_budget(
    devcluster, kube_api, namespace, tmp_path
):
    server = yaml_server(devcluster.kubeconfig)
    api_proxy = CuttableProxy(*server)
    hanging_prometheus = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    kubeconfig = kubeconfig_through(devcluster.kubeconfig, api_proxy.port, tmp_path / "kubeconfig")
    process = ManagedProcess(
        [
            "tokenyard.autoscaler",
            "--kubeconfig", str(kubeconfig),
            "--prometheus-url", f"http://127.0.0.1:{hanging_prometheus.getsockname()[1]}",
            "--lease-namespace", namespace,
            "--interval", "0.5",
        ],
        tmp_path / "autoscaler.log",
    ).start()  # fmt: skip
    try:
        leases = client.CoordinationV1Api(kube_api)
        wait_for(
            lambda: leases.read_namespaced_lease(LEASE_NAME, namespace).spec.holder_identity,
            timeout=30,
            what="the autoscaler to hold its Lease",
        )
        api_proxy.cut()
        started = time.monotonic()
        process.proc.terminate()
        try:
            code = process.proc.wait(timeout=EXIT_BUDGET_S + 10)
        except Exception:
            pytest.fail(f"still running {EXIT_BUDGET_S + 10:.0f}s after SIGTERM:\n{process.log()[-2000:]}")
        took = time.monotonic() - started
        assert code == 0, process.log()[-2000:]
        assert took <= EXIT_BUDGET_S, f"exited after {took:.1f}s, budget {EXIT_BUDGET_S}s"
        assert "could not release the leader Lease" in process.log()
    finally:
        process.stop(timeout=5)
        api_proxy.close()
        hanging_prometheus.close()


def yaml_server(kubeconfig) -> tuple[str, int]:
    from urllib.parse import urlsplit

    import yaml

    url = urlsplit(yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
    return url.hostname, url.port
