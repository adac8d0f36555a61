"""bench-sim: the simulator against published figures, and the simulator's own capacity on this machine.

Part 1 drives the engine core (tokenyard.sim.engine) in modelled time, with the workload each published figure
was measured with where one exists (fixed input and output lengths, ignore_eos), and prints the simulator's
figure beside the published one and its source. Where no published figure for that model and GPU was found,
the table says so: none is invented. Each published figure has a role: `fit` (the model's per-sequence step cost,
PER_SEQUENCE_STEP_S, was fitted to it), `held out` (a check of that fit) or `excluded` (something besides the
engine limits it; its note says what). The last table line counts the figures within 15 percent, per role.
`.venv/bin/python bench/bench_sim.py --fit` redoes the fit: least squares on log(sim / published) over the `fit`
figures.

Part 2 measures how many streamed tokens per second one event loop (one core) serves before its timing drifts:
a server process hosts several engines; a client process streams from all of them at a fixed concurrency; the
time scale is lowered step by step (more tokens per second) until the engines run more than 5 percent slower than
the model says (`/sim/stats` drift: wall time while busy over the sum of the steps' modelled durations, minus one).

Run: `make bench-sim` or `.venv/bin/python bench/bench_sim.py`; `BENCH_QUICK=1` for the short version.
The last line printed is one JSON object: {"bench": "sim", "results": {...}}.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace

import aiohttp
from results_io import write_results
from tokenyard.core.process import stop_process
from tokenyard.core.tokenizer import Tokenizer
from tokenyard.sim.engine import Engine, Request, SamplingParams
from tokenyard.sim.model import Deployment, gpu_preset, model_preset

QUICK = os.environ.get("BENCH_QUICK") == "1"
DRIFT_LIMIT = 0.05


@dataclass(frozen=True)
class Published:
    value: float
    source: str
    note: str = ""
    # What the model's per-sequence step cost (PER_SEQUENCE_STEP_S) made of this figure: "fit" (fitted to it),
    # "held out" (not used, a check of the fit), "excluded" (not used: the note says what limits it besides the engine)
    role: str = "held out"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(
                f"published figure role {self.role!r} is none of {', '.join(ROLES)} ({self.note})"
            )


ROLES = ("fit", "held out", "excluded")


@dataclass(frozen=True)
class Row:
    model: str
    gpu: str
    tp: int
    input_len: int = 1024
    output_len: int = 128
    # (concurrency, published per-request decode tok/s or None): the closed-loop points simulated for this row
    decode: tuple[tuple[int, Published | None], ...] = ((1, None), (64, None))
    # (concurrency, published output throughput at that concurrency over the one at concurrency 1)
    gain: tuple[tuple[int, Published], ...] = ()
    prefill: Published | None = None
    max_seqs: Published | None = None


INFERENCEBENCH = (
    "InferenceBench concurrency-sweep recipe (https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/): "
    "Llama-3.1-8B-Instruct, 1x H100-80GB-HBM3, vLLM 0.21.0, fp16, workload llm.inference.chatbot-short"
)
INFERENCEBENCH_QWEN = (
    "InferenceBench reference run, github.com/yobitelcomm/bench validation-runs/2026-06-13-llm-h100/"
    "{c1-79d354b13545,c4-95cbfd4f49dc,c16-b91875fdf860}.json (tpot_p50_ms) and marketing/launch/README-hero.md "
    "(4x H100, TP=4, BF16): Qwen2.5-72B-Instruct, vLLM 0.22.1, workload llm.inference.chatbot-short"
)
# llm.inference.chatbot-short, from the InferenceBench source (plugins/llm-inference/src/inferencebench_llm/
# plugin.py): one of five one-sentence prompts sent as a chat message with max_tokens=128, streamed, TPOT =
# (total - TTFT) / (tokens out - 1). Derived lengths: about 48 prompt tokens once the model's chat template wraps
# the sentence (Llama 3.1's and Qwen 2.5's templates add a system header of 20-30 tokens), 128 out (the reference
# envelopes' total_p50 = TTFT + 127 x TPOT within 1%).
CHATBOT_SHORT = {"input_len": 48, "output_len": 128}
# Why InferenceBench's Llama-3.1-8B points at concurrency 16 and 64 are left out of the fit: the same run's output
# throughput is flat from concurrency 16 to 64 (1384 -> 1312 tok/s) while TPOT quadruples, so something outside the
# engine caps it near 1.4k tok/s (its closed-loop driver runs one Python thread per stream, each parsing litellm
# chunks). An engine step, whatever its per-sequence cost, would give more tokens per second at 64 than at 16.
CAPPED = "excluded: throughput flat 1384 -> 1312 tok/s from 16 to 64, a cap outside the engine"
MUSGRAVE = (
    "J. Musgrave, 'vLLM throughput-latency sweep on NVIDIA A100' "
    "(https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on): Llama-3.1-8B-Instruct bf16, 1x A100 40GB, "
    "vLLM 0.23.0, 1024 in / 128 out, ignore_eos"
)

ROWS = [
    Row(
        "llama-3.1-8b",
        "h100-sxm",
        1,
        **CHATBOT_SHORT,
        decode=(
            (
                1,
                Published(1000 / 6.48, INFERENCEBENCH, "1 / TPOT p50 (6.48 ms) at concurrency 1", role="fit"),
            ),
            (
                4,
                Published(1000 / 6.59, INFERENCEBENCH, "1 / TPOT p50 (6.59 ms) at concurrency 4", role="fit"),
            ),
            (
                16,
                Published(
                    1000 / 10.94,
                    INFERENCEBENCH,
                    f"1 / TPOT p50 (10.94 ms) at concurrency 16; {CAPPED}",
                    "excluded",
                ),
            ),
            (
                64,
                Published(
                    1000 / 46.91,
                    INFERENCEBENCH,
                    f"1 / TPOT p50 (46.91 ms) at concurrency 64; {CAPPED}",
                    "excluded",
                ),
            ),
        ),
    ),
    Row(
        "llama-3.1-8b",
        "a100-40gb",
        1,
        decode=(
            (
                1,
                Published(75.0, MUSGRAVE, "'decode at one request per time runs at about 75 tokens/sec'"),
            ),
            (
                8,
                Published(
                    6.6 * 75.0 / 8,
                    MUSGRAVE,
                    "derived: 6.6 x 75 tok/s / 8 requests from the '6.6x [throughput] gain' at 8; excluded: the gain is "
                    "in output throughput, which also pays for the prompts' prefill, so this is a floor on the "
                    "per-request decode rate, not a measure of it (output_gain_c8 compares the gain itself)",
                    "excluded",
                ),
            ),
        ),
        gain=(
            (
                8,
                Published(
                    6.6,
                    MUSGRAVE,
                    "'a 6.6x gain' in throughput at concurrency 8, read as output tok/s at 8 over output tok/s at 1",
                ),
            ),
        ),
    ),
    Row(
        "qwen2.5-72b",
        "h100-sxm",
        4,
        **CHATBOT_SHORT,
        decode=(
            (
                1,
                Published(
                    1000 / 16.05, INFERENCEBENCH_QWEN, "1 / TPOT p50 (16.05 ms) at concurrency 1", role="fit"
                ),
            ),
            (
                4,
                Published(
                    1000 / 16.43, INFERENCEBENCH_QWEN, "1 / TPOT p50 (16.43 ms) at concurrency 4", role="fit"
                ),
            ),
            (
                16,
                Published(
                    1000 / 17.30, INFERENCEBENCH_QWEN, "1 / TPOT p50 (17.30 ms) at concurrency 16", role="fit"
                ),
            ),
        ),
    ),
    Row("llama-3.1-8b", "a100-80gb", 1),
    Row("llama-3.1-70b", "h100-sxm", 4),
    Row("llama-3.1-70b", "h200", 2),
    Row("mixtral-8x7b", "h100-sxm", 2),
    Row("llama-3.1-8b", "l40s", 1),
]
if QUICK:
    ROWS = ROWS[:4]
# A published figure counts as matched within this ratio band (the 15 percent), taken symmetric on the
# log scale: 0.87 is 1/1.15, so the sim 15% slow and 15% fast are judged alike.
WITHIN = (0.87, 1.15)


# --- part 1: the model in modelled time ------------------------------------------------------------------------
def _burst(engine: Engine, count: int, input_len: int, output_len: int) -> list[Request]:
    """`count` requests arriving together at t=0, run to completion."""
    requests = [
        engine.add_request(str(i), _prompt(i, input_len), SamplingParams(output_len, ignore_eos=True), 0.0)
        for i in range(count)
    ]
    now = 0.0
    while (outcome := engine.step(now)) is not None:
        now = outcome.end_s
    return requests


def _prompt(i: int, length: int) -> list[int]:
    return [i * 1_000_000 + j for j in range(length)]  # distinct per request: no prefix-cache hits


def _closed_loop(
    engine: Engine, concurrency: int, input_len: int, output_len: int, total: int
) -> list[Request]:
    """`vllm bench serve --max-concurrency C` in modelled time: a new request as soon as one ends."""
    params = SamplingParams(output_len, ignore_eos=True)
    done: list[Request] = []
    issued = 0
    for _ in range(min(concurrency, total)):
        engine.add_request(str(issued), _prompt(issued, input_len), params, 0.0)
        issued += 1
    now = 0.0
    while (outcome := engine.step(now)) is not None:
        now = outcome.end_s
        for finished in outcome.finished:
            done.append(finished)
            if issued < total:
                engine.add_request(str(issued), _prompt(issued, input_len), params, now)
                issued += 1
    return done


def _decode_tok_s_per_request(requests: list[Request]) -> float:
    """1 / median TPOT, TPOT = (end - first token) / (output tokens - 1), as vLLM's serving benchmark has it."""
    tpots = [(r.finished_s - r.first_token_s) / (r.num_output_tokens - 1) for r in requests]
    return 1.0 / statistics.median(tpots)


