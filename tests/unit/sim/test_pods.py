"""The pod runner's decision: which engine to serve for a pod.

Pods of engine kinds vLLM and SGLang carry the command line the operator renders (the engine contract of
issue 13); the simulator reads it as the engine would. Custom pods (no command) keep the TOKENYARD_* env path.
"""

import pytest
from tokenyard.core import labels as L
from tokenyard.sim.pods import PodConfigError, RunnerDefaults, _differs, engine_options_for_pod


def engine_pod(env=None, ports=None, command=None, args=None, role=L.ROLE_LEADER, rank="0", **status):
    engine = {
        "name": "engine",
        "ports": ports if ports is not None else [{"name": "http", "containerPort": 8080}],
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
    }
    if command is not None:
        engine["command"] = command
    if args is not None:
        engine["args"] = args
    return {
        "metadata": {
            "name": f"chat-0-{rank}",
            "namespace": "team-a",
            "labels": {L.COMPONENT: L.COMPONENT_ENGINE, L.ROLE: role, L.RANK: rank},
        },
        "spec": {"nodeName": "gpu-node-3", "containers": [{"name": "sidecar"}, engine]},
        "status": {"podIP": "127.1.0.5", "phase": "Running", **status},
    }


# What the operator renders for a vLLM pod (the engine contract), then the user's args.
VLLM_COMMAND = ["vllm", "serve"]
VLLM_ARGS = [
    "meta-llama/Llama-3.1-70B-Instruct",
    "--served-model-name", "team-a/chat",
    "--port", "8000",
    "--tensor-parallel-size", "4",
    "--pipeline-parallel-size", "1",
    "--revision", "0e9e39f",
    "--max-model-len=8192",
    "--enable-prefix-caching",
]  # fmt: skip
SGLANG_COMMAND = ["python3", "-m", "sglang.launch_server"]
SGLANG_ARGS = [
    "--model-path", "/mnt/pvc/models/qwen2.5-72b-instruct",
    "--served-model-name", "team-a/qwen",
    "--host", "0.0.0.0",
    "--port", "8000",
    "--tp-size", "4",
    "--pp-size", "1",
    "--enable-metrics",
    "--context-length=32768",
    "--mem-fraction-static=0.85",
]  # fmt: skip


def multi_node_vllm_args(rank: int) -> list[str]:
    args = [
        "meta-llama/Llama-3.1-405B-Instruct-FP8",
        "--served-model-name", "big",
        "--port", "8000",
        "--tensor-parallel-size", "16",
        "--pipeline-parallel-size", "1",
        "--distributed-executor-backend", "mp",
        "--nnodes", "2",
        "--node-rank", str(rank),
        "--master-addr", "chat-0-0.chat-0.team-a.svc",
        "--master-port", "29500",
    ]  # fmt: skip
    return args + (["--headless"] if rank else []) + ["--max-model-len=16384"]


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


# --- pods with the rendered command line ---------------------------------------------------------------------
def test_a_rendered_vllm_pod_is_served_as_its_command_line_says():
    env = {  # the side channel still works; TOKENYARD_* that the command line also says are not consulted
        L.ENV_SIM_TIME_SCALE: "0.05",
        L.ENV_SIM_ERROR_RATE: "0.1",
        L.ENV_SIM_METRICS_FAULT: "garbage",
        L.ENV_SIM_MAX_NUM_SEQS: "2",
        L.ENV_TENSOR_PARALLEL: "8",
        L.ENV_SERVED_MODEL_NAME: "from-env",
    }
    o = engine_options_for_pod(engine_pod(env, command=VLLM_COMMAND, args=VLLM_ARGS), NODE)
    assert (o.personality, o.host, o.port, o.model, o.gpu, o.tp, o.served_model_name) == (
        "vllm",
        "127.1.0.5",  # the pod IP, not the engine's 0.0.0.0
        8000,  # from --port, not the container port 8080
        "llama-3.1-70b",
        "a100-80gb",
        4,
        "team-a/chat",
    )
    assert (o.max_model_len, o.enable_prefix_caching, o.max_num_seqs, o.time_scale) == (
        8192,
        True,
        None,
        0.05,
    )
    assert (o.knobs.error_rate, o.knobs.metrics_fault) == (0.1, "garbage")


def test_a_rendered_sglang_pod_gets_the_sglang_personality():
    o = engine_options_for_pod(engine_pod(command=SGLANG_COMMAND, args=SGLANG_ARGS), NODE)
    assert (o.personality, o.host, o.port, o.model, o.tp, o.served_model_name) == (
        "sglang",
        "127.1.0.5",
        8000,
        "qwen2.5-72b",
        4,
        "team-a/qwen",
    )
    assert (o.max_model_len, o.gpu_memory_utilization, o.enable_metrics, o.block_size) == (
        32768,
        0.85,
        True,
        1,
    )


