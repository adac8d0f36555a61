import pytest
from tokenyard.core import labels
from tokenyard.router.discovery import (
    ConfigError,
    Endpoint,
    load_static_config,
    models_from_cluster,
    parse_backend,
    parse_shadow,
    parse_traffic,
)


def pod(name, group="0", rank=0, revision="abc", ready=True, ip="127.0.0.5", size=1, deployment="llama"):
    role = labels.ROLE_LEADER if rank == 0 else labels.ROLE_WORKER
    return {
        "metadata": {
            "name": name,
            "labels": {
                labels.COMPONENT: labels.COMPONENT_ENGINE,
                labels.MODEL_DEPLOYMENT: deployment,
                labels.REVISION: revision,
                labels.GROUP_INDEX: group,
                labels.RANK: str(rank),
                labels.ROLE: role,
            },
            "annotations": {labels.ANNOTATION_GROUP_SIZE: str(size)},
        },
        "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def deployment(name="llama", served=None, traffic=None, shadow=None, weights=None):
    spec = {"model": {"servedModelName": served}} if served else {"model": {}}
    if weights:
        spec["routing"] = {"weights": weights}
    status = {}
    if traffic is not None:
        status["traffic"] = traffic
    if shadow is not None:
        status["shadow"] = shadow
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": status}


def test_ready_single_pod_groups_become_endpoints_with_their_revision():
    views = models_from_cluster(
        [pod("a-0", group="0", revision="r1"), pod("a-1", group="1", revision="r2", ip="127.0.0.6")],
        [deployment(traffic=[{"revision": "r1", "weight": 90}, {"revision": "r2", "weight": 10}])],
    )
    view = views["llama"]
    assert view.endpoints == (
        Endpoint("a-0", "http://127.0.0.5:8000", "r1"),
        Endpoint("a-1", "http://127.0.0.6:8000", "r2"),
    )
    assert view.traffic == (("r1", 90.0), ("r2", 10.0))
    assert view.deployment == "ns/llama"


def test_multi_pod_group_serves_only_when_every_member_is_ready():
    leader = pod("g0-leader", size=2)
    worker = pod("g0-worker", rank=1, size=2, ready=False)
    assert models_from_cluster([leader, worker], [deployment()])["llama"].endpoints == ()
    assert models_from_cluster([leader], [deployment()])["llama"].endpoints == ()  # a member is missing
    worker_ready = pod("g0-worker", rank=1, size=2)
    (endpoint,) = models_from_cluster([leader, worker_ready], [deployment()])["llama"].endpoints
    assert endpoint.name == "g0-leader"


def test_groups_are_keyed_by_revision_too_and_need_a_leader_ip():
    old = pod("old-leader", group="0", revision="r1", size=2)
    new_worker = pod("new-worker", group="0", revision="r2", rank=1, size=2)
    assert models_from_cluster([old, new_worker], [deployment()])["llama"].endpoints == ()
    no_ip = pod("x", ip=None)
    assert models_from_cluster([no_ip], [deployment()])["llama"].endpoints == ()


def test_served_name_weights_shadow_and_other_deployments():
    views = models_from_cluster(
        [pod("a-0"), pod("b-0", deployment="other")],
        [
            deployment(
                served="meta-llama/Llama-3.1-8B",
                shadow={"revision": "r9", "fraction": 0.25},
                weights={"prefixCache": 2},
            )
        ],
    )
    view = views["meta-llama/Llama-3.1-8B"]
    assert [e.name for e in view.endpoints] == ["a-0"]
    assert view.shadow.revision == "r9" and view.shadow.fraction == 0.25
    assert view.weights == {"prefixCache": 2.0}
    assert "other" not in views


def test_static_backend_specs():
    assert parse_backend("http://127.0.0.1:8001") == Endpoint("127.0.0.1:8001", "http://127.0.0.1:8001", "")
    assert parse_backend("a=http://127.0.0.1:8001/#v2") == Endpoint("a", "http://127.0.0.1:8001", "v2")
    with pytest.raises(ConfigError, match="--backend"):
        parse_backend("127.0.0.1:8001")
    assert parse_traffic(["v1=90", "v2=10"]) == (("v1", 90.0), ("v2", 10.0))
    with pytest.raises(ConfigError, match="--traffic"):
        parse_traffic(["v1=150"])
    assert parse_shadow("v2=0.1").fraction == 0.1
    with pytest.raises(ConfigError, match="--shadow"):
        parse_shadow("v2")


def test_the_configured_batch_size_comes_from_the_engine_args_of_the_deployment():
    def batch_size(engine):
        body = deployment()
        if engine is not None:
            body["spec"]["engine"] = engine
        return models_from_cluster([pod("a-0")], [body])["llama"].batch_size

    assert batch_size({"args": ["--max-num-seqs=8"]}) == 8  # kind defaults to vLLM, as in the CRD
    assert batch_size({"kind": "SGLang", "args": ["--max-running-requests", "24"]}) == 24
    assert batch_size({"kind": "SGLang", "args": ["--max-num-seqs=24"]}) is None
    assert batch_size({"args": []}) is None
    assert batch_size(None) is None


def test_a_backends_file_configures_the_batch_size_and_a_bad_one_is_named(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("backends: [a=http://127.0.0.1:8001]\nengine: {maxNumSeqs: 16}\n")
    assert load_static_config(str(good)).batch_size == 16
    bad = tmp_path / "bad.yaml"
    bad.write_text("backends: [a=http://127.0.0.1:8001]\nengine: {maxNumSeqs: -2}\n")
    with pytest.raises(ConfigError, match=r"engine\.maxNumSeqs -2"):
        load_static_config(str(bad))
