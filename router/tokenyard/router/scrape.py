"""Probing engines: ``GET /health`` for liveness, ``GET /metrics`` for load and KV capacity (with a freshness
bound), /v1/models for the model names static backends serve. One background loop; the results go into
RouterState.

Liveness is not metrics. A replica is routable while its health endpoint answers 200 (vLLM and SGLang both
serve ``GET /health``) and the passive failure detection on real requests has not ejected it. /metrics only adds
signals: a replica whose /metrics cannot be fetched, decoded or parsed keeps its traffic on the router's own
accounting (outstanding tokens, prefix index), its scraped signals are unknown, a warning is logged once per
failure streak and ``tokenyard_router_metrics_scrape_failures_total{replica,reason}`` counts each failure.

When a failed health check makes a replica unreachable:
- at once when nothing listens (connection refused, no route) or the engine answers a status other than 200:
  both are the engine's own unambiguous answer (a dead process; a 503 while loading weights or after its
  engine core died), and the router's behaviour for dead engines stays what it was;
- after ``health_failures_to_mark`` (2) probes in a row without an answer (a timeout, a connection reset): an
  engine's event loop serves /health beside token streaming and may answer one probe late under load, and one
  late answer must not take a busy replica out of rotation. Meanwhile real requests still detect a dead
  replica: a connect error is retried elsewhere and repeated failures eject it.
A 404/405/501 on /health means the engine has no health endpoint (an OpenAI-compatible server that is neither
vLLM nor SGLang), a 401/403 that it guards every path with credentials the probe does not carry: either way it
answered, so it is live, and liveness then rests on connections and real requests alone (logged once) - the
same mistake as issue 13's (a probe the engine cannot answer taking every replica out) must not come back
through /health.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from tokenyard.router.discovery import Endpoint, ModelView, StaticConfig
from tokenyard.router.enginestats import MetricsError, decode_metrics_body, parse_engine_metrics
from tokenyard.router.state import RouterState
from tokenyard.router.telemetry import RouterMetrics

log = logging.getLogger("tokenyard.router")

HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
# The bounded `reason` label values of the failure counters.
SCRAPE_FAILURE_REASONS = ("http_status", "timeout", "connection", "decode", "parse")
HEALTH_FAILURE_REASONS = ("http_status", "timeout", "connection")
# Ask for the classic text format (prometheus_client's OpenMetrics output rewrites the colons of vLLM's and
# SGLang's names) and for compression: Go's and Python's Prometheus clients gzip when it is accepted. The body
# is decoded here (``auto_decompress=False``), so gzip and deflate are the only encodings asked for.
_METRICS_HEADERS = {
    "Accept": "text/plain;version=0.0.4;q=1.0, application/openmetrics-text;q=0.5, */*;q=0.1",
    "Accept-Encoding": "gzip, deflate",
}
_NO_HEALTH_ENDPOINT = (401, 403, 404, 405, 501)  # answered, but no health verdict to be had


class _Failure(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class EngineProber:
    def __init__(
        self,
        state: RouterState,
        metrics: RouterMetrics,
        session: aiohttp.ClientSession,
        interval_s: float = 2.0,
        timeout_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        health_timeout_s: float = 5.0,
        health_failures_to_mark: int = 2,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.session = session
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.health_timeout = aiohttp.ClientTimeout(total=health_timeout_s)
        self.health_failures_to_mark = max(1, health_failures_to_mark)
        self.clock = clock
        self._health_failures: dict[str, int] = {}  # replica -> health probes failed in a row
        self._metrics_failures: dict[str, int] = {}  # replica -> scrapes failed in a row (a streak is open)
        self._no_health_endpoint: set[str] = set()  # replicas whose /health is absent (logged once)
        self._no_known_series: set[str] = set()  # replicas whose /metrics has no vLLM/SGLang series (logged)

    # --- liveness -------------------------------------------------------------------------------------------

    async def probe_health(self, endpoint: Endpoint) -> bool:
        """One health probe; updates ``state.unreachable``; returns whether the replica answered live."""
        name = endpoint.name
        try:
            async with self.session.get(endpoint.url + HEALTH_PATH, timeout=self.health_timeout) as response:
                status = response.status
            if status in _NO_HEALTH_ENDPOINT:
                if name not in self._no_health_endpoint:
                    self._no_health_endpoint.add(name)
                    log.warning(
                        "replica %s (%s) gives no health verdict on %s (HTTP %d): it is taken as live "
                        "while it answers, and real requests alone detect failures",
                        name,
                        endpoint.url,
                        HEALTH_PATH,
                        status,
                    )
            elif status != 200:
                raise _Failure("http_status", f"{HEALTH_PATH} answered HTTP {status}")
        except _Failure as failure:
            return self._health_failed(endpoint, failure, immediate=True)
        except aiohttp.ClientConnectorError as error:  # refused, no route, unknown host: nothing listens
            return self._health_failed(endpoint, _Failure("connection", f"connect failed: {error}"), True)
        except TimeoutError:
            failure = _Failure("timeout", f"no answer within {self.health_timeout.total:g}s")
            return self._health_failed(endpoint, failure, immediate=False)
        except (aiohttp.ClientError, OSError) as error:  # reset or closed mid-answer
            return self._health_failed(endpoint, _Failure("connection", repr(error)), immediate=False)
        self._health_failures.pop(name, None)
        if name in self.state.unreachable:
            self.state.unreachable.discard(name)
            log.info("replica %s (%s) is live again", name, endpoint.url)
        return True

    def _health_failed(self, endpoint: Endpoint, failure: _Failure, immediate: bool) -> bool:
        name = endpoint.name
        self.metrics.health_check_failures.labels(name, failure.reason).inc()
        count = self._health_failures.get(name, 0) + 1
        self._health_failures[name] = count
        if name in self.state.unreachable:
            log.debug("replica %s is still unreachable: %s", name, failure.detail)
        elif immediate or count >= self.health_failures_to_mark:
            self.state.unreachable.add(name)
            log.warning(
                "replica %s (%s) is unreachable (%s; %d health probe(s) failed in a row): no traffic until "
                "its %s answers 200",
                name,
                endpoint.url,
                failure.detail,
                count,
                HEALTH_PATH,
            )
        else:
            log.info(
                "replica %s (%s): health probe failed (%s); unreachable after %d in a row",
                name,
                endpoint.url,
                failure.detail,
                self.health_failures_to_mark,
            )
        return False

    # --- signals --------------------------------------------------------------------------------------------

    def served_models(self, endpoint: Endpoint) -> set[str]:
        """The model names the router sends to this replica (its /metrics series of other models are
        ignored, when labelled)."""
        return {
            view.served_name or model
            for model, view in self.state.models.items()
            if any(e.name == endpoint.name for e in view.endpoints)
        }

    async def probe_metrics(self, endpoint: Endpoint) -> bool:
        """One /metrics scrape; records the stats or, on failure, makes the replica's signals unknown. Never
        touches liveness. Returns whether stats were recorded."""
        name = endpoint.name
        try:
            try:
                async with self.session.get(
                    endpoint.url + METRICS_PATH,
                    timeout=self.timeout,
                    headers=_METRICS_HEADERS,
                    auto_decompress=False,
                ) as response:
                    if response.status != 200:
                        raise _Failure("http_status", f"{METRICS_PATH} answered HTTP {response.status}")
                    body = await response.read()
                    encoding = response.headers.get("Content-Encoding")
            except TimeoutError:
                raise _Failure("timeout", f"no answer within {self.timeout.total:g}s") from None
            except (aiohttp.ClientError, OSError) as error:
                raise _Failure("connection", repr(error)) from None
            try:
                text = decode_metrics_body(body, encoding)
                stats = parse_engine_metrics(text, self.clock(), self.served_models(endpoint))
            except MetricsError as error:
                raise _Failure(error.reason, str(error)) from None
        except _Failure as failure:
            self._metrics_failed(endpoint, failure)
            return False
        self.state.record_stats(name, stats)
        failed = self._metrics_failures.pop(name, 0)
        if failed:
            log.info(
                "replica %s (%s): /metrics readable again after %d failed scrape(s)",
                name,
                endpoint.url,
                failed,
            )
        if stats.engine is None and name not in self._no_known_series:
            self._no_known_series.add(name)
            log.warning(
                "replica %s (%s): /metrics has none of the vLLM or SGLang series the router reads; its KV and "
                "queue signals stay unknown and it is routed on the router's own accounting",
                name,
                endpoint.url,
            )
        elif stats.engine is not None:
            self._no_known_series.discard(name)
        return True

    def _metrics_failed(self, endpoint: Endpoint, failure: _Failure) -> None:
        name = endpoint.name
        self.metrics.metrics_scrape_failures.labels(name, failure.reason).inc()
        self.state.forget_signals(name)
        count = self._metrics_failures.get(name, 0) + 1
        self._metrics_failures[name] = count
        if count == 1:
            log.warning(
                "replica %s (%s): cannot read %s (%s: %s); its scraped signals are unknown until a scrape "
                "succeeds, and whether it gets traffic depends on its %s and real requests only (logged once "
                "per failure streak)",
                name,
                endpoint.url,
                METRICS_PATH,
                failure.reason,
                failure.detail,
                HEALTH_PATH,
            )
        else:
            log.debug(
                "replica %s: %s still failing (%s: %s)", name, METRICS_PATH, failure.reason, failure.detail
            )

    # --- rounds ---------------------------------------------------------------------------------------------

    async def probe(self, endpoint: Endpoint) -> None:
        """Health and metrics of one replica, concurrently (independent: either may fail alone)."""
        await asyncio.gather(self.probe_health(endpoint), self.probe_metrics(endpoint))

    def export(self) -> None:
        now = self.clock()
        endpoints = self.state.endpoints()
        known = {endpoint.name for endpoint in endpoints}
        self.metrics.retain_replicas(known)
        self.metrics.declare(self.state.models.values())
        for per_replica in (self._health_failures, self._metrics_failures):
            for name in per_replica.keys() - known:
                del per_replica[name]
        self._no_health_endpoint &= known
        self._no_known_series &= known
        overlap = self.state.ledger.overlap
        self.metrics.prefill_overlap.labels("overtook").set(overlap.overtakes)
        self.metrics.prefill_overlap.labels("waited").set(overlap.samples - overlap.overtakes)
        self.metrics.prefill_side_by_side.set(1 if overlap.side_by_side else 0)
        for endpoint in endpoints:
            load = self.state.load(endpoint.name)
            self.metrics.outstanding_tokens.labels(endpoint.name).set(max(0, load.tokens))
            self.metrics.outstanding_requests.labels(endpoint.name).set(max(0, load.requests))
            self.metrics.replica_concurrency.labels(endpoint.name).set(self.state.cap_of(endpoint.name) or 0)
            stats = self.state.stats.get(endpoint.name)
            stale = stats is None or not stats.fresh(now, self.state.settings.metrics_max_age_s)
            self.metrics.metrics_stale.labels(endpoint.name).set(1 if stale else 0)
            routable = endpoint.name not in self.state.unreachable and not self.state.failures.is_ejected(
                endpoint.name, now
            )
            self.metrics.replica_healthy.labels(endpoint.name, endpoint.revision).set(1 if routable else 0)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(e) for e in self.state.endpoints()))
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
            await self.probe(endpoint)
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
                model,
                tuple(endpoints),
                self.config.traffic,
                self.config.shadow,
                self.config.weights,
                batch_size=self.config.batch_size,
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
