"""The simulated engine over a real socket: the effects the control plane exists for, and API compatibility."""

import asyncio
import json
import time

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tokenyard.sim.server import FaultKnobs

from tests.integration.sim.conftest import eventually, scrape

pytestmark = pytest.mark.integration

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


async def stream_ttft(session, url, body) -> tuple[float, list[dict]]:
    """Time to the first content chunk, and all chunks."""
    start = time.perf_counter()
    ttft = None
    chunks = []
    async with session.post(url + "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status == 200, await response.text()
        async for line in response.content:
            line = line.strip()
            if not line:
                continue
            assert line.startswith(b"data: ")
            if line == b"data: [DONE]":
                break
            chunk = json.loads(line[6:])
            chunks.append(chunk)
            if ttft is None and chunk["choices"] and chunk["choices"][0]["text"]:
                ttft = time.perf_counter() - start
    return ttft, chunks


async def test_a_repeated_long_prompt_gets_a_lower_ttft_and_more_prefix_hits(start_engine, http):
    engine = await start_engine(time_scale=1.0)
    body = {"prompt": "tell me a story about the sea " * 1000, "max_tokens": 2}  # about 7,000 tokens
    before = await scrape(http, engine.url)
    cold, _ = await stream_ttft(http, engine.url, body)
    after_cold = await scrape(http, engine.url)
    warm, _ = await stream_ttft(http, engine.url, body)
    after_warm = await scrape(http, engine.url)
    assert warm < cold / 3, (cold, warm)
    assert after_cold["vllm:prefix_cache_hits_total"] == before["vllm:prefix_cache_hits_total"]
    assert after_warm["vllm:prefix_cache_hits_total"] - after_cold["vllm:prefix_cache_hits_total"] >= 6_900
    assert after_warm["vllm:prefix_cache_queries_total"] > after_cold["vllm:prefix_cache_queries_total"]
    # the exported TTFT histogram saw both (in served seconds, what the client measured)
    assert after_warm["vllm:time_to_first_token_seconds_count"] == 2
    assert after_warm["vllm:time_to_first_token_seconds_sum"] == pytest.approx(cold + warm, rel=0.3, abs=0.02)


async def test_filling_the_cache_raises_usage_toward_one_then_preempts(start_engine, http):
    engine = await start_engine(time_scale=0.2, num_gpu_blocks_override=64, max_num_seqs=16)
    peak = {"usage": 0.0}

    async def one(i):
        body = {"prompt": f"request {i} " + "words " * 100, "max_tokens": 200, "ignore_eos": True}
        async with http.post(engine.url + "/v1/completions", json=body) as response:
            assert response.status == 200
            return await response.json()

    async def watch():
        while True:
            m = await scrape(http, engine.url)
            peak["usage"] = max(peak["usage"], m["vllm:kv_cache_usage_perc"])
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    results = await asyncio.gather(*(one(i) for i in range(8)))  # 8 x 19 blocks > 64
    watcher.cancel()
    m = await scrape(http, engine.url)
    assert peak["usage"] > 0.9
    assert m["vllm:num_preemptions_total"] > 0
    assert all(r["usage"]["completion_tokens"] == 200 for r in results)  # preempted ones were recomputed
    assert m["vllm:request_success_total{length}"] == 8
    assert m["vllm:kv_cache_usage_perc"] == 0.0


async def test_queueing_shows_in_num_requests_waiting(start_engine, http):
    engine = await start_engine(time_scale=0.5, max_num_seqs=2)
    body = {"prompt": "hello there", "max_tokens": 100, "ignore_eos": True}
    tasks = [asyncio.create_task(http.post(engine.url + "/v1/completions", json=body)) for _ in range(6)]

    async def queued():
        m = await scrape(http, engine.url)
        return m["vllm:num_requests_waiting"] == 4 and m["vllm:num_requests_running"] == 2

    await eventually(queued)
    for response in await asyncio.gather(*tasks):
        assert response.status == 200
        response.release()
    m = await scrape(http, engine.url)
    assert m["vllm:num_requests_waiting"] == 0 and m["vllm:request_queue_time_seconds_count"] == 6
    assert m["vllm:request_queue_time_seconds_sum"] > 0


async def test_the_official_openai_client_works_streaming_and_not(start_engine):
    engine = await start_engine(time_scale=0.1, max_model_len=1000, report_cached_tokens=True)
    client = openai.AsyncOpenAI(base_url=engine.url + "/v1", api_key="unused")
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]
        prompt = ("a shared system prompt " * 40).strip()  # 160 tokens
        completion = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=7)
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage.completion_tokens == 7 and completion.usage.prompt_tokens == 160
        assert completion.usage.prompt_tokens_details is None  # nothing cached: vLLM leaves the details out
        again = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=7)
        assert again.usage.prompt_tokens_details.cached_tokens == 144

        chat = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            extra_body={"ignore_eos": True},
        )
        assert (
            chat.choices[0].message.role == "assistant" and len(chat.choices[0].message.content.split()) == 5
        )
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, finish, usage = [], None, None
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        assert len("".join(pieces).split()) == 6
        assert finish == "length" and usage.completion_tokens == 6
        text_stream = await client.completions.create(model=MODEL, prompt="x y z", max_tokens=3, stream=True)
        texts = [c.choices[0].text async for c in text_stream if c.choices]
        assert len("".join(texts).split()) == 3

        with pytest.raises(openai.BadRequestError) as too_long:
            await client.completions.create(model=MODEL, prompt="word " * 2000, max_tokens=10)
        assert "maximum context length" in str(too_long.value)
    finally:
        await client.close()


