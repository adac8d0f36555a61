"""/tokenize and /detokenize over a real socket, as vLLM v0.13.0 serves them (see SimEngine.handle_tokenize)."""

import aiohttp
import pytest
from tokenyard.sim.server import EngineOptions, SimEngine

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
async def engine():
    engines: list[SimEngine] = []

    async def start(**options) -> SimEngine:
        e = SimEngine(EngineOptions(host="127.0.0.1", port=0, time_scale=0.05, **options))
        await e.start()
        engines.append(e)
        return e

    yield start
    for e in engines:
        await e.stop(drain_timeout_s=0.5)


@pytest.fixture
async def http():
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http, url, body=None, **kwargs):
    async with http.post(url, json=body, **kwargs) as r:
        return r.status, await r.json()


async def test_tokenize_prompt_gives_the_ids_the_engine_counts(engine, http):
    e = await engine()
    prompt = "Hello, simulated world. Tokens must match!"
    status, tok = await post(http, e.url + "/tokenize", {"model": MODEL, "prompt": prompt})
    assert status == 200
    assert set(tok) == {"count", "max_model_len", "tokens", "token_strs"}
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["token_strs"] is None
    assert tok["max_model_len"] == e.core.config.max_model_len
    body = {"prompt": prompt, "max_tokens": 1}
    status, done = await post(http, e.url + "/v1/completions", body)
    assert status == 200 and done["usage"]["prompt_tokens"] == tok["count"]
    # the model is optional; add_special_tokens is taken (the sim's tokenizer has no BOS to add)
    _, again = await post(http, e.url + "/tokenize", {"prompt": prompt, "add_special_tokens": False})
    assert again["tokens"] == tok["tokens"]
    # token strings concatenate back to the prompt, and /detokenize gives it back
    _, strs = await post(http, e.url + "/tokenize", {"prompt": prompt, "return_token_strs": True})
    assert "".join(strs["token_strs"]) == prompt and len(strs["token_strs"]) == strs["count"]
    status, detok = await post(http, e.url + "/detokenize", {"model": MODEL, "tokens": tok["tokens"]})
    assert status == 200 and detok == {"prompt": prompt}
    # an empty prompt is 0 tokens, not an error
    assert (await post(http, e.url + "/tokenize", {"prompt": ""}))[1]["count"] == 0


async def test_tokenize_messages_follows_the_chat_template_flags(engine, http):
    e = await engine()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    status, chat = await post(http, e.url + "/tokenize", {"messages": messages})
    assert status == 200
    status, done = await post(http, e.url + "/v1/chat/completions", {"messages": messages, "max_tokens": 1})
    assert status == 200 and done["usage"]["prompt_tokens"] == chat["count"]
    _, bare = await post(http, e.url + "/tokenize", {"messages": messages, "add_generation_prompt": False})
    # the same messages without the assistant header (the last piece differs: "\n" then "\n<|")
    assert bare["count"] < chat["count"] and chat["tokens"][: bare["count"] - 1] == bare["tokens"][:-1]
    body = {"messages": messages, "add_generation_prompt": False, "continue_final_message": True}
    _, open_ = await post(http, e.url + "/tokenize", {**body, "return_token_strs": True})
    assert "".join(open_["token_strs"]).endswith("Hi there")
    status, done = await post(http, e.url + "/v1/chat/completions", {**body, "max_tokens": 1})
    assert status == 200 and done["usage"]["prompt_tokens"] == open_["count"]


@pytest.mark.parametrize(
    ("path", "body", "status", "kind"),
    [
        ("/tokenize", {"model": "no/such-model", "prompt": "x"}, 404, "NotFoundError"),
        ("/detokenize", {"model": "no/such-model", "tokens": [1]}, 404, "NotFoundError"),
        ("/tokenize", {"model": MODEL}, 400, "Bad Request"),
        ("/tokenize", {"prompt": [1, 2, 3]}, 400, "Bad Request"),
        ("/tokenize", {"prompt": "x", "add_special_tokens": "maybe"}, 400, "Bad Request"),
        ("/tokenize", {"messages": "hi"}, 400, "Bad Request"),
        (
            "/tokenize",
            {"messages": [{"role": "user", "content": "x"}], "continue_final_message": True},
            400,
            "Bad Request",
        ),
        ("/tokenize", {"messages": [{"content": "no role"}]}, 400, "Bad Request"),
        ("/tokenize", {"model": 5, "prompt": "x"}, 400, "Bad Request"),
        ("/detokenize", {"tokens": "1 2"}, 400, "Bad Request"),
        ("/detokenize", {}, 400, "Bad Request"),
        ("/detokenize", {"tokens": [-1]}, 400, "Bad Request"),
    ],
)
async def test_errors_are_vllm_error_responses(engine, http, path, body, status, kind):
    e = await engine()
    got_status, got = await post(http, e.url + path, body)
    assert got_status == status
    assert set(got) == {"error"} and got["error"]["code"] == status and got["error"]["type"] == kind
    assert got["error"]["message"]


async def test_non_json_bodies_are_refused_as_vllm_does(engine, http):
    e = await engine()
    async with http.post(e.url + "/tokenize", data="prompt=x", headers={"Content-Type": "text/plain"}) as r:
        assert r.status == 400 and "application/json" in (await r.json())["error"]["message"]
    async with http.post(
        e.url + "/tokenize", data="{not json", headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == 400 and (await r.json())["error"]["type"] == "Bad Request"


async def test_sglang_personality_has_no_tokenize(engine, http):
    e = await engine(personality="sglang")
    async with http.post(e.url + "/tokenize", json={"prompt": "x"}) as r:
        assert r.status == 404
