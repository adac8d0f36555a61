"""/metrics over a real socket (gzip, OpenMetrics, the metrics_fault knob) and the SGLang personality's API."""

import gzip
import json
import zlib

import aiohttp
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration


@pytest.fixture
async def raw_http():
    """A client that hands back bodies exactly as sent (no transparent decompression)."""
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        yield session


async def get_metrics(session, url, **headers):
    async with session.get(url + "/metrics", headers=headers) as r:
        return r.status, r.headers, await r.read()


def names(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


async def test_metrics_are_gzipped_when_the_client_accepts_gzip(start_engine, raw_http):
    engine = await start_engine(time_scale=0.05, served_model_name="chat")
    async with raw_http.post(engine.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3}) as r:
        assert r.status == 200
    status, headers, body = await get_metrics(raw_http, engine.url, **{"Accept-Encoding": "gzip, deflate"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert body[:2] == b"\x1f\x8b"
    families = {f.name: f for f in text_string_to_metric_families(gzip.decompress(body).decode())}
    assert "vllm:num_requests_running" in families
    (generated,) = [s for s in families["vllm:generation_tokens"].samples if s.name.endswith("_total")]
    assert generated.value == 3 and generated.labels["model_name"] == "chat"

    status, headers, body = await get_metrics(raw_http, engine.url, **{"Accept-Encoding": "identity"})
    assert status == 200 and "Content-Encoding" not in headers
    assert "vllm:kv_cache_usage_perc" in names(body.decode())


async def test_metrics_speak_openmetrics_when_asked(start_engine, raw_http):
    engine = await start_engine(time_scale=0.05)
    accept = (
        "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,text/plain;version=0.0.4;q=0.3"
    )
    status, headers, body = await get_metrics(
        raw_http, engine.url, Accept=accept, **{"Accept-Encoding": "gzip"}
    )
    assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
    text = gzip.decompress(body).decode()
    assert text.endswith("# EOF\n") and "vllm:num_requests_waiting" in {
        f.name for f in parse_openmetrics(text)
    }


async def test_metrics_fault_breaks_metrics_but_not_serving(start_engine, raw_http, http):
    engine = await start_engine(time_scale=0.05)

    async def set_fault(value):
        async with http.post(engine.url + "/sim/config", json={"metrics_fault": value}) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["metrics_fault"] == value

    async def still_serves():
        async with http.post(engine.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 2

    await set_fault("garbage")
    status, headers, body = await get_metrics(raw_http, engine.url, **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    with pytest.raises(zlib.error, match="invalid block type"):
        gzip.decompress(body)
    async with http.get(engine.url + "/metrics") as r:  # a client that decompresses transparently fails too
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
    status, headers, body = await get_metrics(raw_http, engine.url, **{"Accept-Encoding": "identity"})
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    with pytest.raises(ValueError):
        names(body.decode())
    await still_serves()

    await set_fault("error")
    status, _, _ = await get_metrics(raw_http, engine.url)
    assert status == 500
    await still_serves()

    async with http.post(engine.url + "/sim/config", json={"metrics_fault": "sometimes"}) as r:
        assert r.status == 400 and "metrics_fault" in (await r.json())["error"]["message"]
    await set_fault("none")
    status, _, body = await get_metrics(raw_http, engine.url, **{"Accept-Encoding": "identity"})
    assert status == 200 and "vllm:num_requests_running" in names(body.decode())


async def test_metrics_fault_from_the_options_holds_from_the_start(start_engine, raw_http):
    from tokenyard.sim.options import FaultKnobs

    engine = await start_engine(time_scale=0.05, knobs=FaultKnobs(metrics_fault="error"))
    assert (await get_metrics(raw_http, engine.url))[0] == 500


# --- the SGLang personality --------------------------------------------------------------------------------
async def test_sglang_serves_metrics_only_with_enable_metrics(start_engine, http):
    quiet = await start_engine(time_scale=0.05, personality="sglang", enable_metrics=False)
    async with http.get(quiet.url + "/metrics") as r:
        assert r.status == 404
    loud = await start_engine(time_scale=0.05, personality="sglang", served_model_name="qwen")
    async with http.post(
        loud.url + "/v1/completions", json={"prompt": "one two three", "max_tokens": 4}
    ) as r:
        assert r.status == 200
    async with http.get(loud.url + "/metrics") as r:
        families = {f.name: f for f in text_string_to_metric_families(await r.text())}
    assert not [n for n in families if n.startswith("vllm:")]
    samples = {s.name: s for f in families.values() for s in f.samples if "le" not in s.labels}
    assert samples["sglang:generation_tokens_total"].value == 4
    assert samples["sglang:num_requests_total"].value == 1
    assert samples["sglang:cached_tokens_total"].value == 0
    assert samples["sglang:time_to_first_token_seconds_count"].value == 1
    assert samples["sglang:inter_token_latency_seconds_count"].value == 3
    assert samples["sglang:e2e_request_latency_seconds_count"].value == 1
    assert samples["sglang:num_running_reqs"].labels == {
        "model_name": "qwen",
        "engine_type": "unified",
        "tp_rank": "0",
        "pp_rank": "0",
    }
    assert samples["sglang:gen_throughput"].value > 0


async def test_sglang_api_surface(start_engine, http):
    engine = await start_engine(
        time_scale=0.05,
        personality="sglang",
        model_path="/mnt/pvc/models/qwen2.5-72b",
        model="qwen2.5-72b",
        tp=4,
    )
    url = engine.url
    async with http.get(url + "/v1/models") as r:
        (card,) = (await r.json())["data"]
    path = "/mnt/pvc/models/qwen2.5-72b"  # SGLang serves the model under its path unless told a name
    assert (card["id"], card["owned_by"], card["root"]) == (path, "sglang", path)
    for path in ("/health", "/health_generate", "/get_model_info", "/get_server_info", "/flush_cache"):
        async with http.get(url + path) as r:
            assert r.status == 200, path
    async with http.get(url + "/get_server_info") as r:
        info = await r.json()
    assert (info["tp_size"], info["page_size"]) == (4, 1) and info["version"].startswith("0.5")
    for path in ("/version", "/tokenize"):  # vLLM-only paths
        async with http.get(url + path) as r:
            assert r.status in (404, 405), path

    # SGLang's OpenAI errors are flat: {"object": "error", "message", "type", "param", "code"}
    async with http.post(url + "/v1/completions", json={"prompt": "hi", "n": 0}) as r:
        body = await r.json()
    assert r.status == 400 and body["object"] == "error" and body["code"] == 400 and body["param"] == "n"

    # /generate, the native API
    request = {"text": "tell me", "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}
    async with http.post(url + "/generate", json=request) as r:
        out = await r.json()
    assert r.status == 200 and out["text"]
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 5} and meta["completion_tokens"] == 5
    assert meta["prompt_tokens"] == 2

    chunks = []
    async with http.post(url + "/generate", json={**request, "stream": True}) as r:
        async for line in r.content:
            line = line.strip()
            if line == b"data: [DONE]":
                break
            if line:
                chunks.append(json.loads(line[len(b"data: ") :]))
    assert chunks[-1]["text"] == out["text"]  # the same prompt gives the same text; chunks are cumulative
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert all(a["text"] == b["text"][: len(a["text"])] for a, b in zip(chunks, chunks[1:], strict=False))

    async with http.post(url + "/generate", json={"sampling_params": {}}) as r:
        assert r.status == 400 and "text" in (await r.json())["error"]["message"]
