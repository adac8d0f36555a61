"""Closing after the drain is bounded: a step that hangs (a dependency accepting connections and never
answering) is named in the log and left behind, and a step that fails does not stop the others."""

import asyncio
import logging

from tokenyard.router import server


async def _stubborn() -> None:
    """A close that does not take its cancellation (as a library stuck in a cleanup may not)."""
    while True:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            continue


def test_a_hanging_close_step_is_left_behind_at_the_deadline_and_named(caplog):
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await server._within(started + 0.2, "the Redis connection", _stubborn())
        return loop.time() - started

    with caplog.at_level(logging.WARNING, logger="tokenyard.router"):
        took = asyncio.run(_without_waiting_for_leftovers(scenario()))
    assert took < 1.0
    assert "the Redis connection did not close" in caplog.text


def test_a_failing_close_step_is_logged_not_raised(caplog):
    async def failing() -> None:
        raise OSError("connection reset")

    async def scenario() -> None:
        await server._within(asyncio.get_running_loop().time() + 1.0, "the HTTP client", failing())

    with caplog.at_level(logging.WARNING, logger="tokenyard.router"):
        asyncio.run(scenario())
    assert "closing the HTTP client failed" in caplog.text and "connection reset" in caplog.text


async def _without_waiting_for_leftovers(coro):
    """Run ``coro``, then stop the stubborn task it left behind by closing its coroutine outright (the test's
    own loop must end; the router's process leaves it to the hard stop)."""
    result = await coro
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.get_coro().close()
    return result
