"""The engines' command lines as the simulator reads them: forms, defaults, errors, presets."""

import pytest
from tokenyard.sim.engine_args import (
    EngineArgsError,
    UnknownFlagError,
    engine_options_from_argv,
    human_readable_int,
    split_program,
)

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
VLLM = ["vllm", "serve"]
SGLANG = ["python3", "-m", "sglang.launch_server"]


def vllm(*args, **kw):
    return engine_options_from_argv([*VLLM, LLAMA_8B, *args], **kw)


def sglang(*args, **kw):
    return engine_options_from_argv([*SGLANG, "--model-path", LLAMA_8B, *args], **kw)


def test_the_operators_vllm_command_line():
    o = engine_options_from_argv(
        [
            *VLLM,
            "meta-llama/Llama-3.1-70B-Instruct",
            "--served-model-name",
            "team/chat",
            "--port",
            "8000",
            "--tensor-parallel-size",
            "4",
            "--pipeline-parallel-size",
            "1",
            "--revision",
            "abc123",
            "--tokenizer",
            "meta-llama/Llama-3.1-70B-Instruct",
            "--max-model-len=8192",
            "--enable-prefix-caching",
        ]  # fmt: skip
    )
    assert (o.personality, o.model, o.model_path, o.served_model_name) == (
        "vllm",
        "llama-3.1-70b",
        "meta-llama/Llama-3.1-70B-Instruct",
        "team/chat",
    )
    assert (o.host, o.port, o.tp, o.pp, o.max_model_len, o.enable_prefix_caching) == (
        "0.0.0.0",
        8000,
        4,
        1,
        8192,
        True,
    )
    assert o.serves_http and o.enable_metrics


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        (["--max-model-len", "4096"], "max_model_len", 4096),
        (["--max-model-len=4096"], "max_model_len", 4096),
        (["--max_model_len", "4096"], "max_model_len", 4096),  # vLLM normalises underscores
        (["--max_model_len=4096"], "max_model_len", 4096),
        (["--max-model-len=8k"], "max_model_len", 8000),  # vLLM's human-readable ints
        (["--max-model-len=8K"], "max_model_len", 8192),
        (["--max-num-batched-tokens", "2k"], "max_num_batched_tokens", 2000),
        (["-tp", "2"], "tp", 2),
        (["-tp=2"], "tp", 2),
        (["--tensor_parallel_size=2"], "tp", 2),
        (["-pp", "2"], "pp", 2),
        (["--max-num-seqs", "7"], "max_num_seqs", 7),
        (["--block-size", "32"], "block_size", 32),
        (["--gpu-memory-utilization", "0.5"], "gpu_memory_utilization", 0.5),
        (["--num-gpu-blocks-override", "64"], "num_gpu_blocks_override", 64),
        (["--no-enable-prefix-caching"], "enable_prefix_caching", False),
        (["--no_enable_prefix_caching"], "enable_prefix_caching", False),
        (["--enable-prefix-caching"], "enable_prefix_caching", True),
        (["--no-enable-chunked-prefill"], "enable_chunked_prefill", False),
        (["--kv-cache-dtype", "fp8"], "kv_cache_dtype", "fp8"),
        (["--seed", "7"], "seed", 7),
        (["--host", "127.0.0.5", "--port=9000"], "port", 9000),
        (["--nnodes", "2", "--node-rank", "1"], "node_rank", 1),
        (["-n", "2", "-r", "1"], "node_rank", 1),
        (["--headless"], "headless", True),
        (["--served-model-name", "a", "b"], "served_model_aliases", ("b",)),
    ],
)
def test_vllm_flag_forms(args, field, value):
    assert getattr(vllm(*args), field) == value


def test_flags_the_simulator_ignores_are_accepted_and_checked():
    o = vllm(
        "--trust-remote-code",
        "--dtype=bfloat16",
        "--tokenizer-revision", "r1",
        "--distributed-executor-backend", "mp",
        "--master-addr", "leader.svc", "--master-port", "29500",
        "--disable-log-requests",
        "--enable-chunked-prefill",
        "--uvicorn-log-level", "warning",
        "--api-key", "k1", "k2",
        "--enforce-eager",
        "--disable-log-stats",
    )  # fmt: skip
    assert o.model == "llama-3.1-8b" and o.weight_dtype_bytes is None
    with pytest.raises(EngineArgsError, match="argument --uvicorn-log-level: invalid choice: 'loud'"):
        vllm("--uvicorn-log-level", "loud")
    with pytest.raises(EngineArgsError, match="argument --distributed-executor-backend: invalid choice"):
        vllm("--distributed-executor-backend", "slurm")


