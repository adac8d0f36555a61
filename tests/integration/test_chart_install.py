"""The Helm chart installed into the local control plane: every object is admitted by a real kube-apiserver
(schemas, RBAC, the peering object against its CRD), the operator's ServiceAccount gets exactly the access the
chart means to give, and an uninstall removes the cluster-scoped objects too.

The session fixture has applied charts/tokenyard/crds already, hence --skip-crds. The pods run no real image
(nothing pulls here); only the objects are checked.
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from tokenyard.devcluster.binaries import BinaryError, ensure_binaries

from tests.integration.conftest import ROOT, wait_for

pytestmark = pytest.mark.integration

CHART = ROOT / "charts" / "tokenyard"


@pytest.fixture(scope="module")
def helm_binary():
    try:
        return ensure_binaries(build=False).helm
    except BinaryError as e:
        pytest.skip(f"helm is not built: {e}")


def helm(binary, kubeconfig, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(binary), f"--kubeconfig={kubeconfig}", *args], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result


def test_chart_installs_with_least_privilege_and_uninstalls_cleanly(helm_binary, devcluster, kubectl, namespace):
    release = f"ty-{uuid.uuid4().hex[:6]}"
    peering = f"{release}-peering"  # cluster-scoped: unique per test run
    helm(
        helm_binary, devcluster.kubeconfig,
        "install", release, str(CHART), "--namespace", namespace, "--skip-crds",
        "--set", f"operator.peering.name={peering}",
    )  # fmt: skip
    try:
        operator = f"{release}-operator"
        for kind, name in [
            ("serviceaccount", operator),
            ("statefulset", operator),
            ("service", f"{operator}-metrics"),
            ("poddisruptionbudget", operator),
            ("deployment", f"{release}-router"),
            ("configmap", f"{release}-dashboard-operator"),
        ]:
            kubectl.run("get", "-n", namespace, kind, name)
        kubectl.run("get", "clusterrole", operator)
        kubectl.run("get", "clusterrolebinding", operator)
        kubectl.run("get", "clusterkopfpeering", peering)

        # The StatefulSet controller makes both peers, each with its ordinal label (the priority's source).
        def pod_indices():
            out = kubectl.run(
                "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator",
                "-o", "json",
            ).stdout  # fmt: skip
            return sorted(p["metadata"]["labels"].get("apps.kubernetes.io/pod-index", "") for p in json.loads(out)["items"])

        wait_for(lambda: pod_indices() == ["0", "1"], timeout=60, what="operator pods with pod-index labels 0 and 1")

        account = f"system:serviceaccount:{namespace}:{operator}"

        def can(verb: str, resource: str, *extra: str) -> bool:
            result = kubectl.run("auth", "can-i", verb, resource, f"--as={account}", *extra, check=False)
            return result.stdout.strip() == "yes"

        assert can("create", "pods", "-n", "default") and can("delete", "services", "-n", "default")
        assert can("watch", "nodes") and can("patch", "modeldeployments.tokenyard.dev/status", "-n", "default")
        assert can("patch", f"clusterkopfpeerings.kopf.dev/{peering}")
        assert not can("patch", "clusterkopfpeerings.kopf.dev/someone-else")
        assert not can("get", "secrets", "-n", "default")
        assert not can("delete", "nodes")
        assert not can("update", "pods", "-n", "default")
    finally:
        helm(helm_binary, devcluster.kubeconfig, "uninstall", release, "--namespace", namespace, "--wait")
    assert kubectl.run("get", "clusterrole", f"{release}-operator", check=False).returncode != 0
    assert kubectl.run("get", "clusterkopfpeering", peering, check=False).returncode != 0