async def test_prometheus_parses_metrics_with_vllm_names_types_and_labels(start_engine, http):
    engine = await start_engine(time_scale=0.1)
    async with http.post(engine.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}) as r:
        assert r.status == 200
    async with http.get(engine.url + "/metrics") as r:
        text = await r.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram",
        "vllm:cache_config_info": "gauge",
    }
    for name, kind in expected.items():
        assert families[name].type == kind, name
        for sample in families[name].samples:
            assert sample.labels["engine"] == "0"
            if name != "vllm:cache_config_info":
                assert sample.labels["model_name"] == MODEL
    info = families["vllm:cache_config_info"].samples[0].labels
    assert info["block_size"] == "16" and int(info["num_gpu_blocks"]) == engine.core.config.num_gpu_blocks
    success = {
        s.labels["finished_reason"]: s.value
        for s in families["vllm:request_success"].samples
        if s.name.endswith("_total")
    }
    assert success["length"] == 1
    generated = [s for s in families["vllm:generation_tokens"].samples if s.name.endswith("_total")]
    assert generated[0].value == 3


async def test_malformed_requests_get_vllm_style_errors(start_engine, http):
    engine = await start_engine(time_scale=0.1, max_model_len=1000)
    cases = [
        (b"{not json", 400, None),
        (json.dumps({"prompt": "hi", "max_tokens": "many"}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": "hi", "n": 0}).encode(), 400, "n"),
        (json.dumps({"prompt": "word " * 1200}).encode(), 400, "prompt"),
        (json.dumps({"prompt": "hi", "max_tokens": 5000}).encode(), 400, "max_tokens"),
        (json.dumps({"prompt": 42}).encode(), 400, "prompt"),
        (json.dumps({"prompt": "hi", "model": "gpt-4"}).encode(), 404, "model"),
    ]
    for raw, status, param in cases:
        async with http.post(
            engine.url + "/v1/completions", data=raw, headers={"Content-Type": "application/json"}
        ) as r:
            body = await r.json()
            assert r.status == status, body
            # vLLM v0.13.0's ErrorResponse: {"error": {"message", "type", "param", "code"}}
            assert set(body) == {"error"}, body
            error = body["error"]
            assert error["code"] == status and error["message"]
            assert error["type"] == ("BadRequestError" if status == 400 else "NotFoundError")
            assert error["param"] == param
    async with http.post(engine.url + "/v1/chat/completions", json={"messages": []}) as r:
        assert r.status == 400 and (await r.json())["error"]["param"] == "messages"


async def test_tokenize_detokenize_and_stop_strings(start_engine, http):
    engine = await start_engine(time_scale=0.1)
    async with http.post(engine.url + "/tokenize", json={"prompt": "Hello, simulated world"}) as r:
        tokenized = await r.json()
    assert tokenized["count"] == len(tokenized["tokens"]) == 5 and tokenized["max_model_len"] == 131072
    async with http.post(engine.url + "/detokenize", json={"tokens": tokenized["tokens"]}) as r:
        assert (await r.json())["prompt"] == "Hello, simulated world"

    body = {"prompt": "same prompt for both", "max_tokens": 12, "ignore_eos": True}
    async with http.post(engine.url + "/v1/completions", json=body) as r:
        full = (await r.json())["choices"][0]["text"]
    stop_word = full.split()[5]
    async with http.post(
        engine.url + "/v1/completions", json={**body, "stop": [stop_word, "never seen"]}
    ) as r:
        stopped = (await r.json())["choices"][0]
    # generation is deterministic for a prompt, so the stopped text is the full text cut before the stop string
    assert stopped["text"] == full[: full.find(stop_word)]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop_word

    async with http.post(
        engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 50, "min_tokens": 50}
    ) as r:
        assert (await r.json())["usage"]["completion_tokens"] == 50


async def test_fault_knobs_and_their_admin_endpoint(start_engine, http):
    engine = await start_engine(time_scale=0.1, knobs=FaultKnobs(startup_seconds=1.0))
    async with http.get(engine.url + "/health") as r:
        assert r.status == 503

    async def healthy():
        async with http.get(engine.url + "/health") as r:
            return r.status == 200

    await eventually(healthy, timeout_s=2.0)  # 1 modelled second at time scale 0.1

    async def ttft(prompt):
        start = time.perf_counter()
        async with http.post(engine.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}) as r:
            assert r.status == 200
        return time.perf_counter() - start

    # long prompts: the modelled prefill (x10) must dwarf the HTTP round trip, which is not multiplied
    base = await ttft("one two three " * 3000)
    async with http.post(engine.url + "/sim/config", json={"latency_multiplier": 10.0}) as r:
        assert r.status == 200 and (await r.json())["latency_multiplier"] == 10.0
    slow = await ttft("four five six " * 3000)
    assert slow > 4 * base, (base, slow)

    async with http.post(
        engine.url + "/sim/config", json={"error_rate": 1.0, "latency_multiplier": 1.0}
    ) as r:
        assert r.status == 200
    async with http.post(engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as r:
        assert r.status == 500 and (await r.json())["error"]["type"] == "InternalServerError"
    async with http.post(engine.url + "/sim/config", json={"error_rate": 2}) as r:
        assert r.status == 400 and "error_rate" in (await r.json())["error"]["message"]
    async with http.post(engine.url + "/sim/config", json={"explode": True}) as r:
        assert r.status == 400 and "explode" in (await r.json())["error"]["message"]

    async with http.post(
        engine.url + "/sim/config", json={"error_rate": 0.0, "crash_after_requests": 1}
    ) as r:
        assert r.status == 200
    async with http.post(engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}) as r:
        assert r.status == 503  # the request that crashes it

    async def refused():
        try:
            async with http.get(engine.url + "/health"):
                return False
        except aiohttp.ClientConnectionError:
            return True

    await eventually(refused, timeout_s=2.0)
    assert engine.crashed