def test_the_positional_model_wins_over_model_and_the_old_entry_point_takes_model():
    assert vllm("--model", "mistralai/Mixtral-8x7B-Instruct-v0.1").model == "llama-3.1-8b"
    old = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen2.5-72B-Instruct"]
    o = engine_options_from_argv([*old, "-tp", "4"])
    assert (o.model, o.personality, o.tp) == ("qwen2.5-72b", "vllm", 4)
    with pytest.raises(UnknownFlagError, match="unrecognized arguments: extra"):
        engine_options_from_argv([*old, "extra"])  # no positional model there


def test_the_served_name_defaults_to_the_model_argument():
    assert vllm().served_model_name is None and vllm().model_path == LLAMA_8B


@pytest.mark.parametrize(
    ("argv", "message", "flag"),
    [
        (
            [*VLLM, LLAMA_8B, "--bogus-flag", "3"],
            "vllm serve: unrecognized arguments: --bogus-flag 3",
            "--bogus-flag",
        ),
        (
            [*VLLM, LLAMA_8B, "--max-model-len=8192", "--bogus=1"],
            "unrecognized arguments: --bogus=1",
            "--bogus",
        ),
        (
            [*VLLM, LLAMA_8B, "extra-positional"],
            "unrecognized arguments: extra-positional",
            "extra-positional",
        ),
        (
            [*SGLANG, "--model-path", LLAMA_8B, "--max-model-len", "8"],  # a vLLM flag SGLang lacks
            "sglang.launch_server: unrecognized arguments: --max-model-len 8",
            "--max-model-len",
        ),
        (
            [
                *SGLANG,
                "--model-path",
                LLAMA_8B,
                "--tp_size",
                "2",
            ],  # SGLang's argparse keeps underscores apart
            "unrecognized arguments: --tp_size 2",
            "--tp_size",
        ),
    ],
)
def test_unknown_flags_fail_like_the_real_cli(argv, message, flag):
    with pytest.raises(UnknownFlagError) as info:
        engine_options_from_argv(argv)
    assert message in str(info.value) and info.value.flag == flag
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-model-len", "lots"], "argument --max-model-len: invalid human_readable_int value: 'lots'"),
        (["--max-model-len=1.5K"], "invalid human_readable_int value"),
        (["-tp", "two"], "argument --tensor-parallel-size/-tp: invalid int value: 'two'"),
        (["--port"], "argument --port: expected one argument"),
        (["--port", "--headless"], "argument --port: expected one argument"),
        (["--headless=yes"], "argument --headless: ignored explicit argument 'yes'"),
        (["--served-model-name"], "expected at least one argument"),
        (["--dtype", "fp64"], "argument --dtype: invalid choice: 'fp64'"),
        (["-dp", "2"], "data parallel size 2 is not simulated"),
    ],
)
def test_bad_values_name_their_flag(args, message):
    with pytest.raises(EngineArgsError, match="^vllm serve: ") as info:
        vllm(*args)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("model", "preset"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("meta-llama/llama-3.1-70b-instruct", "llama-3.1-70b"),
        ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.1-70b"),
        ("meta-llama/Llama-3.1-405B-Instruct-FP8", "llama-3.1-405b"),
        ("/mnt/pvc/models/qwen2.5-72b-instruct", "qwen2.5-72b"),
        ("Qwen/Qwen2.5-72B-Instruct-AWQ", "qwen2.5-72b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("llama-3.1-8b", "llama-3.1-8b"),  # a preset name is fine too
    ],
)
def test_the_preset_comes_from_the_model_name(model, preset):
    assert engine_options_from_argv([*VLLM, model]).model == preset
    assert engine_options_from_argv([*SGLANG, "--model-path", model]).model == preset


@pytest.mark.parametrize(
    "model", ["/mnt/models/x", "org/my-finetune", "meta-llama/Llama-3.1-80B", "meta-llama/Llama-3.2-8B"]
)
def test_a_name_that_tells_no_preset_needs_the_sim_model(model):
    with pytest.raises(EngineArgsError, match="TOKENYARD_SIM_MODEL") as info:
        engine_options_from_argv([*VLLM, model])
    assert model in str(info.value)
    assert engine_options_from_argv([*VLLM, model], sim_model="llama-3.1-70b").model == "llama-3.1-70b"
    with pytest.raises(EngineArgsError, match="unknown model preset 'gpt-9'"):
        engine_options_from_argv([*VLLM, model], sim_model="gpt-9")


