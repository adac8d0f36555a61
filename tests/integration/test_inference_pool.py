"""The operator publishes an InferencePool per ModelDeployment once the Inference Extension's CRD is served, on
the real control plane: without the CRD it says so once and serves on; with it (the published v1.6.0 manifest,
tests/fixtures/crds) the pool selects the group leaders, follows the spec, is put back after a hand edit, and
is garbage-collected by kube-controller-manager with its ModelDeployment."""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tokenyard.core import labels
from tokenyard.operator.manifests import POOL_GROUP, POOL_PLURAL, POOL_VERSION

from tests.integration.conftest import ROOT, kubeconfig_as, operator_process, wait_for
from tests.integration.test_chart_install import helm, helm_binary, install  # noqa: F401 (fixture)
from tests.integration.test_operator import GROUP, PLURAL, VERSION, get, mdep, ready_groups

pytestmark = pytest.mark.integration

POOL_CRD = ROOT / "tests" / "fixtures" / "crds" / "inference.networking.k8s.io_inferencepools.yaml"
POOL_CRD_NAME = f"{POOL_PLURAL}.{POOL_GROUP}"
PICKER_ENV = {"TOKENYARD_EPP_SERVICE": "ty-router", "TOKENYARD_EPP_PORT": "9002"}
NOT_SERVED = f"does not serve {POOL_PLURAL}.{POOL_GROUP}/{POOL_VERSION}"
SERVED = f"serves {POOL_PLURAL}.{POOL_GROUP}/{POOL_VERSION}"
ASKED = "API discovery: inferencepools"  # the publisher's debug line, once per discovery call


def install_pool_crd(kubectl) -> None:
    kubectl.run("apply", "--server-side", "-f", str(POOL_CRD))
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s", "crd", POOL_CRD_NAME)


def remove_pool_crd(kubectl) -> None:
    kubectl.run("delete", "crd", POOL_CRD_NAME, "--ignore-not-found", "--wait=true", "--timeout=60s")


@pytest.fixture(scope="module")
def operator(devcluster, kubectl, tmp_path_factory):
    remove_pool_crd(kubectl)  # another module of the session may have left it
    log = tmp_path_factory.mktemp("operator-pool") / "operator.log"
    op = operator_process(devcluster.kubeconfig, log, "--verbose", env=PICKER_ENV).start()
    yield op
    op.stop()
    remove_pool_crd(kubectl)  # the cluster as the other modules expect it


@pytest.fixture
def apis(kube_api):
    return client.CustomObjectsApi(kube_api), client.CoreV1Api(kube_api)


def read_pool(apis, namespace, name):
    try:
        return apis[0].get_namespaced_custom_object(POOL_GROUP, POOL_VERSION, namespace, POOL_PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def test_without_the_crd_the_operator_says_so_once_and_serves_on(operator, apis, namespace):
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("plain", tensor=2, replicas=2)
    )
    wait_for(
        ready_groups(apis, namespace, "plain", 2), timeout=60, what="2 groups Ready without the pool CRD"
    )
    # Discovery is asked again each resync interval (2 s here); wait for several answers, then count the lines.
    wait_for(lambda: operator.log().count(ASKED) >= 3, timeout=30, what="three discovery answers")
    log = operator.log()
    assert log.count(NOT_SERVED) == 1, "the missing CRD must be said once, not on every pass"
    assert "reconcile failed" not in log and operator.alive()


