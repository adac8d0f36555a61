import asyncio
import contextlib

from tokenyard.router.discovery import Endpoint, ModelView
from tokenyard.router.scrape import EngineProber
from tokenyard.router.state import RouterState
from tokenyard.router.telemetry import RouterMetrics


async def run_until(prober: EngineProber, done: asyncio.Event) -> None:
    """Run the prober's loop until `done` is set (at most 5 s), then stop it."""
    task = asyncio.create_task(prober.run())
    try:
        await asyncio.wait_for(done.wait(), 5)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_probes_are_spread_over_the_interval_and_skip_replicas_that_left():
    state = RouterState()
    endpoints = tuple(Endpoint(name, f"http://{name}") for name in "abcd")
    state.set_models({"m": ModelView("m", endpoints)})
    interval = 0.2
    prober = EngineProber(state, RouterMetrics(), session=None, interval_s=interval)
    loop = asyncio.get_running_loop()
    probed: list[tuple[str, float]] = []
    round_done = asyncio.Event()

    async def fake_probe(endpoint: Endpoint) -> bool:
        probed.append((endpoint.name, loop.time()))
        if endpoint.name == "a":  # "c" leaves discovery while the round is under way
            state.set_models({"m": ModelView("m", tuple(e for e in endpoints if e.name != "c"))})
        if endpoint.name == "d":
            round_done.set()
        return True

    prober.probe_metrics = fake_probe
    await run_until(prober, round_done)
    assert [name for name, _ in probed] == ["a", "b", "d"]
    times = [at for _, at in probed]
    # one probe per interval / 4, never a burst (asyncio sleeps never end early; c's slot was left empty)
    assert times[1] - times[0] >= 0.9 * interval / 4
    assert times[2] - times[1] >= 0.9 * 2 * interval / 4


async def test_a_replica_that_hangs_does_not_hold_back_the_others_probes():
    state = RouterState()
    endpoints = tuple(Endpoint(name, f"http://{name}") for name in "abc")
    state.set_models({"m": ModelView("m", endpoints)})
    prober = EngineProber(state, RouterMetrics(), session=None, interval_s=0.15)
    probed: list[str] = []
    hang = asyncio.Event()  # never set: "a" answers nothing until the test ends
    two_rounds = asyncio.Event()

    async def fake_probe(endpoint: Endpoint) -> bool:
        probed.append(endpoint.name)
        if endpoint.name == "a":
            await hang.wait()
        if probed.count("c") == 2:
            two_rounds.set()
        return True

    prober.probe_metrics = fake_probe
    await run_until(prober, two_rounds)
    # b and c were probed every round while a's first probe still hung; a was not probed twice at once.
    assert probed.count("b") == 2 and probed.count("c") == 2
    assert probed.count("a") == 1