def test_without_a_model_vllm_loads_its_default_which_is_no_preset():
    with pytest.raises(EngineArgsError, match="Qwen/Qwen3-0.6B"):
        engine_options_from_argv(VLLM)


def test_the_operators_sglang_command_line():
    o = engine_options_from_argv(
        [
            *SGLANG,
            "--model-path",
            "/mnt/pvc/models/qwen2.5-72b-instruct",
            "--served-model-name",
            "qwen",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
            "--tp-size",
            "4",
            "--pp-size",
            "1",
            "--enable-metrics",
            "--context-length=32768",
            "--mem-fraction-static=0.85",
        ]  # fmt: skip
    )
    assert (o.personality, o.model, o.served_model_name, o.host, o.port, o.tp, o.pp) == (
        "sglang",
        "qwen2.5-72b",
        "qwen",
        "0.0.0.0",
        8000,
        4,
        1,
    )
    assert (o.max_model_len, o.gpu_memory_utilization, o.enable_metrics) == (32768, 0.85, True)
    assert o.block_size == 1 and o.enable_prefix_caching  # SGLang: 1-token pages, radix cache on
    assert o.validate().block_size == 1


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        ([], "port", 30000),
        ([], "host", "127.0.0.1"),
        ([], "enable_metrics", False),  # SGLang serves /metrics only with --enable-metrics
        ([], "report_cached_tokens", False),
        (["--enable-cache-report"], "report_cached_tokens", True),
        (["--tp", "2"], "tp", 2),
        (["--tensor-parallel-size=2"], "tp", 2),
        (["--pipeline-parallel-size", "2"], "pp", 2),
        (["--max-running-requests", "3"], "max_num_seqs", 3),
        (["--chunked-prefill-size", "4096"], "max_num_batched_tokens", 4096),
        (["--chunked-prefill-size", "-1"], "enable_chunked_prefill", False),
        (["--page-size", "16"], "block_size", 16),
        (["--page-size", "16", "--max-total-tokens", "1000"], "num_gpu_blocks_override", 63),
        (["--disable-radix-cache"], "enable_prefix_caching", False),
        (["--random-seed", "9"], "seed", 9),
        (["--model", "mistralai/Mixtral-8x7B-Instruct-v0.1"], "model", "mixtral-8x7b"),  # --model is an alias
        (["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "leader:5000"], "serves_http", False),
        (["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "leader:5000"], "serves_http", True),
        (["--trust-remote-code", "--log-level", "debug", "--api-key", "k", "--revision", "main"], "tp", 1),
    ],
)
def test_sglang_flag_forms(args, field, value):
    assert getattr(sglang(*args), field) == value


@pytest.mark.parametrize(
    ("args", "reported"),
    [([], False), (["--enable-prompt-tokens-details"], True), (["--no-enable-prompt-tokens-details"], False)],
)
def test_vllm_reports_cached_tokens_only_when_asked(args, reported):
    assert (
        engine_options_from_argv(
            ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", *args]
        ).report_cached_tokens
        is reported
    )


def test_sglang_needs_a_model_path():
    with pytest.raises(EngineArgsError, match="required: --model-path"):
        engine_options_from_argv([*SGLANG, "--port", "8000"])


def test_multi_node_vllm_leader_and_headless_worker():
    group = [
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        "2",
        "--master-addr",
        "r0.svc",
        "--master-port",
        "29500",
    ]
    leader = vllm("-tp", "16", *group, "--node-rank", "0")
    worker = vllm("-tp", "16", *group, "--node-rank", "1", "--headless")
    assert leader.serves_http and (leader.nnodes, leader.node_rank, leader.tp) == (2, 0, 16)
    assert not worker.serves_http and worker.headless


def test_fp8_checkpoints_and_kv_cache_hold_more_tokens():
    bf16, fp8 = "meta-llama/Llama-3.1-405B-Instruct", "meta-llama/Llama-3.1-405B-Instruct-FP8"
    # 405B in bf16 (810 GB) does not fit on one 8 x H100 node; in FP8 it does, as in the real world.
    with pytest.raises(ValueError, match="does not fit on 8 x h100-sxm"):
        engine_options_from_argv([*VLLM, bf16, "-tp", "8"]).validate()
    on_8 = engine_options_from_argv([*VLLM, fp8, "-tp", "8"])
    assert on_8.weight_dtype_bytes == 1 and on_8.validate().num_gpu_blocks > 0
    bf16_16 = engine_options_from_argv([*VLLM, bf16, "-tp", "16"]).validate()
    fp8_16 = engine_options_from_argv([*VLLM, fp8, "-tp", "16"]).validate()
    assert fp8_16.weight_bytes_per_gpu == pytest.approx(bf16_16.weight_bytes_per_gpu / 2)
    fp8_kv = engine_options_from_argv([*VLLM, fp8, "-tp", "8", "--kv-cache-dtype=fp8"]).validate()
    assert fp8_kv.kv_bytes_per_token_per_gpu * 2 == on_8.validate().kv_bytes_per_token_per_gpu
    assert fp8_kv.num_gpu_blocks >= 2 * on_8.validate().num_gpu_blocks - 1


def test_block_size_and_pipeline_parallelism_shape_the_kv_cache():
    base = vllm().validate()
    assert vllm("--block-size", "32").validate().num_gpu_blocks == pytest.approx(
        base.num_gpu_blocks / 2, abs=1
    )
    seventy = "meta-llama/Llama-3.1-70B-Instruct"
    tp4 = engine_options_from_argv([*VLLM, seventy, "-tp", "4"]).validate()
    tp2pp2 = engine_options_from_argv([*VLLM, seventy, "-tp", "2", "-pp", "2"]).validate()
    # Same GPUs, same weights per GPU, same KV bytes per GPU per token: the same cache.
    assert tp2pp2.weight_bytes_per_gpu == pytest.approx(tp4.weight_bytes_per_gpu)
    assert tp2pp2.kv_bytes_per_token_per_gpu == tp4.kv_bytes_per_token_per_gpu
    # but a step crosses a stage boundary
    assert tp2pp2.step_cost(_decode()).comm_s != tp4.step_cost(_decode()).comm_s


def _decode():
    from tokenyard.sim.model import StepShape

    return StepShape(num_tokens=8, num_seqs=8, attention_pairs=8000, kv_tokens_read=8000)


@pytest.mark.parametrize(
    ("argv", "engine", "rest"),
    [
        (["vllm", "serve", "m", "--port", "1"], "vllm", ["m", "--port", "1"]),
        (["/usr/local/bin/vllm", "serve"], "vllm", []),
        (["python", "-m", "sglang.launch_server", "--model-path", "m"], "sglang", ["--model-path", "m"]),
        (["/usr/bin/python3.11", "-m", "sglang.launch_server"], "sglang", []),
        (["python3", "-m", "vllm.entrypoints.openai.api_server"], "vllm", []),
    ],
)
def test_programs_are_recognised(argv, engine, rest):
    program, args = split_program(argv)
    assert (program.engine, args) == (engine, rest)


@pytest.mark.parametrize(
    "argv", [["bash", "-c", "vllm serve m"], ["vllm", "bench"], ["python3", "app.py"], []]
)
def test_other_programs_are_refused(argv):
    with pytest.raises(EngineArgsError, match="neither `vllm serve`"):
        split_program(argv)


@pytest.mark.parametrize(
    ("text", "value"), [("4096", 4096), ("1k", 1000), ("1K", 1024), ("25.6k", 25600), ("2M", 2 * 1024**2)]
)
def test_human_readable_int(text, value):
    assert human_readable_int(text) == value


def test_the_simulator_knows_every_flag_the_engines_document_for_tokenyards_pods():
    """The simulator holds to the engines' documented flags (tests/fixtures/engines, written from their docs),
    so a pod the operator renders from those flags starts here as it would on a GPU node."""
    from pathlib import Path

    from tokenyard.sim.engine_args import SGLANG_FLAGS, VLLM_FLAGS

    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "engines"
    for fixture, table in (
        ("vllm_v0.13.0_serve_flags.txt", VLLM_FLAGS),
        ("sglang_v0.5_server_args.txt", SGLANG_FLAGS),
    ):
        documented = {
            line.strip() for line in (fixtures / fixture).read_text().splitlines() if line.startswith("--")
        }
        known = {name for flag in table for name in flag.names}
        negatable = {name for flag in table if flag.kind == "bool" for name in flag.names}
        missing = {
            f
            for f in documented
            if f not in known and not (f.startswith("--no-") and "--" + f[5:] in negatable)
        }
        assert documented and not missing, (fixture, sorted(missing))
