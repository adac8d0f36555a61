"""The operator against the real control plane: groups as gangs on fake GPU nodes."""

from __future__ import annotations

import signal

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tokenyard.core import labels

from tests.integration.conftest import operator_process, wait_for

pytestmark = pytest.mark.integration

GROUP, VERSION, PLURAL = labels.GROUP, labels.VERSION, "modeldeployments"


@pytest.fixture(scope="module")
def operator(devcluster, tmp_path_factory):
    op = operator_process(devcluster.kubeconfig, tmp_path_factory.mktemp("operator") / "operator.log").start()
    yield op
    op.stop()


@pytest.fixture
def apis(kube_api):
    return client.CustomObjectsApi(kube_api), client.CoreV1Api(kube_api)


def mdep(name, tensor=4, replicas=1, **extra):
    spec = {
        "model": {"weights": {"uri": f"hf://org/{name}"}},
        "engine": {"image": "vllm/vllm-openai:v0.13.0"},
        "parallelism": {"tensor": tensor},
        "replicas": replicas,
        **extra,
    }
    return {
        "apiVersion": labels.API_VERSION,
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def get(apis, ns, name):
    return apis[0].get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def engine_pods(apis, ns, name, **selectors):
    selector = ",".join([f"{labels.MODEL_DEPLOYMENT}={name}", *(f"{k}={v}" for k, v in selectors.items())])
    return [
        p
        for p in apis[1].list_namespaced_pod(ns, label_selector=selector).items
        if not p.metadata.deletion_timestamp
    ]


def ready_groups(apis, ns, name, count, revision=None):
    def check():
        obj = get(apis, ns, name)
        status = obj.get("status", {})
        groups = [g for g in status.get("groups", []) if g["phase"] == "Ready"]
        if revision:
            groups = [g for g in groups if g["revision"] == revision]
        live = engine_pods(apis, ns, name)
        expected_pods = count * max((g["pods"] for g in status.get("groups", [])), default=1)
        done = (
            status.get("observedGeneration") == obj["metadata"]["generation"]
            and len(groups) == count
            and status.get("replicas") == count
            and len(live) == expected_pods
        )
        return obj if done else None

    return check


def test_groups_are_created_as_gangs_pinned_inside_the_required_domain(operator, apis, namespace):
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("big", tensor=16, replicas=1, placement={"required": "rack"})
    )
    obj = wait_for(ready_groups(apis, namespace, "big", 1), timeout=60, what="one TP=16 group Ready")
    group = obj["status"]["groups"][0]
    assert group["pods"] == 2 and len(set(group["nodes"])) == 2
    pods = sorted(engine_pods(apis, namespace, "big"), key=lambda p: p.metadata.labels[labels.RANK])
    assert [p.metadata.labels[labels.ROLE] for p in pods] == ["leader", "worker"]
    nodes = {n.metadata.name: n for n in apis[1].list_node().items}
    racks = {nodes[p.spec.node_name].metadata.labels[labels.NODE_RACK] for p in pods}
    assert len(racks) == 1, "a rack-required group spans racks"
    env = {e.name: e.value for e in pods[1].spec.containers[0].env}
    assert env[labels.ENV_RANK] == "1" and env[labels.ENV_GROUP_SIZE] == "2"
    assert env[labels.ENV_LEADER_ADDRESS].startswith("r0.") and env[labels.ENV_TENSOR_PARALLEL] == "16"
    assert pods[0].spec.containers[0].resources.limits[labels.GPU_RESOURCE] == "8"
    # The headless Service of the group exists and is owned by the ModelDeployment.
    services = (
        apis[1].list_namespaced_service(namespace, label_selector=f"{labels.MODEL_DEPLOYMENT}=big").items
    )
    assert len(services) == 1 and services[0].spec.cluster_ip == "None"
    assert services[0].metadata.owner_references[0].kind == "ModelDeployment"


def test_scale_up_and_down_through_the_scale_subresource(operator, apis, kubectl, namespace):
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("s", tensor=2, replicas=1)
    )
    wait_for(ready_groups(apis, namespace, "s", 1), timeout=60, what="1 group")
    kubectl.run("scale", "mdep", "s", "--replicas=4", "-n", namespace)
    wait_for(ready_groups(apis, namespace, "s", 4), timeout=60, what="4 groups after scale-up")
    kubectl.run("scale", "mdep", "s", "--replicas=2", "-n", namespace)
    obj = wait_for(ready_groups(apis, namespace, "s", 2), timeout=60, what="2 groups after scale-down")
    assert obj["status"]["readyReplicas"] == 2
    scale = apis[0].get_namespaced_custom_object_scale(GROUP, VERSION, namespace, PLURAL, "s")
    assert scale["status"]["replicas"] == 2 and "tokenyard.dev/role=leader" in scale["status"]["selector"]


