"""The peer routers of the router benchmark (issue 14): how to launch vllm-router's and sglang-router's
`cache_aware` policy, and the grid each is tuned over.

Versions: vllm-router 0.1.17 (PyPI `vllm-router`, console script `vllm-router` = `vllm_router.launch_router:main`)
and sglang-router 0.3.2 (PyPI `sglang-router`, `python -m sglang_router.launch_router`). Every default below is read
from those installed packages: the `RouterArgs` dataclass of `vllm_router/router_args.py` (0.1.17) and of
`sglang_router/router_args.py` (0.3.2), whose values `--help` prints and the Rust core echoes at start-up
("policy: CacheAware { cache_threshold: 0.3, balance_abs_threshold: 64, ... }" in vllm-router's log).

`cache_aware`, in both (the design comment of vllm-project/router src/policies/cache_aware.rs, the same design
as sglang's; not read at the 0.1.17 tag, whose source was not at hand):
- the router keeps an approximate radix tree per worker of the text it sent there (0.1.17's --help calls
  max_tree_size a "per-worker character budget"; what it does with the token ids it fetches, below, is not
  documented there);
- a request goes to the worker with the longest prefix match if match length / request length >
  `cache_threshold`, else to the worker with the smallest tree;
- unless the fleet is imbalanced, i.e. (max_load - min_load) > `balance_abs_threshold` AND
  max_load > min_load * `balance_rel_threshold` (load = requests in flight at that worker, as the router
  counts them), when it goes to the least-loaded worker instead;
- every `eviction_interval_secs`, each worker's tree is cut back (LRU leaves first) to `max_tree_size`
  characters.

Defaults (cache_threshold, balance_abs_threshold, balance_rel_threshold, eviction_interval_secs, max_tree_size):
- vllm-router 0.1.17:  0.3, 64, 1.5, 120, 2**25 (33,554,432) -- vllm_router/router_args.py, RouterArgs;
- sglang-router 0.3.2: 0.3, 64, 1.5, 60, 2**26 (67,108,864) -- sglang_router/router_args.py, RouterArgs.

What each needs of the workers (checked against tokenyard.sim engines with the vLLM personality, through a
logging proxy):
- vllm-router: `GET /health` (at start-up, until one worker answers 200, then every
  `--health-check-interval-secs`, default 60). With `cache_aware`, for EVERY request it first posts the request to
  `/v1/completions/render` (or `/v1/chat/completions/render`) on every worker, and on a 404 (vLLM v0.13 has no
  render endpoint) posts `{"model", "prompt"}` (or `{"model", "messages", "continue_final_message"}`) to `/tokenize`
  on every worker, then forwards the request to one worker: 2 x workers extra round trips per request, in its
  measured TTFT, as against a real vLLM v0.13 fleet. round_robin makes none of these calls. Seen on an idle
  fleet: sequential requests with no prefix match all went to the same worker; under concurrency they spread. Its own metric
  `vllm_router_kv_routing_inputs_total{transport="http",result="tokenize"}` counts the /tokenize answers.
  /v1/models is passed through to a worker.
- sglang-router: `GET /health`, and at registration `GET /server_info` and `GET /model_info` of each worker.
  It refuses a /v1/completions body without "model" (422 from its own JSON schema), and forwards a chat
  request without "model" as model "unknown" (which the engine then refuses): always send "model".

Readiness: poll `GET {router}/readiness` until it answers 200 with healthy_workers == total_workers: both routers
serve `{"status": "ready", "healthy_workers": N, "total_workers": M}` there (`/liveness` answers 200 as soon as
the process listens; vllm-router opens its port only once at least one worker's /health said 200).
`router_ready` below reads that answer. Both routers also serve /health, /workers and /v1/models.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

VLLM_ROUTER_VERSION = "0.1.17"
SGLANG_ROUTER_VERSION = "0.3.2"

READINESS_PATH = "/readiness"

# The cache_aware options both routers take (same names, same flags: option `x_y` is `--x-y`).
CACHE_AWARE_OPTIONS = (
    "cache_threshold",
    "balance_abs_threshold",
    "balance_rel_threshold",
    "eviction_interval_secs",
    "max_tree_size",
)

# Defaults, from each package's RouterArgs (see the module docstring); the "defaults" grid entry passes none of
# them, so the router's own defaults apply, and these are for reports.
VLLM_ROUTER_DEFAULTS: Mapping[str, float | int] = {
    "cache_threshold": 0.3,
    "balance_abs_threshold": 64,
    "balance_rel_threshold": 1.5,
    "eviction_interval_secs": 120,
    "max_tree_size": 2**25,
}
SGLANG_ROUTER_DEFAULTS: Mapping[str, float | int] = {
    "cache_threshold": 0.3,
    "balance_abs_threshold": 64,
    "balance_rel_threshold": 1.5,
    "eviction_interval_secs": 60,
    "max_tree_size": 2**26,
}

# Tuning grids: name -> cache_aware options (unset ones keep the router's default). Chosen on the tuning workloads
# only, like tokenyard's own defaults. They span the two decisions cache_aware makes:
# - cache_threshold: how much of a prompt must match before locality wins (0.1 follows almost any shared system
#   prompt; 0.6 only near-duplicates);
# - the balance thresholds: how early it gives up locality for load (abs 8 / rel 1.2 reacts to small queues; the
#   default abs 64 rarely triggers on a fleet of a few engines at benchmark concurrency);
# - eviction: a tree cut back often to about what an engine's KV cache holds, so the router forgets what the
#   engines have evicted (max_tree_size counts characters: 2**20 is ~250k tokens of English text).
_GRID: dict[str, dict[str, float | int]] = {
    "defaults": {},
    "threshold_0.1": {"cache_threshold": 0.1},
    "threshold_0.6": {"cache_threshold": 0.6},
    "balance_early": {"balance_abs_threshold": 8, "balance_rel_threshold": 1.2},
    "threshold_0.1_balance_early": {
        "cache_threshold": 0.1,
        "balance_abs_threshold": 8,
        "balance_rel_threshold": 1.2,
    },
    "balance_mid_small_tree": {
        "balance_abs_threshold": 16,
        "balance_rel_threshold": 1.3,
        "eviction_interval_secs": 5,
        "max_tree_size": 2**20,
    },
}
VLLM_ROUTER_GRID: Mapping[str, Mapping[str, float | int]] = {k: dict(v) for k, v in _GRID.items()}
SGLANG_ROUTER_GRID: Mapping[str, Mapping[str, float | int]] = {k: dict(v) for k, v in _GRID.items()}
# Settings that select another of the peer's policies instead of a cache_aware grid point (`sglang:round_robin`
# in BENCH_POLICIES). round_robin is round robin as a user would deploy it: a proxy in the path, with the same
# hop as every router, where the benchmark's own `round_robin` row is dispatched by the load generator straight
# to the engines (no hop at all, a bound no proxy reaches).
OTHER_POLICIES = ("round_robin",)


def _option_args(options: Mapping[str, Any] | None) -> list[str]:
    args: list[str] = []
    for name, value in (options or {}).items():
        if name not in CACHE_AWARE_OPTIONS:
            raise ValueError(f"unknown cache_aware option {name!r}; known: {', '.join(CACHE_AWARE_OPTIONS)}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"cache_aware option {name} must be a number, got {value!r}")
        if name != "cache_threshold" and name != "balance_rel_threshold" and not isinstance(value, int):
            raise ValueError(f"cache_aware option {name} must be an integer, got {value!r}")
        args += ["--" + name.replace("_", "-"), str(value)]
    return args


# The peer's module (what its console script runs) and the spelling of "warning" its --log-level accepts.
PEER_ROUTERS: Mapping[str, tuple[str, str]] = {
    "vllm": ("vllm_router.launch_router", "warning"),  # log levels debug/info/warning/error/critical
    "sglang": ("sglang_router.launch_router", "warn"),  # log levels debug/info/warn/error
}


def peer_argv(
    router: str,
    host: str,
    port: int,
    worker_urls: Sequence[str],
    metrics_port: int,
    options: Mapping[str, Any] | None = None,
    *,
    python: str = sys.executable,
    policy: str = "cache_aware",
) -> list[str]:
    """The command line of a peer router (``router``: "vllm" for vllm-router 0.1.17, "sglang" for sglang-router
    0.3.2) over ``worker_urls``, its Prometheus metrics on 127.0.0.1:metrics_port: the cache_aware policy with
    ``options``, or one of ``OTHER_POLICIES``, which takes none."""
    if router not in PEER_ROUTERS:
        raise ValueError(f"unknown peer router {router!r}; known: {', '.join(PEER_ROUTERS)}")
    if not worker_urls:
        raise ValueError(f"{router}-router needs at least one worker URL")
    if policy != "cache_aware" and policy not in OTHER_POLICIES:
        raise ValueError(f"unknown peer policy {policy!r}; known: cache_aware, {', '.join(OTHER_POLICIES)}")
    if policy != "cache_aware" and options:
        raise ValueError(f"the {policy} policy takes no cache_aware options, got {dict(options)}")
    module, warning = PEER_ROUTERS[router]
    return [
        python,
        "-m",
        module,
        "--host",
        host,
        "--port",
        str(port),
        "--policy",
        policy,
        "--worker-urls",
        *worker_urls,
        "--log-level",
        warning,
        "--prometheus-port",
        str(metrics_port),
        "--prometheus-host",
        "127.0.0.1",
        *_option_args(options),
    ]


def router_ready(status: int, body: Any) -> bool:
    """Whether a `GET /readiness` answer (status, parsed JSON body) says the router routes to every worker."""
    if status != 200 or not isinstance(body, dict):
        return False
    healthy, total = body.get("healthy_workers"), body.get("total_workers")
    return isinstance(healthy, int) and isinstance(total, int) and total > 0 and healthy == total