def deployment(row: Row, per_sequence_step_s: float | None = None) -> Deployment:
    """The row's deployment, with the model's per-sequence step cost or the one given (for the fit)."""
    d = Deployment(model_preset(row.model), gpu_preset(row.gpu), tp=row.tp)
    return d if per_sequence_step_s is None else replace(d, per_sequence_step_s=per_sequence_step_s)


def closed_loop_figures(d: Deployment, row: Row, concurrency: int) -> tuple[float, float]:
    """(per-request decode tok/s, output tok/s of the whole run) in a closed loop at `concurrency` with the row's
    workload; the second is vLLM's serving benchmark's "Output token throughput": all output tokens over the time
    to the last request's end."""
    rounds = 5 if QUICK else 20  # requests per concurrency slot
    total = 3 if concurrency == 1 else concurrency * rounds
    engine = Engine.for_deployment(d, Tokenizer(d.model.vocab_size))
    requests = _closed_loop(engine, concurrency, row.input_len, row.output_len, total)
    output_tok_s = sum(r.num_output_tokens for r in requests) / max(r.finished_s for r in requests)
    return _decode_tok_s_per_request(requests), output_tok_s


def loop_figures(d: Deployment, row: Row) -> dict[str, float]:
    """The row's closed-loop figures: decode_tok_s_c<C> per decode point, output_gain_c<C> per gain point."""
    concurrencies = {c for c, _ in row.decode} | {c for c, _ in row.gain} | ({1} if row.gain else set())
    loops = {c: closed_loop_figures(d, row, c) for c in sorted(concurrencies)}
    figures = {f"decode_tok_s_c{c}": loops[c][0] for c, _ in row.decode}
    figures.update({f"output_gain_c{c}": loops[c][1] / loops[1][1] for c, _ in row.gain})
    return figures