def nodes_by_rank(pods):
    return [p.spec.node_name for p in sorted(pods, key=lambda p: int(p.metadata.labels[labels.RANK]))]


def test_a_failed_member_recreates_the_whole_group_on_the_same_nodes(operator, apis, namespace):
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("gang", tensor=16, replicas=1)
    )
    wait_for(ready_groups(apis, namespace, "gang", 1), timeout=60, what="the group Ready")
    before = {p.metadata.uid for p in engine_pods(apis, namespace, "gang")}
    nodes_before = nodes_by_rank(engine_pods(apis, namespace, "gang"))
    worker = engine_pods(apis, namespace, "gang", **{labels.ROLE: "worker"})[0]
    apis[1].delete_namespaced_pod(worker.metadata.name, namespace, grace_period_seconds=0)

    def recreated():
        pods = engine_pods(apis, namespace, "gang")
        uids = {p.metadata.uid for p in pods}
        return len(pods) == 2 and not (uids & before) and ready_groups(apis, namespace, "gang", 1)()

    wait_for(recreated, timeout=60, what="both members recreated (the leader too)")
    # Nothing else took those GPUs meanwhile, so the gang goes back where it was, rank by rank.
    assert nodes_by_rank(engine_pods(apis, namespace, "gang")) == nodes_before
    wait_for(
        lambda: any(e.reason == "GroupRecreated" for e in apis[1].list_namespaced_event(namespace).items),
        timeout=15,
        what="a GroupRecreated event",
    )


def test_revision_update_rolls_groups_with_surge_and_never_drops_capacity(operator, apis, namespace):
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("roll", tensor=2, replicas=3)
    )
    first = wait_for(ready_groups(apis, namespace, "roll", 3), timeout=60, what="3 groups")
    old_revision = first["status"]["updateRevision"]
    apis[0].patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "roll", {"spec": {"engine": {"image": "vllm/vllm-openai:v0.12.0"}}}
    )
    min_ready_seen = 3
    max_groups_seen = 0

    def rolled():
        nonlocal min_ready_seen, max_groups_seen
        obj = get(apis, namespace, "roll")
        leaders = engine_pods(apis, namespace, "roll", **{labels.ROLE: "leader"})
        ready = [
            p
            for p in leaders
            if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]
        min_ready_seen = min(min_ready_seen, len(ready))
        max_groups_seen = max(max_groups_seen, len(leaders))
        new = obj["status"].get("updateRevision")
        return new != old_revision and ready_groups(apis, namespace, "roll", 3, revision=new)()

    obj = wait_for(rolled, timeout=120, interval=0.05, what="every group at the new revision")
    assert obj["status"]["updatedReplicas"] == 3
    assert min_ready_seen >= 3, "serving capacity dropped below replicas during the update"
    assert max_groups_seen <= 4, "more groups than replicas + maxSurge"
    assert [h["revision"] for h in obj["status"]["revisionHistory"]][-2:] == [
        old_revision,
        obj["status"]["updateRevision"],
    ]


def test_deleting_the_deployment_garbage_collects_its_pods_and_services(operator, apis, namespace):
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("gone", tensor=4, replicas=2)
    )
    wait_for(ready_groups(apis, namespace, "gone", 2), timeout=60, what="2 groups")
    apis[0].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gone")

    def collected():
        pods = apis[1].list_namespaced_pod(namespace, label_selector=f"{labels.MODEL_DEPLOYMENT}=gone").items
        services = (
            apis[1].list_namespaced_service(namespace, label_selector=f"{labels.MODEL_DEPLOYMENT}=gone").items
        )
        return not pods and not services

    wait_for(collected, timeout=60, what="the garbage collector to remove pods and Services")


