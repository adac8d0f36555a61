from hypothesis import given
from hypothesis import strategies as st
from tokenyard.router.kube import KubeDiscovery
from tokenyard.router.shared import pack_hashes, redis_keys, unpack_hashes
from tokenyard.router.state import RouterState
from tokenyard.router.telemetry import RouterMetrics

from .test_discovery import deployment, pod


@given(st.lists(st.integers(0, 2**64 - 1), max_size=50))
def test_block_hashes_survive_the_redis_encoding(hashes):
    assert unpack_hashes(pack_hashes(tuple(hashes))) == tuple(hashes)


def test_redis_keys_are_built_in_one_place():
    keys = redis_keys("ty", "router-a")
    assert keys == {
        "routers": "ty:routers",
        "load": "ty:load:router-a",
        "prefix": "ty:prefix",
        "caps": "ty:caps",
    }


def test_kube_discovery_feeds_the_pure_function_and_forgets_gone_replicas():
    state = RouterState()
    kube = KubeDiscovery(state, RouterMetrics(), kubeconfig=None, namespace="ns")
    kube.pods = {"a-0": pod("a-0"), "a-1": pod("a-1", group="1", ip="127.0.0.6")}
    kube.deployments = {"llama": deployment()}
    kube.recompute()
    assert [e.name for e in state.models["llama"].endpoints] == ["a-0", "a-1"]
    state.index.insert("a-1", [1, 2], now=0)
    del kube.pods["a-1"]
    kube.recompute()
    assert [e.name for e in state.models["llama"].endpoints] == ["a-0"]
    assert "a-1" not in state.index.names()