async def test_client_disconnect_frees_the_engine(start_engine, http):
    engine = await start_engine(time_scale=1.0)
    body = {"prompt": "long one", "max_tokens": 5000, "ignore_eos": True, "stream": True}
    async with http.post(engine.url + "/v1/completions", json=body) as r:
        await r.content.readline()

    async def idle():
        return engine.core.num_running == 0

    await eventually(idle, timeout_s=2.0)
    m = await scrape(http, engine.url)
    assert m["vllm:request_success_total{abort}"] == 1 and m["vllm:kv_cache_usage_perc"] == 0


async def test_dozens_of_engines_share_one_loop(start_engine, http):
    engines = await asyncio.gather(
        *(start_engine(host=f"127.0.0.{i}", time_scale=0.05) for i in range(2, 26))
    )
    body = {"prompt": "hello from a pod", "max_tokens": 20, "ignore_eos": True}

    async def ask(e):
        async with http.post(e.url + "/v1/completions", json=body) as r:
            return (await r.json())["usage"]["completion_tokens"]

    assert await asyncio.gather(*(ask(e) for e in engines)) == [20] * 24
    assert len({e.url for e in engines}) == 24


def cached_tokens(usage: dict) -> int:
    """What the engine says was cached: no details (the engines leave them out at 0) is none."""
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


async def test_cached_tokens_are_reported_only_when_asked_for_as_the_engines_do(start_engine, http):
    body = {"prompt": "a prompt long enough to fill blocks " * 20, "max_tokens": 1}
    quiet, reporting = (
        await start_engine(time_scale=0.1),
        await start_engine(time_scale=0.1, report_cached_tokens=True),
    )
    usages = {}
    for name, engine in (("quiet", quiet), ("reporting", reporting)):
        for round_ in range(2):
            async with http.post(engine.url + "/v1/completions", json=body) as r:
                usages[name, round_] = (await r.json())["usage"]
    assert "prompt_tokens_details" not in usages["quiet", 1]  # vLLM without --enable-prompt-tokens-details
    assert "prompt_tokens_details" not in usages["reporting", 0]  # nothing cached yet: left out, not 0
    assert usages["reporting", 1]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_sglang_side_endpoints_and_flush_cache(start_engine, http):
    engine = await start_engine(time_scale=0.1, report_cached_tokens=True)
    body = {"prompt": "a prompt long enough to fill blocks " * 20, "max_tokens": 1}
    for _ in range(2):
        async with http.post(engine.url + "/v1/completions", json=body) as r:
            cached = cached_tokens((await r.json())["usage"])
    assert cached > 0
    async with http.get(engine.url + "/get_server_info") as r:
        info = await r.json()
    assert info["tp_size"] == 1 and info["page_size"] == 16 and info["max_total_num_tokens"] > 0
    async with http.get(engine.url + "/get_load") as r:
        assert (await r.json())[0]["num_reqs"] == 0
    async with http.post(engine.url + "/flush_cache") as r:
        assert r.status == 200
    async with http.post(engine.url + "/v1/completions", json=body) as r:
        assert cached_tokens((await r.json())["usage"]) == 0


