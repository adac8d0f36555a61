"""A bare pass-through proxy for bench-router's overhead measurement: the same HTTP stack as tokenyard's router
(an aiohttp server and a keep-alive aiohttp client session on uvloop) and nothing else — no parsing of the body,
no routing decision (round robin over the engines), no accounting, no metrics. Its added latency is what any
router written on that stack pays before it does any work of its own, so tokenyard's hop less this one is the
cost of tokenyard's own work (parse, decide, account) per request. A labelled floor row, not a peer.

    python bench/passthrough_proxy.py --port 8080 http://127.0.0.1:8001 http://127.0.0.1:8002 ...
"""

from __future__ import annotations

import argparse
import asyncio
import itertools

import aiohttp
from aiohttp import web
from tokenyard.router.__main__ import loop_factory

# What the proxy passes on of the client's headers: the body's type only (hop-by-hop headers stay behind).
FORWARDED_HEADERS = ("Content-Type",)
SESSION = web.AppKey("session", aiohttp.ClientSession)


def make_app(engines: list[str]) -> web.Application:
    next_engine = itertools.cycle(engines).__next__

    async def open_session(app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        app[SESSION] = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close_session(app: web.Application) -> None:
        await app[SESSION].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers}
        async with app[SESSION].post(next_engine() + request.path, data=body, headers=headers) as upstream:
            content_type = upstream.headers.get("Content-Type", "application/json")
            if not content_type.startswith("text/event-stream"):
                payload = await upstream.read()
                return web.Response(
                    body=payload, status=upstream.status, headers={"Content-Type": content_type}
                )
            response = web.StreamResponse(status=upstream.status, headers={"Content-Type": content_type})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_post("/v1/completions", forward)
    app.router.add_post("/v1/chat/completions", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("engines", nargs="+", help="engine base URLs, served in turn")
    args = parser.parse_args()
    # the event loop the router picks at its default (--event-loop auto: uvloop where installed)
    new_loop = loop_factory("auto") or asyncio.new_event_loop
    web.run_app(
        make_app(args.engines), host=args.host, port=args.port, loop=new_loop(), print=None, access_log=None
    )


if __name__ == "__main__":
    main()