def simulate(row: Row) -> dict[str, float]:
    d = deployment(row)
    figures = loop_figures(d, row)
    prefill_requests = _burst(Engine.for_deployment(d, Tokenizer(d.model.vocab_size)), 32, 1024, 1)
    figures["prefill_tok_s"] = sum(r.num_prompt_tokens for r in prefill_requests) / max(
        r.first_token_s for r in prefill_requests
    )
    figures["max_seqs"] = float(d.kv_capacity_tokens // (row.input_len + row.output_len))
    figures["num_gpu_blocks"] = float(d.num_gpu_blocks)
    return figures


def published_figures(row: Row) -> list[tuple[str, Published | None]]:
    """(metric, published figure or None) for every figure the row prints."""
    return [
        *((f"decode_tok_s_c{c}", p) for c, p in row.decode),
        *((f"output_gain_c{c}", p) for c, p in row.gain),
        ("prefill_tok_s", row.prefill),
        ("max_seqs", row.max_seqs),
    ]


def within(ratio: float) -> bool:
    return WITHIN[0] <= ratio <= WITHIN[1]


def fit_error(per_sequence_step_s: float) -> float:
    """Sum of squared log(sim / published) over the closed-loop figures marked `fit`."""
    error = 0.0
    for row in ROWS:
        fitted = [(m, p) for m, p in published_figures(row) if p and p.role == "fit"]
        if fitted:
            sim = loop_figures(deployment(row, per_sequence_step_s), row)
            error += sum(math.log(sim[metric] / published.value) ** 2 for metric, published in fitted)
    return error


def fit_per_sequence_step_s() -> float:
    """The per-sequence step cost that best fits the `fit` figures: a coarse grid, then a finer one around its best."""
    coarse = [i * 20e-6 for i in range(26)]  # 0 to 0.5 ms
    best = min(coarse, key=fit_error)
    fine = [max(0.0, best + i * 2e-6) for i in range(-10, 11)]
    best = min(fine, key=fit_error)
    print(
        f"per-sequence step cost fitted to the `fit` figures: {best * 1e3:.3f} ms (error {fit_error(best):.4f})"
    )
    return best


def part_one() -> dict[str, dict]:
    results: dict[str, dict] = {}
    sources: dict[str, str] = {}
    counts = {group: [0, 0] for group in ("all", *ROLES, "concurrency 8-16")}
    print("Part 1: simulated figures beside published ones (same model, GPU, TP and workload)")
    print(
        "decode tok/s per request = 1 / median TPOT in a closed loop at the given concurrency "
        "(prefills of arriving requests included, as in vLLM's serving benchmark); prefill tok/s = 32 x 1024-token "
        f"prompts arriving at once; per-sequence step cost {deployment(ROWS[0]).per_sequence_step_s * 1e3:.3f} ms; "
        "role: fit = the per-sequence step cost was fitted to it, held out = not used in the fit, excluded = not used "
        "in the fit because something besides the engine limits it (the note says what)"
    )
    header = f"{'preset':<28} {'metric':<20} {'sim':>9} {'published':>9}  ratio  role      note"
    print(header)
    print("-" * len(header))
    for row in ROWS:
        key = f"{row.model}/{row.gpu}/tp{row.tp}"
        sim = simulate(row)
        entry: dict[str, object] = {
            "workload": f"{row.input_len} in / {row.output_len} out",
            "num_gpu_blocks": int(sim["num_gpu_blocks"]),
        }
        for metric, published in published_figures(row):
            value = sim[metric]
            digits = 2 if metric.startswith("output_gain") else 1  # a gain of 5.74 is not one of 5.7
            entry[metric] = round(value, digits)
            entry[f"{metric}_published"] = round(published.value, digits) if published else None
            if published:
                entry[f"{metric}_role"] = published.role  # fit / held out / excluded, for the results table
                sources.setdefault(published.source, f"[{len(sources) + 1}]")
                ratio = value / published.value
                role = published.role
                concurrency = int(metric.rsplit("_c", 1)[1]) if "_c" in metric else 0
                for group in ("all", role) + (("concurrency 8-16",) if 8 <= concurrency <= 16 else ()):
                    counts[group][0] += within(ratio)
                    counts[group][1] += 1
                shown, ratio_text = f"{published.value:9.{digits}f}", f"{ratio:5.2f}"
                note = f"{sources[published.source]} {published.note}"
            else:
                shown, ratio_text, role, note = f"{'-':>9}", "    -", "", "no published figure found"
            print(f"{key:<28} {metric:<20} {value:9.{digits}f} {shown}  {ratio_text}  {role:<8}  {note}")
        results[key] = entry
    print()
    for source, mark in sources.items():
        print(f"{mark} {source}")
    print(
        "max_seqs: KV-cache tokens / (input + output) of the row's workload; no published vLLM log for these "
        "presets was found, so it stands without comparison."
    )
    print(
        f"within 15% (ratio {WITHIN[0]}-{WITHIN[1]}): "
        + "; ".join(f"{group} {n} of {total}" for group, (n, total) in counts.items())
    )
    print()
    results["within_15_percent"] = {group: {"within": n, "of": total} for group, (n, total) in counts.items()}
    return results


# --- part 2: capacity of one event loop ----------------------------------------------------------------------
def _free_ports(n: int) -> list[int]:
    sockets, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


async def _serve_engines(ports: list[int], time_scale: float) -> None:
    from tokenyard.sim.server import EngineOptions, SimEngine

    engines = [SimEngine(EngineOptions(port=p, time_scale=time_scale)) for p in ports]
    for e in engines:
        await e.start()
    print("READY", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for e in engines:
        await e.stop(drain_timeout_s=0.1)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(urls: list[str], streams_per_engine: int, duration_s: float) -> int:
    received = 0
    deadline = time.monotonic() + duration_s
    body = {
        "prompt": "capacity probe " * 64,
        "max_tokens": 128,
        "ignore_eos": True,
        "stream": True,
    }  # ~130 tokens

    async def stream_forever(session: aiohttp.ClientSession, url: str, k: int) -> None:
        nonlocal received
        while time.monotonic() < deadline:
            payload = {**body, "prompt": f"stream {k} " + body["prompt"]}
            async with session.post(url + "/v1/completions", json=payload) as response:
                async for line in response.content:
                    if line.startswith(b"data: {"):
                        text = json.loads(line[6:])["choices"][0]["text"]
                        received += len(text.split())
                    if time.monotonic() >= deadline:
                        return

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(
            *(stream_forever(session, url, k) for url in urls for k in range(streams_per_engine)),
            return_exceptions=False,
        )
    return received


async def _stats(urls: list[str]) -> tuple[float, float]:
    nominal = busy = 0.0
    async with aiohttp.ClientSession() as session:
        for url in urls:
            async with session.get(url + "/sim/stats") as r:
                s = await r.json()
            nominal += s["nominal_s"]
            busy += s["busy_s"]
    return nominal, busy


def measure_point(time_scale: float, engines: int, streams: int, duration_s: float) -> dict[str, float]:
    ports = _free_ports(engines)
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(time_scale), *map(str, ports)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "READY"
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        cpu_before = _cpu_seconds(server.pid)
        wall_before = time.monotonic()
        tokens = asyncio.run(_load(urls, streams, duration_s))
        wall = time.monotonic() - wall_before
        cpu = _cpu_seconds(server.pid) - cpu_before
        nominal, busy = asyncio.run(_stats(urls))
    finally:
        stop_process(server, timeout=10)
    return {
        "time_scale": time_scale,
        "streamed_tok_s": tokens / wall,
        "server_cpu_cores": cpu / wall,
        "drift": busy / nominal - 1.0 if nominal else 0.0,
    }


def part_two() -> dict[str, float]:
    engines, streams = 2, 16
    duration = 2.0 if QUICK else 3.0
    scales = [2.0, 1.4, 1.0, 0.7, 0.5, 0.35, 0.25, 0.18, 0.125, 0.09, 0.0625]
    load = os.getloadavg()[0]
    print(
        f"Part 2: one event loop serving {engines} engines x {streams} streams (llama-3.1-8b on h100-sxm, "
        f"~130-token prompts, 128 tokens out); machine load average {load:.1f} on {os.cpu_count()} cores"
    )
    header = (
        f"{'time_scale':>10} {'streamed tok/s':>15} {'server cores':>13} {'tok per cpu-s':>14} {'drift':>7}"
    )
    print(header)
    print("-" * len(header))
    best: dict[str, float] | None = None
    for scale in scales:
        point = measure_point(scale, engines, streams, duration)
        per_cpu_s = point["streamed_tok_s"] / point["server_cpu_cores"] if point["server_cpu_cores"] else 0.0
        point["tok_per_cpu_s"] = per_cpu_s
        print(
            f"{scale:>10.4f} {point['streamed_tok_s']:>15.0f} {point['server_cpu_cores']:>13.2f} "
            f"{per_cpu_s:>14.0f} {point['drift'] * 100:>6.1f}%"
        )
        if point["drift"] > DRIFT_LIMIT:
            break
        if best is None or point["streamed_tok_s"] > best["streamed_tok_s"]:
            best = point
    print()
    if best is None:
        return {"streamed_tok_s_per_core": 0.0, "note": "drift above 5% at every point"}
    # One event loop runs on one core at a time: the best rate within the drift limit is the per-core figure.
    print(
        f"capacity: {best['streamed_tok_s']:.0f} streamed tokens/s from one event loop with timing within "
        f"{DRIFT_LIMIT:.0%} ({best['server_cpu_cores']:.2f} cores busy, {best['tok_per_cpu_s']:.0f} tokens per "
        "CPU-second); the client streams from a second process on the same machine, and other work on the "
        "machine delays the loop's wake-ups, so the figure is a floor."
    )
    return {
        "streamed_tok_s_per_core": round(best["streamed_tok_s"], 1),
        "tokens_per_cpu_second": round(best["tok_per_cpu_s"], 1),
        "server_cpu_cores": round(best["server_cpu_cores"], 2),
        "drift": round(best["drift"], 4),
        "time_scale": best["time_scale"],
        "load_average": round(load, 2),
    }


def main() -> None:
    results = part_one()
    capacity = part_two()
    final = {"bench": "sim", "results": {**results, "capacity": capacity}}
    print(json.dumps(final))
    write_results("sim", final)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(_serve_engines([int(p) for p in sys.argv[3:]], float(sys.argv[2])))
    elif sys.argv[1:2] == ["--fit"]:
        fit_per_sequence_step_s()
    else:
        main()
