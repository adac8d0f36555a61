"""The pod runner's decision: which engine to serve for a pod."""

import pytest
from tokenyard.core import labels as L
from tokenyard.sim.pods import PodConfigError, RunnerDefaults, _differs, engine_options_for_pod


def engine_pod(env=None, ports=None, **status):
    return {
        "metadata": {
            "name": "chat-0-0",
            "namespace": "team-a",
            "labels": {L.COMPONENT: L.COMPONENT_ENGINE, L.ROLE: L.ROLE_LEADER, L.RANK: "0"},
        },
        "spec": {
            "nodeName": "gpu-node-3",
            "containers": [
                {"name": "sidecar"},
                {
                    "name": "engine",
                    "ports": ports if ports is not None else [{"name": "http", "containerPort": 8080}],
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                },
            ],
        },
        "status": {"podIP": "127.1.0.5", "phase": "Running", **status},
    }


NODE = {L.NODE_GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB"}


def test_a_leader_pod_is_served_on_its_ip_and_http_port_with_its_env_and_node_gpu():
    env = {
        L.ENV_SIM_MODEL_PRESET: "llama-3.1-70b",
        L.ENV_TENSOR_PARALLEL: "4",
        L.ENV_SERVED_MODEL_NAME: "chat",
        L.ENV_SIM_TIME_SCALE: "0.05",
        L.ENV_SIM_ERROR_RATE: "0.1",
        L.ENV_SIM_LATENCY_MULTIPLIER: "2",
        L.ENV_SIM_STARTUP_SECONDS: "30",
        L.ENV_SIM_CRASH_AFTER_REQUESTS: "100",
    }
    o = engine_options_for_pod(engine_pod(env), NODE)
    assert (o.host, o.port, o.model, o.gpu, o.tp, o.served_model_name) == (
        "127.1.0.5",
        8080,
        "llama-3.1-70b",
        "a100-80gb",
        4,
        "chat",
    )
    assert o.time_scale == 0.05
    assert (o.knobs.error_rate, o.knobs.latency_multiplier, o.knobs.startup_seconds) == (0.1, 2.0, 30.0)
    assert o.knobs.crash_after_requests == 100


def test_defaults_apply_when_the_pod_says_nothing():
    o = engine_options_for_pod(engine_pod(ports=[]), {}, RunnerDefaults(time_scale=0.5, gpu="h200"))
    assert (o.port, o.model, o.gpu, o.tp, o.time_scale, o.served_model_name) == (
        8000,
        "llama-3.1-8b",
        "h200",
        1,
        0.5,
        None,
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["status"].pop("podIP"),
        lambda p: p["spec"].pop("nodeName"),
        lambda p: p["metadata"]["labels"].update({L.ROLE: L.ROLE_WORKER}),
        lambda p: p["metadata"].update({"deletionTimestamp": "2026-01-01T00:00:00Z"}),
        lambda p: p["status"].update({"phase": "Failed"}),
    ],
)
def test_pods_that_are_not_ready_leaders_are_not_served(change):
    pod = engine_pod()
    change(pod)
    assert engine_options_for_pod(pod, NODE) is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({L.ENV_SIM_MODEL_PRESET: "gpt-9"}, "TOKENYARD_SIM_MODEL.*unknown model preset"),
        ({L.ENV_TENSOR_PARALLEL: "two"}, "TOKENYARD_TENSOR_PARALLEL_SIZE='two'"),
        ({L.ENV_SIM_MODEL_PRESET: "llama-3.1-70b", L.ENV_TENSOR_PARALLEL: "1"}, "does not fit"),
        ({L.ENV_SIM_ERROR_RATE: "3"}, "error_rate"),
    ],
)
def test_misconfigured_pods_are_reported_by_name_and_field(env, message):
    with pytest.raises(PodConfigError, match=f"team-a/chat-0-0.*{message}"):
        engine_options_for_pod(engine_pod(env), NODE)


def test_a_knob_change_is_not_a_new_engine_but_a_new_ip_is():
    a = engine_options_for_pod(engine_pod({L.ENV_SIM_ERROR_RATE: "0.5"}), NODE)
    b = engine_options_for_pod(engine_pod(), NODE)
    c = engine_options_for_pod(engine_pod(podIP="127.1.0.6"), NODE)
    assert not _differs(a, b)
    assert _differs(b, c)
