"""Sharing load accounting and the prefix index between router replicas through Redis.

Each router publishes its own absolute per-replica load (a hash with a TTL, refreshed every sync) and reads
its live peers' loads, so a router that dies stops counting when its key expires and nothing needs repair
after an outage: the next publish overwrites the stale value. Prefix-index inserts go on a capped stream that
every router reads, skipping its own. While Redis is away the router routes on local state, says so (metric
``tokenyard_router_redis_up`` 0, one log line per transition), keeps its inserts in a bounded outbox, and on
reconnect publishes them and its current loads (the local deltas) before reading its peers again.

The engines' concurrency caps each router has confirmed (learned_sizes.ConcurrencyCap) go in one hash all
routers share (RouterState.peer_caps), so a router that starts beside its peers, or after all of them restarted
within CAPS_TTL_S, knows the caps at once instead of learning them anew. They stay known while Redis is away.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
import uuid
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from tokenyard.router.accounting import ReplicaLoad
from tokenyard.router.state import RouterState
from tokenyard.router.telemetry import RouterMetrics

log = logging.getLogger("tokenyard.router")

OUTBOX_LIMIT = 20_000  # prefix inserts kept while Redis is away (newest kept)
STREAM_MAXLEN = 20_000
CATCH_UP_ENTRIES = 2_000  # prefix inserts a router reads from history when it (re)joins
# The shared caps outlive every router for this long after the last publish: an engine's cap is a property of
# its flags, which outlast any router restart; a cap a router sees contradicted is deleted at once.
CAPS_TTL_S = 3600


def redis_keys(prefix: str, router_id: str = "") -> dict[str, str]:
    """Every Redis key the routers use, built in one place."""
    return {
        "routers": f"{prefix}:routers",
        "load": f"{prefix}:load:{router_id}",
        "prefix": f"{prefix}:prefix",
        "caps": f"{prefix}:caps",
    }


def pack_hashes(hashes: tuple[int, ...]) -> bytes:
    return struct.pack(f"<{len(hashes)}Q", *hashes)


def unpack_hashes(data: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(data) // 8}Q", data)


class RedisShare:
    def __init__(
        self,
        url: str,
        state: RouterState,
        metrics: RouterMetrics,
        router_id: str | None = None,
        interval_s: float = 0.05,
        ttl_s: float = 3.0,
        key_prefix: str = "tokenyard:router",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url
        self.state = state
        self.metrics = metrics
        self.router_id = router_id or uuid.uuid4().hex[:12]
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self.keys = redis_keys(key_prefix, self.router_id)
        self.key_prefix = key_prefix
        self.clock = clock
        self.wall_clock = wall_clock
        self.client = aioredis.from_url(
            url,
            socket_timeout=0.5,
            socket_connect_timeout=0.5,
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self.up: bool | None = None
        self.last_stream_id: str | None = None
        state.publish_prefixes = True
        metrics.redis_configured.set(1)
        metrics.redis_up.set(0)

    def _mark(self, up: bool, error: Exception | None = None) -> None:
        if up == self.up:
            return
        self.up = up
        self.metrics.redis_up.set(1 if up else 0)
        if up:
            log.info("redis %s reachable: sharing load and prefix state with peer routers", self.url)
        else:
            log.warning("redis %s unreachable (%r): routing on local state until it returns", self.url, error)
            self.state.peer_loads = {}  # peers' loads are unknown now, not frozen
            self.last_stream_id = None  # catch up from recent history on reconnect

    async def sync_once(self) -> None:
        try:
            peers, shared_caps = await self._publish()
            await self._read_peers(peers, shared_caps)
        except (TimeoutError, RedisError, OSError) as error:
            self.metrics.redis_errors.inc()
            self._mark(False, error)
            outbox = self.state.prefix_outbox
            if len(outbox) > OUTBOX_LIMIT:
                del outbox[: len(outbox) - OUTBOX_LIMIT]
            return
        self._mark(True)

    async def _publish(self) -> tuple[list[str], dict[bytes, bytes]]:
        """Writes this router's state; returns, from the same round trip, the live peer routers and the caps
        shared so far (read after this router's own writes)."""
        loads = self.state.ledger.snapshot()
        outbox = list(self.state.prefix_outbox)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.keys["load"])
        if loads:
            pipe.hset(self.keys["load"], mapping={n: f"{ld.tokens},{ld.requests}" for n, ld in loads.items()})
        pipe.expire(self.keys["load"], max(1, int(self.ttl_s + 0.999)))
        now_wall = self.wall_clock()
        pipe.zadd(self.keys["routers"], {self.router_id: now_wall})
        caps = self.state.confirmed_caps()
        if caps:
            pipe.hset(self.keys["caps"], mapping={name: str(cap) for name, cap in caps.items()})
            pipe.expire(self.keys["caps"], CAPS_TTL_S)
        contradicted = self.state.contradicted_peer_caps()
        if contradicted:
            pipe.hdel(self.keys["caps"], *contradicted)
        for replica, hashes, private in outbox:
            pipe.xadd(
                self.keys["prefix"],
                {"r": self.router_id, "n": replica, "h": pack_hashes(hashes), "p": private},
                maxlen=STREAM_MAXLEN,
                approximate=True,
            )
        pipe.zremrangebyscore(self.keys["routers"], "-inf", now_wall - self.ttl_s)
        pipe.zrange(self.keys["routers"], 0, -1)
        pipe.hgetall(self.keys["caps"])
        *_, members, shared_caps = await pipe.execute()
        del self.state.prefix_outbox[: len(outbox)]  # only what was published; new inserts may have come
        peers = [name for name in (member.decode() for member in members) if name != self.router_id]
        return peers, shared_caps

    async def _read_peers(self, peers: list[str], shared_caps: dict[bytes, bytes]) -> None:
        """Every peer's loads and the prefix stream's new entries, in one round trip (the stream read last, so
        the pipeline is never empty)."""
        pipe = self.client.pipeline(transaction=False)
        for peer in peers:
            pipe.hgetall(redis_keys(self.key_prefix, peer)["load"])
        catching_up = self._queue_stream_read(pipe)
        *peer_loads, stream_reply = await pipe.execute()
        totals: dict[str, ReplicaLoad] = {}
        for loads in peer_loads:
            for name, value in loads.items():
                tokens, _, requests = value.decode().partition(",")
                total = totals.setdefault(name.decode(), ReplicaLoad())
                total.tokens += int(tokens)
                total.requests += int(requests or 0)
        self.state.peer_loads = totals
        self.state.peer_caps = {name.decode(): int(cap) for name, cap in shared_caps.items()}
        self._take_prefix_entries(stream_reply, catching_up)

    def _queue_stream_read(self, pipe) -> bool:
        """Adds the prefix stream's read to ``pipe``: its recent history on a (re)connect (returns True), else
        what came after the last entry taken."""
        if self.last_stream_id is None:
            pipe.xrevrange(self.keys["prefix"], "+", "-", count=CATCH_UP_ENTRIES)
            return True
        pipe.xread({self.keys["prefix"]: self.last_stream_id}, count=5_000)
        return False

    def _take_prefix_entries(self, reply, catching_up: bool) -> None:
        now = self.clock()
        if catching_up:
            entries = list(reversed(reply))
            self.last_stream_id = entries[-1][0].decode() if entries else "0-0"
        else:
            entries = reply[0][1] if reply else []
            if entries:
                self.last_stream_id = entries[-1][0].decode()
        for _entry_id, fields in entries:
            if fields.get(b"r", b"").decode() == self.router_id:
                continue
            private = int(fields.get(b"p", b"0") or 0)  # absent in entries from routers before it was sent
            self.state.index.insert(fields[b"n"].decode(), unpack_hashes(fields[b"h"]), now, private)

    async def run(self) -> None:
        while True:
            await self.sync_once()
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        try:
            await self.client.zrem(self.keys["routers"], self.router_id)
            await self.client.delete(self.keys["load"])
        except (TimeoutError, RedisError, OSError):
            pass
        await self.client.aclose()
