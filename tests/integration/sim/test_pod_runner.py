"""The pod runner's event handling, fed pod events directly (no cluster): engines follow the pods."""

import asyncio

import aiohttp
import pytest
from tokenyard.core import labels as L
from tokenyard.sim.pods import PodRunner

from tests.integration.sim.conftest import eventually

pytestmark = pytest.mark.integration


class FakeCoreV1:
    def read_node(self, name, **_request_options):
        class Meta:
            labels = {L.NODE_GPU_PRODUCT: "NVIDIA-H200"}

        class Node:
            metadata = Meta()

        return Node()


def pod(name: str, ip: str, port: int, **env) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "sim-test",
            "labels": {L.COMPONENT: L.COMPONENT_ENGINE, L.ROLE: L.ROLE_LEADER},
        },
        "spec": {
            "nodeName": "node-1",
            "containers": [
                {
                    "name": "engine",
                    "ports": [{"name": "http", "containerPort": port}],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                }
            ],
        },
        "status": {"podIP": ip, "phase": "Running"},
    }


async def test_engines_start_change_and_stop_with_their_pods():
    runner = PodRunner(time_scale=0.1)
    runner._api = FakeCoreV1()
    applier = asyncio.create_task(runner._apply_events())
    port = _free_port()
    a = pod("a", "127.0.3.1", port, **{L.ENV_SERVED_MODEL_NAME: "chat-a"})
    b = pod("b", "127.0.3.2", port)
    try:
        runner._events.put_nowait(("SYNC", [a, b]))

        async def both_serving():
            return set(runner.engines) == {"sim-test/a", "sim-test/b"}

        await eventually(both_serving)
        engine_a = runner.engines["sim-test/a"][1]
        assert engine_a.deployment.gpu.name == "h200" and engine_a.model_name == "chat-a"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.3.1:{port}/v1/models") as r:
                assert (await r.json())["data"][0]["id"] == "chat-a"

        moved = pod("a", "127.0.3.3", port, **{L.ENV_SERVED_MODEL_NAME: "chat-a"})
        runner._events.put_nowait(("MODIFIED", moved))

        async def moved_ip():
            entry = runner.engines.get("sim-test/a")
            return entry is not None and entry[0].host == "127.0.3.3"

        await eventually(moved_ip)
        runner._events.put_nowait(("DELETED", b))
        runner._events.put_nowait(("SYNC", [moved]))

        async def only_a():
            return set(runner.engines) == {"sim-test/a"}

        await eventually(only_a)
    finally:
        applier.cancel()
        await asyncio.gather(applier, return_exceptions=True)
        await asyncio.gather(*(e.stop(0.1) for _, e in runner.engines.values()))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
