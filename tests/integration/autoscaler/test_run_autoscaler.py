"""`run_autoscaler` as a test starts it: metrics on 127.0.0.1, the loop survives an API server that refuses
connections, and it stops on the event. (The end-to-end test on the local cluster comes with the cluster.)"""

import asyncio
import socket

import aiohttp
import pytest
from tokenyard.autoscaler.controller import AutoscalerMetrics, run_autoscaler

pytestmark = pytest.mark.integration


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kubeconfig(tmp_path, port: int) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: t\n"
        f"clusters: [{{name: t, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "contexts: [{name: t, context: {cluster: t, user: t}}]\n"
        "users: [{name: t, user: {token: x}}]\n"
    )
    return str(path)


async def test_starts_serves_metrics_survives_a_dead_api_server_and_stops(tmp_path):
    stop = asyncio.Event()
    started = asyncio.get_running_loop().create_future()
    metrics = AutoscalerMetrics()
    task = asyncio.create_task(
        run_autoscaler(
            f"http://127.0.0.1:{closed_port()}",
            stop,
            kubeconfig=kubeconfig(tmp_path, closed_port()),
            interval=0.05,
            metrics_host="127.0.0.1",
            metrics_port=0,
            metrics=metrics,
            started=started,
        )
    )
    port = await asyncio.wait_for(started, 10)
    deadline = asyncio.get_running_loop().time() + 10
    text = ""
    async with aiohttp.ClientSession() as session:
        while asyncio.get_running_loop().time() < deadline:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                text = await response.text()
            if _errors(text) >= 3:
                break
            await asyncio.sleep(0.05)
    assert _errors(text) >= 3, text  # several failed passes, and the loop is still going
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, 10)


def _errors(text: str) -> float:
    for line in text.splitlines():
        if line.startswith('tokenyard_autoscaler_errors_total{stage="loop"}'):
            return float(line.split()[-1])
    return 0.0
