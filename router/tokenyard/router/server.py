"""Assembles the router: state, forwarder, discovery, probing, Redis sharing, HTTP/gRPC/metrics servers,
and the SIGTERM drain."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tokenyard.router.discovery import StaticConfig
from tokenyard.router.epp import DEFAULT_FALLBACKS, start_epp
from tokenyard.router.grpc_front import start_grpc
from tokenyard.router.http_front import DEFAULT_MAX_BODY_BYTES, HttpFront
from tokenyard.router.prefix import Tokenizer
from tokenyard.router.proxy import Forwarder
from tokenyard.router.scrape import EngineProber, StaticDiscovery
from tokenyard.router.state import RouterSettings, RouterState
from tokenyard.router.telemetry import RouterMetrics

log = logging.getLogger("tokenyard.router")

# After the drain, closing what is left (HTTP sites, background tasks, engine and Redis connections) may take this
# long in all; a step that has not finished by then is named in the log and left behind, so that a dependency that
# hangs (Redis or the API server accepting connections and never answering) cannot hold the exit.
CLOSE_BUDGET_S = 3.0


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int | None = 9090  # None: no gRPC front
    # The Gateway API Inference Extension's endpoint picker (Envoy ext_proc); None: off.
    epp_port: int | None = None
    epp_fallbacks: int = DEFAULT_FALLBACKS  # endpoints named after the primary, for the gateway's retries
    metrics_port: int = 9091
    static: StaticConfig | None = None
    served_model: str | None = None
    kubeconfig: str | None = None
    in_cluster: bool = False
    namespace: str | None = None
    redis_url: str | None = None
    redis_interval_s: float = 0.05
    # Replica probes (GET /health for liveness, GET /metrics for signals), spread over this interval. The
    # default scorers route on the router's own accounting and read only KV capacity from the scrape;
    # bench/bench_router.py measured 0.5 s scrapes of 8 engines raising no_sharing TTFT p99 by ~30% (the
    # engines' event loops render /metrics).
    probe_interval_s: float = 2.0
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 600.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    drain_timeout_s: float = 25.0  # below Kubernetes' default terminationGracePeriodSeconds (30 s)
    settings: RouterSettings = field(default_factory=RouterSettings)
    tokenizer: Tokenizer | None = None
    router_id: str | None = None


class RouterServer:
    def __init__(self, options: ServerOptions, metrics: RouterMetrics | None = None) -> None:
        self.options = options
        self.metrics = metrics or RouterMetrics()
        self.state = RouterState(options.settings, options.tokenizer)
        self.draining = False
        self.ports: dict[str, int] = {}
        self._runners: list[web.AppRunner] = []
        self._tasks: list[asyncio.Task] = []
        self._grpc = None
        self._grpc_health = None
        self._epp = None
        self._epp_health = None
        self.shared = None
        self.session: aiohttp.ClientSession | None = None
        self.forwarder: Forwarder | None = None
        self.front: HttpFront | None = None

    async def _serve(self, app: web.Application, port: int, name: str) -> None:
        # handler_cancellation: a client that disconnects cancels its handler, which closes the upstream
        # request and releases its accounting in `finally`.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.options.host, port)
        await site.start()
        self._runners.append(runner)
        self.ports[name] = runner.addresses[0][1]

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self) -> None:
        options = self.options
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=options.connect_timeout_s, sock_read=options.read_timeout_s
        )
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=30)
        self.session = aiohttp.ClientSession(timeout=timeout, connector=connector, auto_decompress=False)
        self.forwarder = Forwarder(self.state, self.metrics, self.session)
        prober = EngineProber(self.state, self.metrics, self.session, options.probe_interval_s)

        if options.static is not None:
            discovery = StaticDiscovery(
                options.static, self.state, self.metrics, self.session, options.served_model
            )
            await discovery.refresh()
            self._tasks.append(asyncio.create_task(discovery.run(), name="static-discovery"))
        else:
            from tokenyard.router.kube import KubeDiscovery

            kube = KubeDiscovery(self.state, self.metrics, options.kubeconfig, options.namespace)
            await kube.connect()  # raises DiscoveryUnavailable: the router exits instead of serving nothing
            self._tasks.append(asyncio.create_task(kube.run(), name="kube-discovery"))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(kube.synced.wait(), timeout=10)
        await prober.probe_all()
        self._tasks.append(asyncio.create_task(prober.run(), name="engine-prober"))

        if options.redis_url:
            from tokenyard.router.shared import RedisShare

            self.shared = RedisShare(
                options.redis_url, self.state, self.metrics, options.router_id, options.redis_interval_s
            )
            await self.shared.sync_once()
            self._tasks.append(asyncio.create_task(self.shared.run(), name="redis-share"))

        self.front = HttpFront(self.state, self.forwarder, options.max_body_bytes, lambda: self.draining)
        await self._serve(self.front.app(), options.port, "http")
        metrics_app = web.Application()
        metrics_app.router.add_get("/metrics", self._metrics)
        await self._serve(metrics_app, options.metrics_port, "metrics")
        if options.grpc_port is not None:
            self._grpc, self.ports["grpc"], self._grpc_health = await start_grpc(
                self.forwarder, options.host, options.grpc_port, lambda: self.draining
            )
        if options.epp_port is not None:
            self._epp, self.ports["epp"], self._epp_health = await start_epp(
                self.forwarder,
                options.host,
                options.epp_port,
                options.epp_fallbacks,
                options.max_body_bytes,
                lambda: self.draining,
            )
        log.info(
            "router listening: http=%s grpc=%s epp=%s metrics=%s; models: %s",
            self.ports.get("http"),
            self.ports.get("grpc"),
            self.ports.get("epp"),
            self.ports.get("metrics"),
            ", ".join(sorted(self.state.models)) or "none yet",
        )

    async def drain_and_stop(self) -> None:
        """Stop taking new work (every front answers "draining", the endpoint picker with a 503), let the
        requests in flight through any of them finish up to the drain timeout, then stop."""
        self.draining = True
        for health_servicer in (self._grpc_health, self._epp_health):
            if health_servicer is not None:
                health_servicer.enter_graceful_shutdown()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.drain_timeout_s
        if self.forwarder is not None and self.forwarder.in_flight:
            log.info(
                "draining %d in-flight requests (up to %.0fs)",
                self.forwarder.in_flight,
                self.options.drain_timeout_s,
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.forwarder.idle.wait(), self.options.drain_timeout_s)
        # What is left of the drain timeout is the gRPC servers' grace: a stream still running gets it too.
        await self.stop(grpc_grace_s=max(0.0, deadline - loop.time()))

    async def stop(self, grpc_grace_s: float = 1.0) -> None:
        """Stops everything; safe to call again (a drained server is stopped once more by its owner)."""
        grpc_servers = [server for server in (self._grpc, self._epp) if server is not None]
        self._grpc = self._epp = None
        await asyncio.gather(*(server.stop(grace=grpc_grace_s) for server in grpc_servers))
        deadline = asyncio.get_running_loop().time() + CLOSE_BUDGET_S
        runners, self._runners = self._runners, []
        for runner in runners:
            await _within(deadline, "the HTTP listeners", runner.cleanup())
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await _within(deadline, "the background tasks", asyncio.gather(*tasks, return_exceptions=True))
        if self.forwarder is not None:
            await _within(deadline, "the engine connections", self.forwarder.close())
        if self.shared is not None:
            await _within(deadline, "the Redis connection", self.shared.close())
        if self.session is not None:
            await _within(deadline, "the HTTP client", self.session.close())


async def _within(deadline: float, what: str, step) -> None:
    """Await one closing step until ``deadline`` (loop time); past it, say so and go on without it."""
    left = max(0.1, deadline - asyncio.get_running_loop().time())
    # asyncio.wait, not wait_for: wait_for would wait on for a step that does not take its cancellation.
    future = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({future}, timeout=left)
    if not done:
        future.cancel()
        log.warning("stopping: %s did not close within the %.0fs budget; leaving them", what, CLOSE_BUDGET_S)
    elif not future.cancelled() and future.exception() is not None:
        log.warning("stopping: closing %s failed: %r", what, future.exception())