def test_without_port_in_the_args_the_container_port_is_used():
    args = [a for a in VLLM_ARGS if a not in ("--port", "8000")]
    assert engine_options_for_pod(engine_pod(command=VLLM_COMMAND, args=args), NODE).port == 8080


def test_a_two_pod_groups_leader_is_served_and_its_headless_worker_is_not():
    h100 = {L.NODE_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3"}
    leader = engine_options_for_pod(engine_pod(command=VLLM_COMMAND, args=multi_node_vllm_args(0)), h100)
    assert leader is not None and leader.serves_http
    assert (leader.model, leader.tp, leader.nnodes, leader.node_rank, leader.weight_dtype_bytes) == (
        "llama-3.1-405b",
        16,
        2,
        0,
        1,
    )
    worker_pod = engine_pod(command=VLLM_COMMAND, args=multi_node_vllm_args(1), role=L.ROLE_WORKER, rank="1")
    assert engine_options_for_pod(worker_pod, h100) is None
    # even mislabelled as a leader, a --headless command line serves no API
    mislabelled = engine_pod(command=VLLM_COMMAND, args=multi_node_vllm_args(1), rank="1")
    assert engine_options_for_pod(mislabelled, h100) is None


def test_an_sglang_worker_rank_serves_no_api():
    args = SGLANG_ARGS + [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--dist-init-addr",
        "chat-0-0.chat-0.team-a.svc:5000",
    ]
    assert engine_options_for_pod(engine_pod(command=SGLANG_COMMAND, args=args), NODE) is None
    leader = SGLANG_ARGS + [
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--dist-init-addr",
        "chat-0-0.chat-0.team-a.svc:5000",
    ]
    assert engine_options_for_pod(engine_pod(command=SGLANG_COMMAND, args=leader), NODE).nnodes == 2


def test_an_unknown_flag_makes_the_pod_unservable_naming_pod_and_flag():
    pod = engine_pod(command=VLLM_COMMAND, args=[*VLLM_ARGS, "--enable-turbo-mode"])
    with pytest.raises(PodConfigError) as info:
        engine_options_for_pod(pod, NODE)
    message = str(info.value)
    assert message.startswith("pod team-a/chat-0-0: container engine: vllm serve:")
    assert (
        "unrecognized arguments: --enable-turbo-mode" in message and info.value.flag == "--enable-turbo-mode"
    )


@pytest.mark.parametrize(
    ("env", "command", "args", "message"),
    [
        ({}, VLLM_COMMAND, ["/mnt/models/x", "--port", "8000"], "/mnt/models/x.*TOKENYARD_SIM_MODEL"),
        ({}, VLLM_COMMAND, [*VLLM_ARGS[:-2], "--max-model-len=lots"], "--max-model-len: invalid"),
        ({}, VLLM_COMMAND, [*VLLM_ARGS[:5], "--tensor-parallel-size", "1"], "does not fit on 1 x a100-80gb"),
        ({}, ["/bin/sh", "-c", "vllm serve x"], [], "neither `vllm serve`"),
        ({L.ENV_SIM_METRICS_FAULT: "sometimes"}, VLLM_COMMAND, VLLM_ARGS, "metrics_fault must be one of"),
    ],
)
def test_misconfigured_rendered_pods_are_reported_by_name(env, command, args, message):
    with pytest.raises(PodConfigError, match=f"^pod team-a/chat-0-0: .*{message}"):
        engine_options_for_pod(engine_pod(env, command=command, args=args), NODE)


def test_a_local_path_takes_its_preset_from_tokenyard_sim_model():
    pod = engine_pod({L.ENV_SIM_MODEL_PRESET: "llama-3.1-8b"}, command=VLLM_COMMAND, args=["/mnt/models/x"])
    o = engine_options_for_pod(pod, NODE)
    assert (o.model, o.model_path, o.port) == ("llama-3.1-8b", "/mnt/models/x", 8080)


def test_a_changed_command_line_is_a_new_engine():
    a = engine_options_for_pod(engine_pod(command=VLLM_COMMAND, args=VLLM_ARGS), NODE)
    b = engine_options_for_pod(engine_pod(command=VLLM_COMMAND, args=[*VLLM_ARGS, "--max-num-seqs=4"]), NODE)
    assert _differs(a, b)


def test_env_references_in_the_args_are_expanded_as_kubernetes_does():
    env = {"SERVED": "from-env", "TP": "2"}
    args = ["meta-llama/Llama-3.1-8B", "--served-model-name=$(SERVED)", "-tp", "$(TP)", "--api-key", "$$(TP)"]
    o = engine_options_for_pod(engine_pod(env, command=VLLM_COMMAND, args=args), NODE)
    assert (o.served_model_name, o.tp) == ("from-env", 2)
    undefined = engine_pod(command=VLLM_COMMAND, args=["meta-llama/Llama-3.1-8B", "-tp", "$(NOPE)"])
    with pytest.raises(PodConfigError, match=r"invalid int value: '\$\(NOPE\)'"):
        engine_options_for_pod(undefined, NODE)