def test_insufficient_capacity_is_reported_and_recovers_when_nodes_are_added(
    operator, apis, devcluster, namespace
):
    product = f"NVIDIA-B200-{namespace}"  # a GPU product no node has yet: isolates this test's capacity
    apis[0].create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        mdep("wait", tensor=8, replicas=1, placement={"gpuProduct": product}),
    )

    def insufficient():
        conditions = {
            c["type"]: c for c in get(apis, namespace, "wait").get("status", {}).get("conditions", [])
        }
        return (
            conditions.get("InsufficientCapacity", {}).get("status") == "True"
            and conditions["InsufficientCapacity"]
        )

    condition = wait_for(insufficient, timeout=30, what="InsufficientCapacity")
    assert "8" in condition["message"] and product in condition["message"]
    assert engine_pods(apis, namespace, "wait") == [], "a partial group was created"
    wait_for(
        lambda: any(
            e.reason == "InsufficientCapacity" for e in apis[1].list_namespaced_event(namespace).items
        ),
        timeout=15,
        what="an InsufficientCapacity event",
    )

    node = devcluster.topology.node(f"extra-{namespace}", "zone-z", "zone-z-rack-0", "zone-z-rack-0-nvl-0")
    node["metadata"]["labels"][labels.NODE_GPU_PRODUCT] = product
    devcluster.add_nodes([node])
    try:
        obj = wait_for(
            ready_groups(apis, namespace, "wait", 1), timeout=60, what="the group placed on the new node"
        )
        assert obj["status"]["groups"][0]["nodes"] == [f"extra-{namespace}"]
        assert {c["type"]: c["status"] for c in obj["status"]["conditions"]}[
            "InsufficientCapacity"
        ] == "False"
    finally:
        apis[0].delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "wait")
        try:
            apis[1].delete_node(f"extra-{namespace}")
        except ApiException:
            pass


def test_operator_killed_mid_update_converges_without_duplicates(operator, apis, namespace):
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("crash", tensor=1, replicas=4)
    )
    wait_for(ready_groups(apis, namespace, "crash", 4), timeout=60, what="4 groups")
    apis[0].patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "crash", {"spec": {"engine": {"args": ["--seed=2"]}}}
    )
    # Kill -9 as soon as the update has begun (a surge group exists), then start a fresh operator.
    wait_for(lambda: len(engine_pods(apis, namespace, "crash")) > 4, timeout=30, what="the update to start")
    operator.stop(sig=signal.SIGKILL)
    operator.start()
    obj = wait_for(
        lambda: (
            (o := get(apis, namespace, "crash"))["status"].get("updatedReplicas") == 4
            and ready_groups(apis, namespace, "crash", 4, revision=o["status"]["updateRevision"])()
        ),
        timeout=120,
        what="the update to finish after the restart",
    )
    pods = engine_pods(apis, namespace, "crash")
    assert len(pods) == 4 and len({p.metadata.labels[labels.GROUP_INDEX] for p in pods}) == 4
    assert {p.metadata.labels[labels.REVISION] for p in pods} == {obj["status"]["updateRevision"]}


def rollout_of(apis, ns, name):
    return get(apis, ns, name).get("status", {}).get("rollout") or {}


def command(apis, ns, name, kind):
    import json
    import uuid

    annotation = json.dumps({"command": kind, "id": uuid.uuid4().hex})
    apis[0].patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        name,
        {"metadata": {"annotations": {"tokenyard.dev/rollout-command": annotation}}},
    )


CANARY = {"strategy": "Canary", "drainSeconds": 1, "steps": [{"setWeight": 50}, {"pause": {}}]}


def plugin(devcluster, namespace, *args):
    from tokenyard.operator import kubectl_plugin

    return kubectl_plugin.main(
        ["--kubeconfig", str(devcluster.kubeconfig), "-n", namespace, "rollout", *args]
    )


def test_canary_waits_for_promote_then_moves_traffic_and_drains_the_old_revision(
    operator, apis, devcluster, namespace
):
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("can", tensor=1, replicas=2, rollout=CANARY)
    )
    first = wait_for(ready_groups(apis, namespace, "can", 2), timeout=60, what="2 stable groups")
    stable = first["status"]["updateRevision"]
    assert first["status"]["traffic"] == [{"revision": stable, "weight": 100}]
    apis[0].patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "can", {"spec": {"engine": {"image": "v2"}}}
    )

    def paused_at_half():
        obj = get(apis, namespace, "can")
        weights = {t["revision"]: t["weight"] for t in obj["status"].get("traffic", [])}
        rollout = obj["status"].get("rollout") or {}
        canary = rollout.get("canaryRevision")
        return rollout.get("phase") == "Paused" and canary and weights.get(canary) == 50 and obj

    obj = wait_for(paused_at_half, timeout=60, what="the canary at weight 50, paused until promoted")
    canary = obj["status"]["rollout"]["canaryRevision"]
    by_revision = {}
    for g in obj["status"]["groups"]:
        by_revision[g["revision"]] = by_revision.get(g["revision"], 0) + 1
    assert by_revision[stable] == 2, "the stable revision lost capacity before promotion"
    assert by_revision[canary] == 1

    assert plugin(devcluster, namespace, "promote", "can") == 0

    def healthy():
        obj = get(apis, namespace, "can")
        rollout = obj["status"].get("rollout") or {}
        pods = engine_pods(apis, namespace, "can")
        return (
            rollout.get("phase") == "Healthy"
            and obj["status"]["currentRevision"] == canary
            and {p.metadata.labels[labels.REVISION] for p in pods} == {canary}
            and len(pods) == 2
            and obj
        )

    obj = wait_for(healthy, timeout=90, what="promotion and the old revision drained")
    assert {t["revision"]: t["weight"] for t in obj["status"]["traffic"]}[canary] == 100

    # `kubectl tokenyard rollout undo` rolls the previous revision out again, as a new canary.
    assert plugin(devcluster, namespace, "undo", "can") == 0
    wait_for(
        lambda: rollout_of(apis, namespace, "can").get("canaryRevision") == stable,
        timeout=30,
        what="the previous revision rolled out again",
    )


