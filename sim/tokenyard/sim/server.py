"""The HTTP API of one simulated engine (the aiohttp adapter), with the personality of vLLM or of SGLang.

vLLM (the default): paths and payloads follow vLLM's server (vllm/entrypoints/openai/api_server.py):
`POST /v1/completions`, `POST /v1/chat/completions` (SSE streaming ending in `data: [DONE]`, or one JSON body),
`GET /v1/models`, `GET /health`, `GET /version`, `POST /tokenize`, `POST /detokenize`, `GET /metrics`; plus
SGLang's `/get_server_info`, `/get_model_info` and `/get_load`, enough for `sglang-router` to use the engine as a
worker. Errors are vLLM's `ErrorResponse`: `{"error": {"message", "type", "param", "code"}}`
(vllm/entrypoints/openai/protocol.py, v0.13.0).

SGLang (`--personality sglang`, or an `sglang.launch_server` command line): SGLang's http_server paths
(python/sglang/srt/entrypoints/http_server.py): the OpenAI ones above, `/generate` (the native API, minimal),
`/health`, `/health_generate`, `/get_model_info`, `/get_server_info` (and `/model_info`, `/server_info`),
`/get_load`, `/flush_cache`, and `/metrics` only with `--enable-metrics` (404 otherwise, as SGLang). Errors are
SGLang's flat `ErrorResponse`: `{"object": "error", "message", "type", "param", "code"}`
(python/sglang/srt/entrypoints/openai/serving_base.py, `create_error_response`).

Both: `GET|POST /sim/config` to read and change the fault knobs of a running engine, `GET /sim/stats`. /metrics is
gzip-compressed when the client accepts it and OpenMetrics when it asks for it (`tokenyard.sim.metrics.exposition`),
and the `metrics_fault` knob breaks it on purpose ("garbage": 200 with a body that is no exposition format;
"error": 500) while generation goes on.

Timing: the engine core prices each step in modelled seconds; this adapter serves it `time_scale` times as
fast or slow, on a virtual clock that may lag the event loop but never runs ahead of it: when the loop is late
the next step starts at the previous step's end instead of now, so short delays (under the loop's timer
resolution) average out instead of accumulating. Every latency exported on /metrics is measured on the event
loop's clock, i.e. in served seconds as a client sees them.

Many engines share one event loop: an engine is an aiohttp runner on its own host:port and one stepping task
that sleeps while the engine is idle.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from aiohttp import web
from tokenyard.core.tokenizer import Tokenizer
from tokenyard.sim.engine import (
    Engine,
    EngineError,
    FinishReason,
    Request,
    SamplingParams,
    SchedulerConfig,
    StepOutcome,
)
from tokenyard.sim.metrics import EngineMetrics, SGLangMetrics, exposition, garbage_exposition
from tokenyard.sim.model import StepShape
from tokenyard.sim.options import (
    METRICS_FAULT_ERROR,
    METRICS_FAULT_GARBAGE,
    PERSONALITY_SGLANG,
    EngineOptions,
    FaultKnobs,
)

__all__ = ["DRAIN_TIMEOUT_S", "EngineOptions", "FaultKnobs", "SimEngine"]

log = logging.getLogger("tokenyard.sim")

VLLM_VERSION = "0.13.0-tokenyard-sim"  # what /version reports: the vLLM API generation this engine imitates
SGLANG_VERSION = "0.5.5-tokenyard-sim"  # what SGLang's /get_server_info reports
# /generate's sampling_params.max_new_tokens default (SGLang's SamplingParams)
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128
GEN_THROUGHPUT_WINDOW_S = 5.0  # sglang:gen_throughput is measured over the last few seconds
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default, which vLLM keeps
# vLLM's VLLM_MAX_N_SEQUENCES default (vllm/envs.py): the most choices one request may ask for
MAX_N_SEQUENCES = 16384
GREEDY_TEMPERATURE = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it samples greedily
DRAIN_TIMEOUT_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds
# How far the virtual clock may lag the event loop and still catch up (late timer wake-ups on a busy machine);
# beyond it the lag is given up and shows as latency.
MAX_CATCH_UP_S = 0.25


@dataclass
class TimingStats:
    """How faithfully the served timeline follows the model.

    Over each busy period (from the first step after idle to the last delivery before idle), the wall time taken
    is compared with the sum of the steps' served durations. Late timer wake-ups are made up by the virtual clock,
    so only lateness that could not be caught up shows as drift; per-step lateness is kept apart as jitter.
    """

    steps: int = 0
    nominal_s: float = 0.0  # sum of step durations as served (modelled x time scale)
    closed_busy_s: float = 0.0  # wall time of the busy periods that ended
    open_start: float | None = None
    last_delivery: float = 0.0
    late_s: float = 0.0  # sum of each step's delivery lateness against its nominal end

    def record(self, period_start: float, nominal_s: float, nominal_end: float, delivered: float) -> None:
        if self.open_start is None:
            self.open_start = period_start
        self.steps += 1
        self.nominal_s += nominal_s
        self.last_delivery = delivered
        self.late_s += max(0.0, delivered - nominal_end)

    def idle(self) -> None:
        if self.open_start is not None:
            self.closed_busy_s += self.last_delivery - self.open_start
            self.open_start = None

    @property
    def busy_s(self) -> float:
        open_part = self.last_delivery - self.open_start if self.open_start is not None else 0.0
        return self.closed_busy_s + open_part

    @property
    def drift(self) -> float:
        """Wall time over modelled time while busy, minus one (0.05: the engine runs 5% slower than modelled)."""
        return self.busy_s / self.nominal_s - 1.0 if self.nominal_s else 0.0

    @property
    def mean_jitter_s(self) -> float:
        return self.late_s / self.steps if self.steps else 0.0


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or {
            400: "BadRequestError",
            404: "NotFoundError",
            500: "InternalServerError",
            503: "ServiceUnavailableError",
        }.get(status, "Error")

    def response(self, personality: str = "vllm") -> web.Response:
        info = {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        if personality == PERSONALITY_SGLANG:
            body: dict[str, Any] = {"object": "error", **info}  # SGLang: flat, as vLLM before v0.10
        else:
            body = {"error": info}  # vLLM: ErrorResponse(error=ErrorInfo(...))
        return web.json_response(body, status=self.status)


@dataclass(eq=False)
class _Stream:
    """What the stepper hands to the request handler: text produced so far and how the request ended."""

    request: Request
    stops: tuple[str, ...]
    arrival_wall: float
    event: asyncio.Event = field(default_factory=asyncio.Event)
    index: int = 0  # which choice of the answer (the choices of one request share one event)
    sample: int = 0  # which of its prompt's ``n`` samples
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | None = None
    last_token_wall: float | None = None
    first_token_wall: float | None = None


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class SimEngine:
    """One simulated engine: the core, its HTTP server and its stepping task."""

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        self.deployment = options.validate()
        self.knobs = replace(options.knobs)
        d = self.deployment
        self.personality = options.personality
        # Both engines serve the model under the name it was launched with unless --served-model-name says
        # otherwise (vLLM: ModelConfig.served_model_name; SGLang: ServerArgs.served_model_name).
        self.model_name = options.served_model_name or options.model_path or d.model.hf_id
        self.model_names = (self.model_name, *options.served_model_aliases)
        self.tokenizer = Tokenizer(d.model.vocab_size)
        num_blocks = options.num_gpu_blocks_override or d.num_gpu_blocks
        max_model_len = min(
            options.max_model_len or d.model.max_position_embeddings, num_blocks * d.block_size
        )
        budget = d.max_num_batched_tokens
        if not options.enable_chunked_prefill:  # a whole prompt in one step (vLLM V0 / SGLang chunk -1)
            budget = max(budget, max_model_len)
        self.core = Engine(
            SchedulerConfig.for_deployment(
                d,
                num_gpu_blocks=num_blocks,
                max_model_len=max_model_len,
                max_num_batched_tokens=budget,
                enable_prefix_caching=options.enable_prefix_caching,
                cache_when_scheduled=self.personality != PERSONALITY_SGLANG,
            ),
            self._step_seconds,
            self.tokenizer,
        )
        self._generated: deque[tuple[float, int]] = deque()  # (loop time, tokens) per step, for throughput
        self._metrics_rng = random.Random(options.seed + 1)
        if self.personality == PERSONALITY_SGLANG:
            self.metrics: EngineMetrics | SGLangMetrics = SGLangMetrics(
                self.core, self.model_name, self.gen_throughput
            )
        else:
            # vLLM's `vllm:cache_config_info` labels are CacheConfig's fields (vllm/config/cache.py).
            cache_info = {
                "block_size": str(d.block_size),
                "num_gpu_blocks": str(num_blocks),
                "gpu_memory_utilization": str(d.gpu_memory_utilization),
                "enable_prefix_caching": str(options.enable_prefix_caching),
                "cache_dtype": options.kv_cache_dtype,
            }
            self.metrics = EngineMetrics(self.core, self.model_name, max_model_len, cache_info)
        self._rng = random.Random(options.seed)
        self.timing = TimingStats()
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._virtual_wall: float | None = None  # end of the last step on the loop clock
        self._t0_wall = 0.0
        self._created = int(time.time())
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._stepper: asyncio.Task | None = None
        self._started_wall = 0.0
        self._requests_seen = 0
        self.crashed = False
        self.draining = False
        self.bound_port: int | None = None

    def _step_seconds(self, shape: StepShape) -> float:
        # The knob scales the modelled step itself, so the engine's own clock sees the slow steps too.
        return self.deployment.step_seconds(shape) * self.knobs.latency_multiplier

    # --- clocks ---------------------------------------------------------------------------------------------
    @property
    def _loop_time(self) -> float:
        return asyncio.get_running_loop().time()

    def _modelled(self, wall: float) -> float:
        return (wall - self._t0_wall) / self.options.time_scale

    def _served(self, modelled: float) -> float:
        return self._t0_wall + modelled * self.options.time_scale

    @property
    def loaded(self) -> bool:
        elapsed = self._modelled(self._loop_time) - self._modelled(self._started_wall)
        return elapsed >= self.knobs.startup_seconds

    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.bound_port}"

    # --- lifecycle ------------------------------------------------------------------------------------------
    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2)
        r = app.router
        r.add_post("/v1/completions", self.handle_completions)
        r.add_post("/v1/chat/completions", self.handle_chat)
        r.add_get("/v1/models", self.handle_models)
        r.add_get("/health", self.handle_health)
        if self.personality == PERSONALITY_SGLANG:
            r.add_post("/generate", self.handle_generate)
            r.add_get("/flush_cache", self.handle_flush_cache)  # SGLang takes both methods
            if self.options.enable_metrics:  # SGLang mounts /metrics only with --enable-metrics
                r.add_get("/metrics", self.handle_metrics)
        else:
            r.add_get("/ping", self.handle_health)
            r.add_get("/version", self.handle_version)
            r.add_post("/tokenize", self.handle_tokenize)
            r.add_post("/detokenize", self.handle_detokenize)
            r.add_get("/metrics", self.handle_metrics)
        r.add_get("/get_server_info", self.handle_server_info)
        r.add_get("/server_info", self.handle_server_info)
        r.add_get("/get_model_info", self.handle_model_info)
        r.add_get("/model_info", self.handle_model_info)
        r.add_get("/get_load", self.handle_load)
        r.add_get("/health_generate", self.handle_health)
        r.add_post("/flush_cache", self.handle_flush_cache)
        r.add_get("/sim/config", self.handle_get_config)
        r.add_post("/sim/config", self.handle_set_config)
        r.add_get("/sim/stats", self.handle_stats)
        return app

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._t0_wall = self._started_wall = loop.time()
        self._runner = web.AppRunner(self.build_app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.options.host, self.options.port, reuse_address=True)
        await self._site.start()
        self.bound_port = self._runner.addresses[-1][1]
        self._stepper = asyncio.create_task(
            self._step_loop(), name=f"sim-step-{self.options.host}:{self.bound_port}"
        )
        log.info(
            "engine %s (%s on %d x %s) serving on %s, %d KV blocks, context %d",
            self.model_name,
            self.deployment.model.name,
            self.deployment.tp,
            self.deployment.gpu.name,
            self.url,
            self.core.config.num_gpu_blocks,
            self.core.config.max_model_len,
        )

    async def stop(self, drain_timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Stop taking requests, let in-flight ones finish for up to `drain_timeout_s`, then close."""
        self.draining = True
        if self._site is not None and not self.crashed:
            await self._site.stop()
        deadline = self._loop_time + drain_timeout_s
        while self._streams and self._loop_time < deadline:
            await asyncio.sleep(0.01)
        self._abort_all()
        if self._stepper is not None:
            self._stepper.cancel()
            await asyncio.gather(self._stepper, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()

    def _abort_all(self) -> None:
        now = self._modelled(self._loop_time)
        for stream in list(self._streams.values()):
            self._end(stream, FinishReason.ABORT, now)

    async def crash(self) -> None:
        """Behave like a dead process: refuse connections and drop the open ones (the crash-after-requests
        knob, and tests that kill one engine of a pod runner)."""
        if self.crashed:
            return
        self.crashed = True
        log.warning(
            "engine %s on %s crashes (crash_after_requests=%s)",
            self.model_name,
            self.url,
            self.knobs.crash_after_requests,
        )
        if self._site is not None:
            await self._site.stop()
        self._abort_all()
        server = self._runner.server if self._runner is not None else None
        for conn in list(getattr(server, "connections", []) if server else []):
            if conn.transport is not None:
                conn.transport.abort()

    # --- the stepping task ----------------------------------------------------------------------------------
    async def _step_loop(self) -> None:
        loop = asyncio.get_running_loop()
        period_start = loop.time()
        while True:
            if not self.core.has_work():
                self.timing.idle()
                self._wake.clear()
                await self._wake.wait()
                self._virtual_wall = None
                period_start = loop.time()
            now_wall = loop.time()
            start_wall = now_wall
            if self._virtual_wall is not None and now_wall - self._virtual_wall < MAX_CATCH_UP_S:
                start_wall = self._virtual_wall
            outcome = self.core.step(self._modelled(start_wall))
            if outcome is None:
                self._virtual_wall = None
                await asyncio.sleep(0.001)
                continue
            end_wall = self._served(outcome.end_s)
            delay = end_wall - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let request handlers run between back-to-back steps
            self._virtual_wall = end_wall
            self._deliver(outcome, start_wall)
            self.timing.record(period_start, end_wall - self._served(outcome.start_s), end_wall, loop.time())

    def _deliver(self, outcome: StepOutcome, start_wall: float) -> None:
        now_wall = self._loop_time
        m = self.metrics
        hit_tokens = input_tokens = 0
        for req in outcome.admitted:
            stream = self._streams.get(req.request_id)
            if stream is not None and req.num_preemptions == 0:
                m.observe_queue_time(max(0.0, start_wall - stream.arrival_wall))
                hit_tokens += req.num_cached_tokens or 0
                input_tokens += req.num_tokens
        m.observe_prefill_batch(hit_tokens, input_tokens)
        if outcome.tokens:
            self._record_generated(now_wall, len(outcome.tokens))
        token_str = self.tokenizer.token_str
        for req, token in outcome.tokens:
            stream = self._streams.get(req.request_id)
            if stream is None or stream.finish_reason is not None:
                continue
            if stream.last_token_wall is None:
                stream.first_token_wall = now_wall
                m.observe_first_token(now_wall - stream.arrival_wall)
            else:
                m.observe_inter_token(now_wall - stream.last_token_wall)
            stream.last_token_wall = now_wall
            stream.num_tokens += 1
            piece = token_str(token)
            if stream.stops and self._hit_stop(stream, piece):
                self.core.abort(req.request_id, outcome.end_s)
                self._end(stream, FinishReason.STOP, outcome.end_s)
                continue
            stream.text += piece
            stream.event.set()
        for req in outcome.finished:
            stream = self._streams.get(req.request_id)
            if stream is not None and req.finish_reason is not None:
                self._end(stream, req.finish_reason, outcome.end_s)

    @staticmethod
    def _hit_stop(stream: _Stream, piece: str) -> bool:
        window_start = max(0, len(stream.text) - max(map(len, stream.stops)))
        candidate = stream.text[window_start:] + piece
        for stop in stream.stops:
            at = candidate.find(stop)
            if at >= 0:
                stream.text = stream.text[:window_start] + candidate[:at]
                stream.stop_reason = stop
                return True
        return False

    def _end(self, stream: _Stream, reason: FinishReason, modelled_now: float) -> None:
        """Record the end of a request (once) and wake its handler."""
        if stream.finish_reason is not None:
            return
        req = stream.request
        if reason is FinishReason.ABORT:
            self.core.abort(req.request_id, modelled_now)
        stream.finish_reason = reason.value
        now = self._loop_time
        ttft = None if stream.first_token_wall is None else stream.first_token_wall - stream.arrival_wall
        self.metrics.observe_finished(
            reason, now - stream.arrival_wall, ttft, req.num_prompt_tokens, stream.num_tokens
        )
        self._streams.pop(req.request_id, None)
        stream.event.set()

    # --- generation -----------------------------------------------------------------------------------------
    def _check_serving(self) -> None:
        if self.draining:
            raise ApiError(503, "the engine is shutting down")
        if not self.loaded:
            raise ApiError(503, "the model is still loading")

    def _count_request(self) -> None:
        """A client's request came (once however many samples it asks for): the fault knobs may fail it."""
        self._requests_seen += 1
        crash_after = self.knobs.crash_after_requests
        if crash_after is not None and self._requests_seen > crash_after:
            asyncio.get_running_loop().create_task(self.crash())
            raise ApiError(503, "the engine crashed")
        if self.knobs.error_rate > 0 and self._rng.random() < self.knobs.error_rate:
            raise ApiError(500, "simulated engine error (error_rate knob)")

    def _admit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        stops: tuple[str, ...],
        index: int = 0,
        event: asyncio.Event | None = None,
        sample: int = 0,
    ) -> _Stream:
        wall = self._loop_time
        request_id = f"{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        try:
            req = self.core.add_request(request_id, prompt_ids, params, self._modelled(wall), sample=sample)
        except EngineError as e:
            raise ApiError(400, str(e), param="max_tokens" if "needs" in str(e) else None) from e
        stream = _Stream(req, stops, wall, index=index, sample=sample)
        if event is not None:
            stream.event = event
        self._streams[request_id] = stream
        self._wake.set()
        return stream

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        streams: list[_Stream] = []
        try:
            self._check_serving()
            body = await _json_body(request)
            prompts, params, stops, n = self._parse(body, kind)
            stream_mode = _get(body, "stream", bool, False)
            include_usage = bool((_get(body, "stream_options", dict, None) or {}).get("include_usage", False))
            self._count_request()
            if n > 1 and self.personality == PERSONALITY_SGLANG:
                for prompt_ids in prompts:
                    await self._prefill_first(prompt_ids)
            # vLLM makes each prompt of a batch a request of its own, and V1 fans a request of n samples out into
            # n requests to its scheduler (vllm/v1/engine/parallel_sampling.py, ParentRequest); choice
            # prompt * n + sample (serving_completion.py). They share one wake-up here.
            shared = asyncio.Event()
            for p, prompt_ids in enumerate(prompts):
                for sample in range(n):
                    streams.append(self._admit(prompt_ids, params, stops, p * n + sample, shared, sample))
        except ApiError as e:
            self._abort_unfinished(streams)
            return e.response(self.personality)
        created = int(time.time())
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        response_id = f"{prefix}-{uuid.uuid4().hex}"
        try:
            if stream_mode:
                return await self._stream_response(
                    request, streams, kind, response_id, created, include_usage
                )
            while any(s.finish_reason is None for s in streams):
                shared.clear()
                await shared.wait()
            return web.json_response(self._full_body(streams, kind, response_id, created))
        finally:  # client went away or the handler failed: free the engine's work
            self._abort_unfinished(streams)

    def _abort_unfinished(self, streams: list[_Stream]) -> None:
        for s in streams:
            if s.finish_reason is None:
                self._end(s, FinishReason.ABORT, self._modelled(self._loop_time))

    async def _prefill_first(self, prompt_ids: list[int]) -> None:
        """SGLang's way with ``n > 1``: before the samples, one request that only prefills the prompt, so that
        they all find it in the radix cache (``TokenizerManager._handle_batch_request``, "Cache the common
        prefix for parallel sampling": a copy with ``max_new_tokens = 0``, awaited). The sim's core needs one
        output token, which it samples in the prefill's own step, so the copy costs what the prefill does."""
        first = self._admit(prompt_ids, SamplingParams(1), ())
        try:
            while first.finish_reason is None:
                first.event.clear()
                await first.event.wait()
        finally:
            self._abort_unfinished([first])

    # --- SGLang's native /generate (text or input_ids, sampling_params, stream) ------------------------------
    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        try:
            self._check_serving()
            body = await _json_body(request)
            if isinstance(body.get("text"), str):
                prompt_ids = self.tokenizer.encode(body["text"])
            elif body.get("input_ids") is not None:
                input_ids = body["input_ids"]
                if not _is_token_ids(input_ids):
                    raise ApiError(400, "input_ids must be a list of token ids", param="input_ids")
                prompt_ids = self._prompt_ids(input_ids)
            else:
                raise ApiError(400, "give either text (a string) or input_ids", param="text")
            sampling = _get(body, "sampling_params", dict, {})
            max_new = _get(sampling, "max_new_tokens", int, SGLANG_DEFAULT_MAX_NEW_TOKENS)
            min_new = _get(sampling, "min_new_tokens", int, 0)
            stops = _stops(sampling.get("stop"))
            limit = self.core.config.max_model_len
            if not prompt_ids:
                raise ApiError(400, "the prompt is empty", param="text")
            if len(prompt_ids) + max_new > limit:
                raise ApiError(
                    400,
                    f"Requested token count exceeds the model's maximum context length of {limit} tokens. You "
                    f"requested a total of {len(prompt_ids) + max_new} tokens: {len(prompt_ids)} tokens from "
                    f"the input messages and {max_new} tokens for the completion.",
                )
            if max_new < 1 or not 0 <= min_new <= max_new:
                raise ApiError(400, "max_new_tokens must be >= 1 and min_new_tokens in [0, max_new_tokens]")
            params = SamplingParams(max_new, min_new, _get(sampling, "ignore_eos", bool, False))
            stream_mode = _get(body, "stream", bool, False)
            rid = body.get("rid") if isinstance(body.get("rid"), str) else uuid.uuid4().hex
            self._count_request()
            s = self._admit(prompt_ids, params, stops)
        except ApiError as e:  # SGLang's /generate answers {"error": {"message": ...}}
            return web.json_response({"error": {"message": e.message}}, status=e.status)
        try:
            if not stream_mode:
                while s.finish_reason is None:
                    s.event.clear()
                    await s.event.wait()
                return web.json_response({"text": s.text, "meta_info": self._meta_info(s, rid)})
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await resp.prepare(request)
            sent = 0
            try:
                while True:  # SGLang streams the text so far in every chunk
                    s.event.clear()
                    if s.finish_reason is not None or len(s.text) > sent:
                        sent = len(s.text)
                        chunk = {"text": s.text, "meta_info": self._meta_info(s, rid)}
                        await resp.write(_sse(chunk))
                        if s.finish_reason is not None:
                            break
                        continue
                    await s.event.wait()
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
            except ConnectionResetError:
                pass
            return resp
        finally:
            if s.finish_reason is None:
                self._end(s, FinishReason.ABORT, self._modelled(self._loop_time))

    def _meta_info(self, s: _Stream, rid: str) -> dict[str, Any]:
        finish: dict[str, Any] | None = None
        if s.finish_reason == FinishReason.LENGTH:
            finish = {"type": "length", "length": s.num_tokens}
        elif s.finish_reason == FinishReason.STOP:
            finish = {"type": "stop", "matched": s.stop_reason}
        elif s.finish_reason == FinishReason.ABORT:
            finish = {"type": "abort", "message": "the request was aborted"}
        return {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": s.request.num_prompt_tokens,
            "completion_tokens": s.num_tokens,
            "cached_tokens": s.request.num_cached_tokens or 0,
            "e2e_latency": self._loop_time - s.arrival_wall,
        }

    def _usage(self, streams: list[_Stream]) -> dict[str, Any]:
        """The answer's usage: each prompt counted once, the completion summed over the choices (vLLM's
        serving_completion.py and serving_chat.py: ``sum(len(output.token_ids) for output in outputs)``)."""
        first = streams[0]
        prompt = sum(s.request.num_prompt_tokens for s in streams if s.sample == 0)
        completion = sum(s.num_tokens for s in streams)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }
        # as the engines do (EngineOptions.report_cached_tokens): asked for, and only when some were cached
        cached = first.request.num_cached_tokens
        if self.options.report_cached_tokens and cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def _full_body(self, streams: list[_Stream], kind: str, response_id: str, created: int) -> dict[str, Any]:
        choices: list[dict[str, Any]] = []
        for s in streams:
            if kind == "chat":
                choices.append(
                    {
                        "index": s.index,
                        "message": {"role": "assistant", "content": s.text, "tool_calls": []},
                        "logprobs": None,
                        "finish_reason": s.finish_reason,
                        "stop_reason": s.stop_reason,
                    }
                )
            else:
                choices.append(
                    {
                        "index": s.index,
                        "text": s.text,
                        "logprobs": None,
                        "finish_reason": s.finish_reason,
                        "stop_reason": s.stop_reason,
                        "prompt_logprobs": None,
                    }
                )
        return {
            "id": response_id,
            "object": "chat.completion" if kind == "chat" else "text_completion",
            "created": created,
            "model": self.model_name,
            "choices": choices,
            "usage": self._usage(streams),
        }

    def _chunk(
        self, kind: str, response_id: str, created: int, text: str | None, finish: str | None, s: _Stream
    ):
        if kind == "chat":
            delta: dict[str, Any] = {} if text is None else {"content": text}
            choice: dict[str, Any] = {
                "index": s.index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
            }
            obj = "chat.completion.chunk"
        else:
            choice = {"index": s.index, "text": text or "", "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        if finish is not None:
            choice["stop_reason"] = s.stop_reason
        return {
            "id": response_id,
            "object": obj,
            "created": created,
            "model": self.model_name,
            "choices": [choice],
        }

    async def _stream_response(
        self,
        request: web.Request,
        streams: list[_Stream],
        kind: str,
        response_id: str,
        created: int,
        include_usage: bool,
    ) -> web.StreamResponse:
        """Each choice's text as it comes, one chunk per choice and step, tagged with the choice's index; a
        choice's last chunk carries its finish reason (vLLM's streaming generators: a chat stream opens with
        one role chunk per choice)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if kind == "chat":
            for s in streams:
                first = self._chunk(kind, response_id, created, "", None, s)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                await resp.write(_sse(first))
        shared = streams[0].event
        sent = [0] * len(streams)
        closed = [False] * len(streams)
        try:
            while not all(closed):
                shared.clear()
                for i, s in enumerate(streams):
                    if closed[i]:
                        continue
                    if len(s.text) > sent[i]:
                        piece = s.text[sent[i] :]
                        sent[i] = len(s.text)
                        await resp.write(_sse(self._chunk(kind, response_id, created, piece, None, s)))
                    if s.finish_reason is not None:
                        final = self._chunk(
                            kind, response_id, created, None if kind == "chat" else "", s.finish_reason, s
                        )
                        await resp.write(_sse(final))
                        closed[i] = True
                if not all(closed) and not shared.is_set():
                    await shared.wait()
            if include_usage:
                usage = {
                    "id": response_id,
                    "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                }
                usage.update(created=created, model=self.model_name, choices=[], usage=self._usage(streams))
                await resp.write(_sse(usage))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:  # the client went away; the caller aborts the request
            pass
        return resp

    def _parse(
        self, body: dict[str, Any], kind: str
    ) -> tuple[list[list[int]], SamplingParams, tuple[str, ...], int]:
        """The token ids of each prompt (a chat has one, a completion one or a batch), the sampling parameters,
        the stop strings and ``n``, the choices per prompt."""
        model = body.get("model")
        if model is not None and model not in self.model_names:
            raise ApiError(404, f"The model `{model}` does not exist.", param="model", kind="NotFoundError")
        n = self._sample_count(body)
        if kind == "chat":
            # vLLM's ChatCompletionRequest takes the same template flags as /tokenize (same defaults)
            add_generation_prompt = _get(body, "add_generation_prompt", bool, True)
            continue_final_message = _get(body, "continue_final_message", bool, False)
            if add_generation_prompt and continue_final_message:
                raise ApiError(
                    400,
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                    param="continue_final_message",
                )
            prompt_ids = self.tokenizer.encode(
                _chat_prompt(
                    body.get("messages"),
                    add_generation_prompt=add_generation_prompt,
                    continue_final_message=continue_final_message,
                )
            )
            max_tokens = _get(body, "max_completion_tokens", int, None)
            if max_tokens is None:
                max_tokens = _get(body, "max_tokens", int, None)
            if max_tokens is None:  # vLLM: whatever the context window leaves
                max_tokens = max(1, self.core.config.max_model_len - len(prompt_ids))
            prompts = [prompt_ids]
        else:
            prompts = self._completion_prompts(body.get("prompt"))
            max_tokens = _get(body, "max_tokens", int, None)
            if max_tokens is None:
                max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
        if max_tokens < 1:
            raise ApiError(400, f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
        for prompt_ids in prompts:
            self._check_fits(prompt_ids, max_tokens, kind)
        min_tokens = _get(body, "min_tokens", int, 0)
        if not 0 <= min_tokens <= max_tokens:
            raise ApiError(
                400, f"min_tokens must be between 0 and max_tokens, got {min_tokens}", param="min_tokens"
            )
        stops = _stops(body.get("stop"))
        for key in ("temperature", "top_p"):
            if key in body and body[key] is not None and not isinstance(body[key], int | float):
                raise ApiError(400, f"{key} must be a number", param=key)
        ignore_eos = _get(body, "ignore_eos", bool, False)
        return prompts, SamplingParams(max_tokens, min_tokens, ignore_eos), stops, n

    def _check_fits(self, prompt_ids: list[int], max_tokens: int, kind: str) -> None:
        """The prompt and its answer fit the context window (vLLM checks each prompt of a batch)."""
        if not prompt_ids:
            raise ApiError(400, "the prompt is empty", param="prompt" if kind != "chat" else "messages")
        limit = self.core.config.max_model_len
        if len(prompt_ids) >= limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, your prompt has "
                f"{len(prompt_ids)} tokens. Please reduce the length of the prompt.",
                param="messages" if kind == "chat" else "prompt",
            )
        if len(prompt_ids) + max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, {max_tokens} in the "
                f"completion). Please reduce the length of the prompt or completion.",
                param="max_tokens",
            )

    def _sample_count(self, body: dict[str, Any]) -> int:
        """``n``, as vLLM checks it (vllm/sampling_params.py, ``SamplingParams._verify_args`` and
        ``_verify_greedy_sampling``): at least 1, at most VLLM_MAX_N_SEQUENCES (16384 by default), and 1 when
        the temperature is 0 (below 1e-5), since greedy samples would all be the same."""
        n = _get(body, "n", int, 1)
        if n < 1:
            raise ApiError(400, f"n must be at least 1, got {n}.", param="n")
        if n > MAX_N_SEQUENCES:
            raise ApiError(
                400,
                f"n must be at most {MAX_N_SEQUENCES}, got {n}. To increase this limit, set the "
                "VLLM_MAX_N_SEQUENCES environment variable.",
                param="n",
            )
        temperature = body.get("temperature")
        greedy = isinstance(temperature, int | float) and temperature < GREEDY_TEMPERATURE
        if n > 1 and greedy and self.personality != PERSONALITY_SGLANG:
            raise ApiError(400, f"n must be 1 when using greedy sampling, got {n}.", param="n")
        return n

    def _completion_prompts(self, prompt: Any) -> list[list[int]]:
        """A completion's prompts: one (a string or a list of token ids) or a batch (a list of either), as vLLM's
        renderer takes them (``render_prompt_and_embeds``); each prompt of a batch is answered on its own."""
        if isinstance(prompt, str) or _is_token_ids(prompt):
            return [self._prompt_ids(prompt)]
        if (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(p, str) or _is_token_ids(p) for p in prompt)
        ):
            return [self._prompt_ids(p) for p in prompt]
        raise ApiError(
            400, "prompt must be a string, a list of token ids, or a list of either (a batch)", param="prompt"
        )

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        vocab = self.tokenizer.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise ApiError(400, f"token id {bad[0]} is out of vocabulary (size {vocab})", param="prompt")
        return list(prompt)

    # --- handlers -------------------------------------------------------------------------------------------
    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completion")

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def handle_models(self, request: web.Request) -> web.Response:
        root = self.options.model_path or self.deployment.model.hf_id
        if self.personality == PERSONALITY_SGLANG:
            cards = [
                {
                    "id": self.model_name,
                    "object": "model",
                    "created": self._created,
                    "owned_by": "sglang",
                    "root": root,
                    "max_model_len": self.core.config.max_model_len,
                }
            ]
        else:  # one card per served name, as vLLM's OpenAIServingModels.show_available_models
            cards = [
                {
                    "id": name,
                    "object": "model",
                    "created": self._created,
                    "owned_by": "vllm",
                    "root": root,
                    "parent": None,
                    "max_model_len": self.core.config.max_model_len,
                    "permission": [],
                }
                for name in self.model_names
            ]
        return web.json_response({"object": "list", "data": cards})

    async def handle_health(self, request: web.Request) -> web.Response:
        try:
            self._check_serving()
        except ApiError as e:
            return e.response(self.personality)
        return web.Response(status=200)

    async def handle_version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    # --- /tokenize and /detokenize ---------------------------------------------------------------------------
    # As vLLM v0.13.0 serves them, read in the source of the vllm 0.13.0 wheel:
    # vllm/entrypoints/serve/tokenize/{api_router,serving}.py and the TokenizeCompletionRequest /
    # TokenizeChatRequest / TokenizeResponse / DetokenizeRequest / DetokenizeResponse models of
    # vllm/entrypoints/openai/protocol.py (the user doc: "Tokenizer API" in serving/openai_compatible_server.md,
    # which points to those models). Request: {"model"?, "prompt", "add_special_tokens"
    # (default true), "return_token_strs"} or {"model"?, "messages", "add_generation_prompt" (default true),
    # "continue_final_message" (default false; not both), "add_special_tokens" (default false),
    # "return_token_strs", ...}; response {"count", "max_model_len", "tokens", "token_strs"} (token_strs null
    # unless asked for). /detokenize: {"model"?, "tokens"} -> {"prompt"}. Errors are ErrorResponse JSON: an unknown
    # model is 404 "NotFoundError" (OpenAIServing._check_model); a body that fails validation, or a request
    # that is not application/json, is 400 with type "Bad Request" (api_server's RequestValidationError handler);
    # a prompt that cannot be rendered is 400 "BadRequestError". No length check: vLLM's _validate_input skips
    # the context-window check for these requests. The sim's tokenizer has no special tokens (no BOS), so
    # add_special_tokens changes nothing, and the ids are exactly those the engine counts for the same
    # prompt or messages on /v1/completions and /v1/chat/completions.
    async def handle_tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await _vllm_json_body(request)
            self._check_model_vllm(body)
            return_token_strs = _pydantic_bool(body, "return_token_strs", False)
            if "messages" in body:
                add_generation_prompt = _pydantic_bool(body, "add_generation_prompt", True)
                continue_final_message = _pydantic_bool(body, "continue_final_message", False)
                _pydantic_bool(body, "add_special_tokens", False)
                if add_generation_prompt and continue_final_message:
                    raise _validation_error(
                        "Value error, Cannot set both `continue_final_message` and `add_generation_prompt` "
                        "to True.",
                    )
                messages = body["messages"]
                if not isinstance(messages, list):
                    raise _validation_error("messages: Input should be a valid list")
                try:
                    text = _chat_prompt(
                        messages,
                        add_generation_prompt=add_generation_prompt,
                        continue_final_message=continue_final_message,
                        allow_empty=True,
                    )
                except ApiError as e:  # vLLM: a malformed message fails the request's validation
                    raise _validation_error(e.message) from e
            elif "prompt" in body:
                _pydantic_bool(body, "add_special_tokens", True)
                if not isinstance(body["prompt"], str):
                    raise _validation_error("prompt: Input should be a valid string")
                text = body["prompt"]
            else:
                raise _validation_error("Field required: give `prompt` (a string) or `messages` (a list)")
        except ApiError as e:
            return e.response(self.personality)
        ids = self.tokenizer.encode(text)
        return web.json_response(
            {
                "count": len(ids),
                "max_model_len": self.core.config.max_model_len,
                "tokens": ids,
                "token_strs": [self.tokenizer.token_str(t) for t in ids] if return_token_strs else None,
            }
        )

    async def handle_detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await _vllm_json_body(request)
            self._check_model_vllm(body)
            if "tokens" not in body:
                raise _validation_error("tokens: Field required")
            tokens = body["tokens"]
            if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens
            ):
                raise _validation_error("tokens: Input should be a valid list of integers")
            vocab = self.tokenizer.vocab_size
            bad = [t for t in tokens if not 0 <= t < vocab]
            if bad:  # vLLM: the tokenizer's OverflowError becomes a validation error (400)
                raise _validation_error(f"token id {bad[0]} is out of vocabulary (size {vocab})")
        except ApiError as e:
            return e.response(self.personality)
        return web.json_response({"prompt": self.tokenizer.decode(tokens)})

    def _check_model_vllm(self, body: dict[str, Any]) -> None:
        """vLLM's OpenAIServing._check_model: no model (or an empty one) means the served model."""
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise _validation_error("model: Input should be a valid string")
        if model and model not in self.model_names:
            raise ApiError(404, f"The model `{model}` does not exist.", kind="NotFoundError")

    async def handle_metrics(self, request: web.Request) -> web.Response:
        accept_encoding = request.headers.get("Accept-Encoding")
        fault = self.knobs.metrics_fault
        if fault == METRICS_FAULT_ERROR:
            return web.Response(status=500, text="simulated /metrics failure (metrics_fault=error)\n")
        if fault == METRICS_FAULT_GARBAGE:
            body, headers = garbage_exposition(accept_encoding, self._metrics_rng)
        else:
            body, headers = exposition(self.metrics.registry, request.headers.get("Accept"), accept_encoding)
        return web.Response(body=body, headers=headers)

    def _record_generated(self, now: float, tokens: int) -> None:
        samples = self._generated
        samples.append((now, tokens))
        while samples and samples[0][0] < now - GEN_THROUGHPUT_WINDOW_S:
            samples.popleft()

    def gen_throughput(self) -> float:
        """Generated tokens per served second over the last GEN_THROUGHPUT_WINDOW_S (SGLang's gen_throughput)."""
        if not self._runner:
            return 0.0
        now = self._loop_time
        window = min(GEN_THROUGHPUT_WINDOW_S, now - self._started_wall)
        tokens = sum(n for t, n in self._generated if t >= now - GEN_THROUGHPUT_WINDOW_S)
        return tokens / window if window > 0 else 0.0

    async def handle_server_info(self, request: web.Request) -> web.Response:
        d, cfg = self.deployment, self.core.config
        # No model_path / tokenizer_path, on purpose: given one, sglang-router tries to download that tokenizer
        # from the Hugging Face hub (traffic off this machine); without, it routes on text, which is all it needs.
        info = {
            "served_model_name": self.model_name,
            "model": d.model.hf_id,
            "tp_size": d.tp,
            "dp_size": 1,
            "page_size": cfg.block_size,
            "context_length": cfg.max_model_len,
            "max_running_requests": cfg.max_num_seqs,
            "max_total_num_tokens": cfg.num_gpu_blocks * cfg.block_size,
            "chunked_prefill_size": cfg.max_num_batched_tokens,
            "version": SGLANG_VERSION if self.personality == PERSONALITY_SGLANG else VLLM_VERSION,
            "internal_states": [{"last_gen_throughput": self.gen_throughput(), "load": self._load()}],
        }
        return web.json_response(info)

    async def handle_model_info(self, request: web.Request) -> web.Response:
        # See handle_server_info for why there is no model_path / tokenizer_path.
        return web.json_response({"is_generation": True, "served_model_name": self.model_name})

    def _load(self) -> int:
        """Tokens the engine holds or still has to compute (SGLang reports its token usage as load)."""
        return sum(r.num_tokens for r in self.core.running) + sum(r.num_tokens for r in self.core.waiting)

    async def handle_load(self, request: web.Request) -> web.Response:
        return web.json_response(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": self.core.num_running + self.core.num_waiting,
                    "num_waiting_reqs": self.core.num_waiting,
                    "num_tokens": self._load(),
                }
            ]
        )

    async def handle_flush_cache(self, request: web.Request) -> web.Response:
        self.core.pool.evict_unreferenced()
        return web.Response(text="Cache flushed.\n")

    async def handle_stats(self, request: web.Request) -> web.Response:
        t = self.timing
        return web.json_response(
            {
                "steps": t.steps,
                "nominal_s": t.nominal_s,
                "busy_s": t.busy_s,
                "drift": t.drift,
                "mean_jitter_s": t.mean_jitter_s,
                "generation_tokens": self.core.generation_tokens,
                "time_scale": self.options.time_scale,
            }
        )

    async def handle_get_config(self, request: web.Request) -> web.Response:
        return web.json_response(asdict(self.knobs))

    async def handle_set_config(self, request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            known = {f.name for f in fields(FaultKnobs)}
            unknown = sorted(set(body) - known)
            if unknown:
                raise ApiError(400, f"unknown knob(s) {unknown}; known: {sorted(known)}", param=unknown[0])
            try:
                knobs = replace(self.knobs, **body).validated()
            except (TypeError, ValueError) as e:
                raise ApiError(400, str(e)) from e
        except ApiError as e:
            return e.response(self.personality)
        self.knobs = knobs
        log.info("engine %s on %s: knobs now %s", self.model_name, self.url, asdict(knobs))
        return web.json_response(asdict(self.knobs))


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _validation_error(message: str) -> ApiError:
    """What vLLM's RequestValidationError handler answers: 400, type "Bad Request" (HTTPStatus phrase)."""
    return ApiError(400, message, kind="Bad Request")


async def _vllm_json_body(request: web.Request) -> dict[str, Any]:
    """The body of a vLLM endpoint guarded by validate_json_request (vllm/entrypoints/openai/utils.py)."""
    if request.content_type != "application/json":
        raise _validation_error("Unsupported Media Type: Only 'application/json' is allowed")
    try:
        return await _json_body(request)
    except ApiError as e:
        raise _validation_error(e.message) from e


_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def _pydantic_bool(body: dict[str, Any], key: str, default: bool) -> bool:
    """A bool field as pydantic's lax mode reads JSON: true/false, 0/1, or one of its yes/no strings."""
    value = body.get(key, default)
    if value is None and key == "return_token_strs":  # declared `bool | None`
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise _validation_error(f"{key}: Input should be a valid boolean")


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _get(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ApiError(400, f"{key} must be of type {kind.__name__}, got {json.dumps(value)[:40]}", param=key)
    return value


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, list) and all(isinstance(x, str) for x in stop):
        return tuple(x for x in stop if x)
    raise ApiError(400, "stop must be a string or a list of strings", param="stop")


def _chat_prompt(
    messages: Any,
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    allow_empty: bool = False,
) -> str:
    """A plain chat template: `<|role|>` headers, then the generation prompt for the assistant.

    As a Hugging Face chat template renders with vLLM's flags: `add_generation_prompt=False` leaves the
    assistant header out; `continue_final_message=True` leaves the last message open (no closing newline) so
    the model continues it.
    """
    if not isinstance(messages, list) or (not messages and not allow_empty):
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    parts = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a role", param="messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ApiError(
                400, f"messages[{i}].content must be a string or a list of parts", param="messages"
            )
        parts.append(f"<|{message['role']}|>\n{content}\n")
    if continue_final_message and parts:
        parts[-1] = parts[-1][:-1]
    elif add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)