def test_the_pool_follows_its_deployment_once_the_crd_is_served(operator, apis, kubectl, namespace):
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("chat", tensor=2, replicas=2)
    )
    deployment = wait_for(ready_groups(apis, namespace, "chat", 2), timeout=60, what="2 groups Ready")
    install_pool_crd(kubectl)

    pool = wait_for(lambda: read_pool(apis, namespace, "chat"), timeout=30, what="the InferencePool of chat")
    spec = pool["spec"]
    assert spec["targetPorts"] == [{"number": 8000}]
    assert spec["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "ty-router",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    owner = pool["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "ModelDeployment",
        "chat",
        deployment["metadata"]["uid"],
    )
    # The selector picks exactly the group leaders: one pod per group, the pods that serve the API.
    match = ",".join(f"{k}={v}" for k, v in spec["selector"]["matchLabels"].items())
    selected = apis[1].list_namespaced_pod(namespace, label_selector=match).items
    leaders = {f"{g['index']}" for g in get(apis, namespace, "chat")["status"]["groups"]}
    assert sorted(p.metadata.labels[labels.GROUP_INDEX] for p in selected) == sorted(leaders)
    assert {p.metadata.labels[labels.RANK] for p in selected} == {"0"}
    assert operator.log().count(SERVED) == 1

    # The spec changes: the pool follows (the port of the new revision).
    apis[0].patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "chat", {"spec": {"engine": {"port": 8100}}}
    )
    wait_for(
        lambda: read_pool(apis, namespace, "chat")["spec"]["targetPorts"] == [{"number": 8100}],
        timeout=30,
        what="the pool's target port to follow the engine port",
    )
    # The log line follows the write the API server already shows: await it rather than race it.
    wait_for(
        lambda: f"InferencePool {namespace}/chat updated (spec.targetPorts)" in operator.log(),
        timeout=10,
        what="the operator to log the pool's update",
    )

    # A hand edit that would select the workers too is put back.
    apis[0].patch_namespaced_custom_object(
        POOL_GROUP,
        POOL_VERSION,
        namespace,
        POOL_PLURAL,
        "chat",
        {"spec": {"selector": {"matchLabels": {labels.ROLE: None}}}},
    )
    wait_for(
        lambda: (
            read_pool(apis, namespace, "chat")["spec"]["selector"]["matchLabels"].get(labels.ROLE) == "leader"
        ),
        timeout=30,
        what="the selector put back",
    )

    # Deleted with its owner: kube-controller-manager's garbage collector removes it.
    apis[0].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "chat")
    wait_for(
        lambda: read_pool(apis, namespace, "chat") is None, timeout=60, what="the pool garbage-collected"
    )
    assert "reconcile failed" not in operator.log() and operator.alive()


def test_the_chart_rbac_is_enough_to_publish_pools(
    operator,
    helm_binary,  # noqa: F811 (the fixture imported above)
    devcluster,
    kubectl,
    apis,
    namespace,
    tmp_path,
):
    """The chart with inferencePool.enabled, and a second operator (namespaced to this test) running with nothing
    but the token of the chart's ServiceAccount and the pool settings the chart gives it: the pool is created and
    updated, and nothing is refused (a server-side apply that creates needs `create` as well as `patch`)."""
    release = f"ty-{uuid.uuid4().hex[:6]}"  # its ClusterRole is cluster-scoped: unique per run
    install(
        helm_binary,
        devcluster.kubeconfig,
        release,
        namespace,
        "operator.peering.enabled=false",
        f"operator.watchNamespaces={{{namespace}}}",
        "router.epp.enabled=true",
        "inferencePool.enabled=true",
    )
    install_pool_crd(kubectl)
    kubeconfig = kubeconfig_as(
        devcluster.kubeconfig, kubectl, f"{release}-operator", namespace, tmp_path / "sa"
    )
    chart_env = {"TOKENYARD_INFERENCE_POOL": "auto", "TOKENYARD_EPP_SERVICE": f"{release}-router"}
    scoped = operator_process(kubeconfig, tmp_path / "operator.log", "--namespace", namespace, env=chart_env)
    # The module's cluster-wide operator would publish this namespace's pools too: pause it for this test.
    operator.stop()
    scoped.start()
    try:
        apis[0].create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, mdep("rbac", tensor=2))
        pool = wait_for(
            lambda: read_pool(apis, namespace, "rbac"), timeout=60, what="the pool, with chart RBAC"
        )
        assert pool["spec"]["endpointPickerRef"]["name"] == f"{release}-router"
        router_service = apis[1].read_namespaced_service(f"{release}-router", namespace)
        assert {(p.name, p.port) for p in router_service.spec.ports} >= {("epp", 9002)}
        apis[0].patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "rbac", {"spec": {"engine": {"port": 8200}}}
        )
        wait_for(
            lambda: read_pool(apis, namespace, "rbac")["spec"]["targetPorts"] == [{"number": 8200}],
            timeout=30,
            what="the pool updated, with chart RBAC",
        )
        log = scoped.log()
        assert "Forbidden" not in log and "cannot be published" not in log, log[-3000:]
    finally:
        scoped.stop()
        operator.start()
        helm(helm_binary, devcluster.kubeconfig, "uninstall", release, "--namespace", namespace, "--wait")