def test_abort_rolls_back_at_once_and_keeps_the_stable_groups(operator, apis, namespace):
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("abort", tensor=1, replicas=2, rollout=CANARY)
    )
    stable = wait_for(ready_groups(apis, namespace, "abort", 2), timeout=60, what="2 groups")["status"][
        "updateRevision"
    ]
    stable_pods = {p.metadata.uid for p in engine_pods(apis, namespace, "abort")}
    apis[0].patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "abort", {"spec": {"engine": {"image": "v2"}}}
    )
    wait_for(
        lambda: rollout_of(apis, namespace, "abort").get("phase") == "Paused",
        timeout=60,
        what="the pause step",
    )
    command(apis, namespace, "abort", "abort")

    seen = {}

    def rolled_back():
        obj = get(apis, namespace, "abort")
        pods = engine_pods(apis, namespace, "abort")
        weights = {t["revision"]: t["weight"] for t in obj["status"].get("traffic", [])}
        seen.update(
            rollout=obj["status"].get("rollout"),
            weights=weights,
            pods=[p.metadata.name for p in pods],
            same_pods={p.metadata.uid for p in pods} == stable_pods,
        )
        return (
            (obj["status"].get("rollout") or {}).get("phase") == "RolledBack"
            and {p.metadata.uid for p in pods} == stable_pods
            and weights.get(stable) == 100
        )

    try:
        wait_for(rolled_back, timeout=60, what="the rollback, with the canary's groups removed")
    except BaseException as failure:
        raise AssertionError(f"last seen: {seen}") from failure


def test_analysis_without_prometheus_is_inconclusive_and_pauses(operator, apis, namespace):
    rollout = {"strategy": "Canary", "steps": [{"setWeight": 50}, {"analysis": {"timeoutSeconds": 5}}]}
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("inc", tensor=1, replicas=1, rollout=rollout)
    )
    wait_for(ready_groups(apis, namespace, "inc", 1), timeout=60, what="1 group")
    apis[0].patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "inc", {"spec": {"engine": {"image": "v2"}}}
    )

    def paused_inconclusive():
        r = rollout_of(apis, namespace, "inc")
        return (
            r.get("phase") == "Paused"
            and "Prometheus" in (r.get("reason") or "") + str(r.get("analysis"))
            and r
        )

    r = wait_for(paused_inconclusive, timeout=60, what="an inconclusive analysis to pause the rollout")
    assert r["state"]["pauseReason"] == "AnalysisInconclusive"


def test_operator_killed_mid_rollout_resumes_at_the_same_step(operator, apis, namespace):
    rollout = {
        "strategy": "Canary",
        "drainSeconds": 1,
        "steps": [{"setWeight": 25}, {"pause": {}}, {"setWeight": 75}, {"pause": {}}],
    }
    apis[0].create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, mdep("resume", tensor=1, replicas=4, rollout=rollout)
    )
    wait_for(ready_groups(apis, namespace, "resume", 4), timeout=60, what="4 groups")
    apis[0].patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "resume", {"spec": {"engine": {"image": "v2"}}}
    )
    at_step = wait_for(
        lambda: (r := rollout_of(apis, namespace, "resume")).get("phase") == "Paused" and r,
        timeout=60,
        what="the first pause",
    )
    assert at_step["step"] == 1
    operator.stop(sig=signal.SIGKILL)
    operator.start()
    command(apis, namespace, "resume", "promote")
    # The restarted operator continues from step 1: the next pause is step 3, at weight 75.
    second = wait_for(
        lambda: (
            (r := rollout_of(apis, namespace, "resume")).get("phase") == "Paused" and r["step"] == 3 and r
        ),
        timeout=90,
        what="the second pause after the restart",
    )
    weights = {t["revision"]: t["weight"] for t in get(apis, namespace, "resume")["status"]["traffic"]}
    assert weights[second["canaryRevision"]] == 75 and weights[second["stableRevision"]] == 25
