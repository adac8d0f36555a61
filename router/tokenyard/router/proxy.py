"""What every request's exchange shares: ``Forwarder`` holds the router state, the metrics, the upstream HTTP
session and the clock, counts the client requests in flight (the drain waits for them), times each routing
decision, and runs the shadow copies off the clients' path. One request's own lifecycle is an
``exchange.Exchange``, made by ``Forwarder.exchange``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

import aiohttp
from tokenyard.router.exchange import Exchange, RoutedRequest, StreamBroken
from tokenyard.router.openai_wire import InferenceRequest, OutputText
from tokenyard.router.openai_wire import carries_token as carries_token  # bench/bench_router.py reads it here
from tokenyard.router.shadowpair import PairResult, ShadowPair
from tokenyard.router.state import Route, RouterState, RoutingError
from tokenyard.router.telemetry import RouterMetrics

log = logging.getLogger("tokenyard.router")


class Forwarder:
    def __init__(
        self,
        state: RouterState,
        metrics: RouterMetrics,
        session: aiohttp.ClientSession,
        clock=time.monotonic,
        max_attempts: int = 2,
        shadow_concurrency: int = 64,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.session = session
        self.clock = clock
        self.max_attempts = max_attempts
        self._shadow_slots = asyncio.Semaphore(shadow_concurrency)
        self._shadow_tasks: set[asyncio.Task] = set()
        # Client requests in flight through either front (shadow copies are not clients'): the drain waits
        # until ``idle`` is set.
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    def exchange(self, request: InferenceRequest, started: float | None = None) -> Exchange:
        """The exchange of one client request; ``started`` is when it arrived (default: now)."""
        return Exchange(self, request, self.clock() if started is None else started)

    def route(self, request: InferenceRequest, exclude: Iterable[str] = (), shadow: bool = False) -> Route:
        """The routing decision, timed; raises RoutingError when no replica can take the request."""
        began = time.perf_counter()
        try:
            route = self.state.route(
                request.model,
                request.prompt,
                request.expected_output_tokens,
                self.clock(),
                exclude=exclude,
                shadow=shadow,
                samples=request.samples,
            )
        finally:
            self.metrics.decision.observe(time.perf_counter() - began)
        self.metrics.prefix_match.labels(request.model).observe(route.prefix_match_tokens)
        return route

    def upstream_timeout(self, started: float, deadline_s: float | None) -> aiohttp.ClientTimeout | None:
        """The session's timeouts, bounded by what is left of the client's deadline (None: the session's)."""
        if deadline_s is None:
            return None
        base = self.session.timeout
        left = max(0.001, started + deadline_s - self.clock())
        return aiohttp.ClientTimeout(
            total=left if base.total is None else min(base.total, left),
            connect=base.connect,
            sock_read=base.sock_read,
            sock_connect=base.sock_connect,
        )

    # --- what exchanges record -------------------------------------------------------------------------

    def request_began(self) -> None:
        self.in_flight += 1
        self.idle.clear()
        self.metrics.in_flight.inc()

    def request_ended(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.dec()
        if self.in_flight == 0:
            self.idle.set()

    def replica_failed(self, replica: str, why: str) -> None:
        """A replica failed a request (connect error, 5xx, broken stream): counted towards its ejection."""
        if self.state.record_failure(replica, self.clock()):
            self.metrics.ejections.labels(replica).inc()
            log.warning("ejected replica %s after repeated failures (last: %s)", replica, why)
        else:
            log.info("replica %s failed: %s", replica, why)

    def count_answer(self, namespace: str, model: str, revision: str, replica: str, code: int | str) -> None:
        """One client request answered with ``code`` (errors are codes >= 400, 499 for a client gone)."""
        labels = (namespace, model, revision, replica, str(code))
        self.metrics.requests.labels(*labels).inc()
        if int(code) >= 400:
            self.metrics.errors.labels(*labels).inc()

    def count_rejected(self, model: str, error: RoutingError) -> None:
        """A request no replica was found for (unknown model, no replica, all saturated)."""
        known = error.status != 404  # an unknown model name is client input: not a label value
        self.count_answer(
            self.state.namespace_of(model) if known else "", model if known else "", "", "", error.status
        )

    # --- shadow copies ---------------------------------------------------------------------------------

    def maybe_shadow(self, primary: RoutedRequest) -> None:
        """With the model's shadow fraction, send a copy to the shadow revision off the client's path: the
        copy runs in its own task, is read to the end and discarded; when too many copies are in flight, the
        copy is dropped rather than queued (it must never slow the client). A copy that runs is paired with
        the primary: whichever of the two ends last records the pair (the client never waits for it)."""
        assert primary.route is not None
        model = primary.route.model
        if not self.state.shadow_wanted(model):
            return
        view = self.state.models[model]
        revision = view.shadow.revision if view.shadow else ""
        if self._shadow_slots.locked():
            self.metrics.shadow_requests.labels(view.namespace, model, revision, "dropped").inc()
            return
        pair = ShadowPair(primary.request.greedy, namespace=view.namespace, model=model, revision=revision)
        primary.join_pair(pair)
        task = asyncio.create_task(self._shadow(pair, primary.request))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)

    async def _shadow(self, pair: ShadowPair, request: InferenceRequest) -> None:
        async with self._shadow_slots:
            copy = Exchange(self, request, self.clock(), shadow=True, pair=pair)
            try:
                async with copy:
                    await copy.discard_answer()
            except (RoutingError, StreamBroken):
                pass  # the exchange recorded it
            except Exception as error:  # a copy never fails anything else: its task ends quietly, logged
                log.warning("shadow copy for %s (revision %s) failed: %r", pair.model, pair.revision, error)

    def end_pair(self, pair: ShadowPair, side: str, ok: bool | None, text: OutputText | None) -> None:
        result = pair.end(side, ok, text.text() if text is not None else None)
        if result is not None:
            self._count_pair(pair, result)

    def _count_pair(self, pair: ShadowPair, result: PairResult) -> None:
        labels = (pair.namespace, pair.model, pair.revision)
        self.metrics.shadow_pairs.labels(*labels, result.outcome).inc()
        if result.outputs_match is not None:
            self.metrics.shadow_output_match.labels(*labels, str(result.outputs_match).lower()).inc()

    async def close(self) -> None:
        for task in list(self._shadow_tasks):
            task.cancel()
        await asyncio.gather(*self._shadow_tasks, return_exceptions=True)
