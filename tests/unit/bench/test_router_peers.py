"""bench/router_peers.py: the peer routers' command lines and grids."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[3] / "bench" / "router_peers.py"
_spec = importlib.util.spec_from_file_location("router_peers", _PATH)
rp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rp)

WORKERS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


@pytest.mark.parametrize(
    ("router", "module", "grid"),
    [
        ("vllm", "vllm_router.launch_router", rp.VLLM_ROUTER_GRID),
        ("sglang", "sglang_router.launch_router", rp.SGLANG_ROUTER_GRID),
    ],
)
def test_argv_launches_cache_aware_over_the_workers_with_the_options(router, module, grid):
    argv = rp.peer_argv(
        router, "127.0.0.1", 8000, WORKERS, 9100, grid["threshold_0.1_balance_early"], python="py"
    )
    assert argv[:3] == ["py", "-m", module]
    assert argv[argv.index("--policy") + 1] == "cache_aware"
    at = argv.index("--worker-urls")
    assert argv[at + 1 : at + 3] == WORKERS
    assert argv[argv.index("--prometheus-port") + 1] == "9100"
    assert argv[argv.index("--cache-threshold") + 1] == "0.1"
    assert argv[argv.index("--balance-abs-threshold") + 1] == "8"
    defaults = rp.peer_argv(router, "127.0.0.1", 8000, WORKERS, 9100, grid["defaults"])
    assert not any(a.startswith(("--cache", "--balance", "--eviction", "--max-tree")) for a in defaults)


def test_grids_have_defaults_and_only_known_options():
    for grid in (rp.VLLM_ROUTER_GRID, rp.SGLANG_ROUTER_GRID):
        assert grid["defaults"] == {} and 5 <= len(grid) <= 7
        for options in grid.values():
            assert set(options) <= set(rp.CACHE_AWARE_OPTIONS)
    with pytest.raises(ValueError, match="unknown cache_aware option"):
        rp.peer_argv("vllm", "h", 1, WORKERS, 2, {"policy": "random"})
    with pytest.raises(ValueError, match="must be an integer"):
        rp.peer_argv("sglang", "h", 1, WORKERS, 2, {"balance_abs_threshold": 1.5})


def test_router_ready_wants_every_worker_healthy():
    assert rp.router_ready(200, {"status": "ready", "healthy_workers": 2, "total_workers": 2})
    assert not rp.router_ready(200, {"status": "ready", "healthy_workers": 1, "total_workers": 2})
    assert not rp.router_ready(503, {"healthy_workers": 2, "total_workers": 2})
    assert not rp.router_ready(200, "OK")


def test_round_robin_is_launched_as_a_policy_of_its_own_without_cache_aware_options():
    argv = rp.peer_argv("sglang", "127.0.0.1", 8000, WORKERS, 9100, python="py", policy="round_robin")
    assert argv[argv.index("--policy") + 1] == "round_robin"
    assert not any(a.startswith(("--cache", "--balance", "--eviction", "--max-tree")) for a in argv)
    with pytest.raises(ValueError, match="takes no cache_aware options"):
        rp.peer_argv("sglang", "h", 1, WORKERS, 2, {"cache_threshold": 0.5}, policy="round_robin")
    with pytest.raises(ValueError, match="unknown peer policy 'consistent_hash'"):
        rp.peer_argv("vllm", "h", 1, WORKERS, 2, policy="consistent_hash")