async def test_n_samples_come_as_n_choices_with_their_usage_summed(start_engine, http):
    """vLLM's parallel sampling: n choices indexed 0..n-1, the prompt counted once and the completion tokens
    summed; each sample a request of its own to the scheduler (so /metrics counts n finished requests)."""
    engine = await start_engine(time_scale=0.05, report_cached_tokens=True)
    body = {"model": MODEL, "prompt": "one prompt sampled four times " * 30, "max_tokens": 300, "n": 4}
    async with http.post(engine.url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    choices = answer["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert len({len(c["text"]) for c in choices}) > 1  # each sample ends at its own length
    assert answer["usage"]["prompt_tokens"] == len(engine.tokenizer.encode(body["prompt"]))
    m = await scrape(http, engine.url)
    assert answer["usage"]["completion_tokens"] == m["vllm:generation_tokens_total"] > 4
    assert m["vllm:request_success_total{stop}"] + m.get("vllm:request_success_total{length}", 0) == 4
    # the samples after the first found the prompt the first one's step was computing
    assert m["vllm:prefix_cache_hits_total"] >= 3 * (answer["usage"]["prompt_tokens"] // 16 - 1) * 16


async def test_n_samples_stream_each_chunk_tagged_with_its_choice(start_engine, http):
    engine = await start_engine(time_scale=0.05)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "three answers please"}],
        "max_tokens": 40,
        "ignore_eos": True,
        "n": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    roles: list[int] = []
    text: dict[int, str] = {0: "", 1: "", 2: ""}
    finished: list[int] = []
    usage = None
    async with http.post(engine.url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if not line.strip() or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line.strip()[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                delta = choice["delta"]
                if delta.get("role"):
                    roles.append(choice["index"])
                text[choice["index"]] += delta.get("content") or ""
                if choice["finish_reason"]:
                    finished.append(choice["index"])
    assert roles == [0, 1, 2]
    assert sorted(finished) == [0, 1, 2]
    assert all(text.values())
    assert usage["completion_tokens"] == 120  # 40 each (ignore_eos)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"n": 0}, "n must be at least 1, got 0."),
        ({"n": 2, "temperature": 0}, "n must be 1 when using greedy sampling, got 2."),
        ({"n": 20_000}, "n must be at most 16384, got 20000."),
        ({"n": "2"}, "n must be of type int"),
    ],
)
async def test_a_bad_n_is_refused_as_vllm_refuses_it(start_engine, http, body, message):
    engine = await start_engine(time_scale=0.05)
    async with http.post(engine.url + "/v1/completions", json={"prompt": "hi", **body}) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error["message"].startswith(message) and error["param"] == "n"
    m = await scrape(http, engine.url)
    assert m.get("vllm:request_success_total{stop}", 0) == 0 and m["vllm:num_requests_running"] == 0


async def test_sglang_prefills_the_prompt_once_before_its_samples(start_engine, http):
    """SGLang runs a prefill-only copy of the prompt first, then the n samples, which find it cached."""
    engine = await start_engine(time_scale=0.05, personality="sglang", report_cached_tokens=True)
    prompt = "a prompt SGLang samples twice " * 30
    body = {"prompt": prompt, "max_tokens": 5, "ignore_eos": True, "n": 2}
    async with http.post(engine.url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    prompt_tokens = answer["usage"]["prompt_tokens"]
    assert answer["usage"]["completion_tokens"] == 10
    assert (
        cached_tokens(answer["usage"]) == prompt_tokens - 1
    )  # page size 1: all but the token it samples from
    assert engine.core.prefix_cache_hits == 2 * (prompt_tokens - 1)


async def test_a_batch_of_prompts_is_answered_prompt_by_prompt_n_choices_each(start_engine, http):
    """vLLM's completions take a list of prompts (strings or token ids): each is a request of its own, its
    choices numbered prompt * n + sample, and the usage sums every prompt and every answer."""
    engine = await start_engine(time_scale=0.05)
    first, second = engine.tokenizer.encode("the first prompt " * 20), [5, 6, 7, 8, 9]
    body = {"prompt": [first, second], "max_tokens": 6, "ignore_eos": True, "n": 2}
    async with http.post(engine.url + "/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()
        answer = await r.json()
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    assert answer["usage"]["prompt_tokens"] == len(first) + len(second)
    assert answer["usage"]["completion_tokens"] == 4 * 6
    m = await scrape(http, engine.url)
    assert m["vllm:request_success_total{length}"] == 4
    async with http.post(engine.url + "/v1/completions", json={"prompt": ["fine", 42]}) as r:
        assert r.status == 400
        assert (await r.json())["error"]["param"] == "prompt"
