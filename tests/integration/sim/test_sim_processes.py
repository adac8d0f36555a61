"""The engine as a process: `serve` stops cleanly on SIGTERM; the engines' own command lines start the engine
they describe (and a headless worker serves nothing); `sglang-router` routes to sim engines."""

import asyncio
import os
import signal
import socket
import subprocess
import sys

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenyard.core.process import stop_process

from tests.integration.sim.conftest import eventually, scrape

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_healthy(
    session: aiohttp.ClientSession, url: str, proc: subprocess.Popen, path="/health"
) -> None:
    async def up():
        assert proc.poll() is None, f"{proc.args} exited with {proc.returncode}"
        try:
            async with session.get(url + path) as r:
                return r.status == 200
        except aiohttp.ClientConnectionError:
            return False

    await eventually(up, timeout_s=30.0, every_s=0.1)


async def test_serve_answers_and_stops_cleanly_on_sigterm():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenyard.sim", "serve", "--port", str(port), "--time-scale", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(session, url, proc)
            async with session.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
                assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _read_until(proc: subprocess.Popen, marker: bytes) -> bytes:
    """The process's output up to the line holding `marker`, or all of it if it exits first."""
    seen = b""
    for line in proc.stdout:
        seen += line
        if marker in line:
            break
    return seen


def sim_process(*argv: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tokenyard.sim", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
    )


async def test_vllm_serve_command_line_starts_the_engine_it_describes():
    port = free_port()
    proc = sim_process(
        "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
        "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", "chat",
        "--max_model_len=4096",
        "--no-enable-prefix-caching",
        "--block-size", "32",
        "--sim-time-scale", "0.05",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(session, url, proc)
            async with session.get(url + "/v1/models") as r:
                (card,) = (await r.json())["data"]
            assert (card["id"], card["root"], card["max_model_len"]) == (
                "chat",
                "meta-llama/Llama-3.1-8B-Instruct",
                4096,
            )
            async with session.get(url + "/metrics") as r:
                text = await r.text()
            info = next(
                s.labels
                for f in text_string_to_metric_families(text)
                if f.name == "vllm:cache_config_info"
                for s in f.samples
            )
            assert (info["enable_prefix_caching"], info["block_size"]) == ("False", "32")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        stop_process(proc, timeout=5)


async def test_sglang_command_line_starts_an_sglang_engine():
    port = free_port()
    proc = sim_process(
        "sglang", "--model-path", "/mnt/models/x", "--port", str(port), "--enable-metrics", "--tp", "2",
        TOKENYARD_SIM_MODEL="llama-3.1-8b",
        TOKENYARD_SIM_TIME_SCALE="0.05",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"  # SGLang's --host default
    try:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(session, url, proc)
            async with session.post(
                url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}
            ) as r:
                assert r.status == 200 and (await r.json())["meta_info"]["completion_tokens"] <= 2
            async with session.get(url + "/metrics") as r:
                assert "sglang:num_running_reqs" in await r.text()
            async with session.get(url + "/get_server_info") as r:
                assert (await r.json())["tp_size"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        stop_process(proc, timeout=5)


async def test_a_headless_worker_serves_nothing_and_stops_on_sigterm():
    port = free_port()
    proc = sim_process(
        "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
        "--host", "127.0.0.1", "--port", str(port),
        "--distributed-executor-backend", "mp", "--nnodes", "2", "--node-rank", "1",
        "--master-addr", "127.0.0.1", "--master-port", "29500", "--headless",
    )  # fmt: skip
    try:
        # The worker says so once it has parsed its command line and decided not to serve; then nothing listens.
        said = await asyncio.wait_for(asyncio.to_thread(_read_until, proc, b"serves no API"), timeout=20)
        assert b"serves no API" in said, said.decode(errors="replace")
        assert proc.poll() is None, said.decode(errors="replace")
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        stop_process(proc, timeout=5)


async def test_sglang_router_cache_aware_policy_routes_repeated_prefixes_to_the_same_engine(
    start_engine, tmp_path
):
    pytest.importorskip("sglang_router", reason="sglang-router is not installed (pip install sglang-router)")
    engines = [
        await start_engine(time_scale=0.05, served_model_name="sim-llama", report_cached_tokens=True)
        for _ in range(2)
    ]
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_PROXY": "*"}
    router = subprocess.Popen(
        [
            sys.executable, "-m", "sglang_router.launch_router",
            "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *[e.url for e in engines],
            "--policy", "cache_aware",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--log-level", "info",
        ],
        stdout=(tmp_path / "router.log").open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(session, url, router)
            families = [
                f"family {k}: " + f"context of family {k} " * 150 for k in range(3)
            ]  # odd: round robin would miss
            cached = []
            for _round in range(3):
                for prefix in families:
                    body = {"model": "sim-llama", "prompt": prefix + f"question {_round}", "max_tokens": 2}
                    async with session.post(url + "/v1/completions", json=body) as r:
                        assert r.status == 200, await r.text()
                        details = (await r.json())["usage"].get("prompt_tokens_details") or {}
                        cached.append(details.get("cached_tokens", 0))
            per_engine = [await scrape(session, e.url) for e in engines]
    finally:
        stop_process(router, timeout=10)
    # the engine gives the router no tokenizer to fetch, so it never reaches for the Hugging Face hub
    assert "huggingface" not in (tmp_path / "router.log").read_text().lower()
    # after the first round every family was routed back to the engine that holds its prefix
    assert all(c >= 576 for c in cached[len(families) :]), cached  # prompts of ~605 tokens
    hits = sum(m["vllm:prefix_cache_hits_total"] for m in per_engine)
    queries = sum(m["vllm:prefix_cache_queries_total"] for m in per_engine)
    assert hits / queries > 0.6
