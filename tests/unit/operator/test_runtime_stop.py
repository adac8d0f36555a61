"""The operator's way out: SIGTERM raises Kopf's stop flag and bounds what Kopf still asks of the API server."""

import asyncio
import signal

import kopf
from tokenyard.operator.runtime import Runtime


def test_begin_stop_raises_the_flag_and_shortens_the_way_out():
    async def scenario():
        runtime = Runtime()
        runtime.stop_flag = asyncio.Event()
        runtime.kopf_settings = kopf.OperatorSettings()
        before = runtime.kopf_settings.networking
        assert before.request_timeout > 3 and len(tuple(before.error_backoffs)) > 1  # Kopf's own: long
        runtime.begin_stop(signal.SIGTERM)
        networking = runtime.kopf_settings.networking
        assert runtime.stop_flag.is_set()
        assert networking.request_timeout == 3.0 and tuple(networking.error_backoffs) == (1.0,)

    asyncio.run(scenario())


def test_once_taken_over_a_sigterm_goes_to_begin_stop():
    async def scenario():
        runtime = Runtime()
        runtime.stop_flag = asyncio.Event()
        runtime.take_over_signals()
        try:
            signal.raise_signal(signal.SIGTERM)
            await asyncio.wait_for(runtime.stop_flag.wait(), timeout=5)
        finally:
            loop = asyncio.get_running_loop()
            loop.remove_signal_handler(signal.SIGTERM)
            loop.remove_signal_handler(signal.SIGINT)

    asyncio.run(scenario())
