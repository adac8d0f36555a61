"""Probing engines: /metrics for load and KV capacity (with a freshness bound), /v1/models for the model
names static backends serve. One background loop; the result goes into RouterState."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from tokenyard.router.discovery import Endpoint, ModelView, StaticConfig
from tokenyard.router.enginestats import parse_vllm_metrics
from tokenyard.router.state import RouterState
from tokenyard.router.telemetry import RouterMetrics

log = logging.getLogger("tokenyard.router")


class EngineProber:
    def __init__(
        self,
        state: RouterState,
        metrics: RouterMetrics,
        session: aiohttp.ClientSession,
        interval_s: float = 2.0,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.session = session
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.clock = clock

    async def probe_metrics(self, endpoint: Endpoint) -> bool:
        try:
            async with self.session.get(endpoint.url + "/metrics", timeout=self.timeout) as response:
                if response.status != 200:
                    raise aiohttp.ClientResponseError(response.request_info, (), status=response.status)
                text = await response.text()
            self.state.record_stats(endpoint.name, parse_vllm_metrics(text, self.clock()))
            ok = True
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as error:
            if endpoint.name not in self.state.unreachable:
                log.warning(
                    "replica %s (%s) failed its /metrics probe: %r", endpoint.name, endpoint.url, error
                )
            ok = False
        if ok and endpoint.name in self.state.unreachable:
            log.info("replica %s (%s) is reachable again", endpoint.name, endpoint.url)
        (self.state.unreachable.discard if ok else self.state.unreachable.add)(endpoint.name)
        return ok

    def export(self) -> None:
        now = self.clock()
        endpoints = self.state.endpoints()
        self.metrics.retain_replicas({endpoint.name for endpoint in endpoints})
        for endpoint in endpoints:
            load = self.state.load(endpoint.name)
            self.metrics.outstanding_tokens.labels(endpoint.name).set(max(0, load.tokens))
            self.metrics.outstanding_requests.labels(endpoint.name).set(max(0, load.requests))
            stats = self.state.stats.get(endpoint.name)
            stale = stats is None or not stats.fresh(now, self.state.settings.metrics_max_age_s)
            self.metrics.metrics_stale.labels(endpoint.name).set(1 if stale else 0)
            routable = endpoint.name not in self.state.unreachable and not self.state.failures.is_ejected(
                endpoint.name, now
            )
            self.metrics.replica_healthy.labels(endpoint.name, endpoint.revision).set(1 if routable else 0)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe_metrics(e) for e in self.state.endpoints()))
        self.export()

    async def run(self) -> None:
        """Starts one probe per slot, the slots spread evenly over each interval rather than all at once: a
        burst of scrapes lands on the engines together (and on an engine's event loop, /metrics competes with
        token delivery); spread out, each engine sees one scrape per interval and the router a steady trickle.
        A slot does not wait for its probe: a replica that hangs until the timeout must not delay the others'
        probes (their stats would go stale); a replica whose last probe is still running skips its slot."""
        loop = asyncio.get_running_loop()
        running: dict[str, asyncio.Task] = {}
        try:
            while True:
                endpoints = self.state.endpoints()
                gap = self.interval_s / max(1, len(endpoints))
                for endpoint in endpoints:
                    started = loop.time()
                    # It may have left discovery since the round began.
                    if endpoint in self.state.endpoints() and endpoint.name not in running:
                        task = asyncio.create_task(self._probe_logged(endpoint))
                        running[endpoint.name] = task
                        task.add_done_callback(lambda _, name=endpoint.name: running.pop(name, None))
                    await asyncio.sleep(max(0.0, gap - (loop.time() - started)))
                if not endpoints:
                    await asyncio.sleep(self.interval_s)
                try:
                    self.export()
                except Exception:
                    log.exception("exporting replica metrics failed")
        finally:
            for task in list(running.values()):
                task.cancel()

    async def _probe_logged(self, endpoint: Endpoint) -> None:
        try:
            await self.probe_metrics(endpoint)
        except Exception:  # one bad probe must not stop probing
            log.exception("probe of replica %s failed", endpoint.name)


class StaticDiscovery:
    """Static backends: the models each serves come from its /v1/models (or ``served_model`` for all)."""

    def __init__(
        self,
        config: StaticConfig,
        state: RouterState,
        metrics: RouterMetrics,
        session: aiohttp.ClientSession,
        served_model: str | None = None,
        interval_s: float = 2.0,
    ) -> None:
        self.config = config
        self.state = state
        self.metrics = metrics
        self.session = session
        self.served_model = served_model
        self.interval_s = interval_s
        self.models_by_backend: dict[str, tuple[str, ...]] = {}
        if served_model:
            self.models_by_backend = {b.name: (served_model,) for b in config.backends}

    async def _models_of(self, backend: Endpoint) -> None:
        try:
            timeout = aiohttp.ClientTimeout(total=2)
            async with self.session.get(backend.url + "/v1/models", timeout=timeout) as response:
                data = await response.json(content_type=None)
            names = tuple(str(item["id"]) for item in data.get("data", []) if item.get("id"))
            if names:
                self.models_by_backend[backend.name] = names
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, AttributeError) as error:
            log.debug("backend %s: /v1/models failed: %r", backend.name, error)

    def views(self) -> dict[str, ModelView]:
        endpoints_by_model: dict[str, list[Endpoint]] = {}
        for backend in self.config.backends:
            for model in self.models_by_backend.get(backend.name, ()):
                endpoints_by_model.setdefault(model, []).append(backend)
        return {
            model: ModelView(
                model, tuple(endpoints), self.config.traffic, self.config.shadow, self.config.weights
            )
            for model, endpoints in endpoints_by_model.items()
        }

    async def refresh(self) -> None:
        if not self.served_model:
            await asyncio.gather(*(self._models_of(b) for b in self.config.backends))
        gone = self.state.set_models(self.views())
        for endpoint in gone:
            self.metrics.forget_replica(endpoint.name)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.refresh()
            except Exception:
                log.exception("static discovery round failed")
