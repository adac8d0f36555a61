"""The command line: bad arguments give one clear line and exit status 2."""

import pytest
from tokenyard.sim.__main__ import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--model", "nope"], "unknown model preset 'nope'"),
        (["serve", "--gpu", "v100"], "unknown GPU preset 'v100'"),
        (["serve", "--model", "llama-3.1-70b", "--gpu", "l40s"], "does not fit on 1 x l40s"),
        (["serve", "--tp", "x"], "argument --tp: invalid int value"),
        (["serve", "--time-scale", "0"], "must be positive"),
        (["launch"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--bogus-flag"],
            "unrecognized arguments: --bogus-flag",
        ),
        (["vllm", "serve", "/mnt/models/x"], "set TOKENYARD_SIM_MODEL (or --sim-model)"),
        (["vllm", "serve", "/mnt/models/x", "--sim-model", "gpt-9"], "unknown model preset 'gpt-9'"),
        (["vllm", "serve", "meta-llama/Llama-3.1-70B", "--sim-gpu=l40s"], "does not fit on 1 x l40s"),
        (["vllm", "serve", "meta-llama/Llama-3.1-8B", "--sim-time-scale", "fast"], "time scale 'fast'"),
        (["vllm", "bench", "serve"], "only `vllm serve` is simulated"),
        (["sglang", "--port", "30000"], "the following arguments are required: --model-path"),
        (["sglang", "--model-path", "meta-llama/Llama-3.1-8B", "--max-model-len", "9"], "--max-model-len"),
        (
            ["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-72B", "--tp", "x"],
            "invalid int",
        ),
        (["serve", "--personality", "tgi"], "invalid choice: 'tgi'"),
        (["serve", "--metrics-fault", "flaky"], "invalid choice: 'flaky'"),
    ],
)
def test_engine_command_lines_fail_at_start_with_one_line(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("TOKENYARD_SIM_MODEL", raising=False)
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse (the serve subcommand) exits; the engine lines return
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_engine_command_lines_take_env_knobs_and_sim_flags(monkeypatch):
    from tokenyard.sim.__main__ import _engine_options

    monkeypatch.setenv("TOKENYARD_SIM_MODEL", "llama-3.1-70b")
    monkeypatch.setenv("TOKENYARD_SIM_ERROR_RATE", "0.25")
    monkeypatch.setenv("TOKENYARD_SIM_METRICS_FAULT", "error")
    o = _engine_options(
        ["sglang", "--model-path", "/mnt/models/x", "--tp", "4", "--sim-gpu=h200", "--sim-time-scale", "0.5"]
    )
    assert (o.personality, o.model, o.gpu, o.tp, o.time_scale) == ("sglang", "llama-3.1-70b", "h200", 4, 0.5)
    assert (o.knobs.error_rate, o.knobs.metrics_fault) == (0.25, "error")


def test_engine_help_lists_the_flags(capsys):
    assert main(["vllm", "serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--max-model-len" in out and "--sim-model" in out
    assert main(["sglang", "-h"]) == 0
    assert "--disable-radix-cache" in capsys.readouterr().out
