"""Run by the interpreter of a venv holding only `surplus[client]`: the client imports, is typed,
and ranks a request against a worker over HTTP, with none of the heavy packages installed.

A script, not a test module: it must not import pytest or anything from tests/ (neither is in
that venv). It exits non-zero, naming what failed.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import importlib.util
import sys

HEAVY = ("torch", "faust", "highspy", "scipy", "matplotlib", "prometheus_client", "uvloop",
         "aiokafka")


async def rank_once() -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from schemas.clock import wall_ms
    from schemas.contract import ControlTargets, RmaTarget, SbmTarget
    from workers.api import RANK_PATH, Candidate, RankResponse, ServerState, encode
    from workers.client.client import RankingClient
    from workers.client.config import ClientConfig
    from workers.policy.routing import RouterConfig
    from workers.wire import MSGPACK_TYPE, decode_columnar_request

    async def handle(http: web.Request) -> web.Response:
        # The client's default body: msgpack, candidates as numpy columns (numpy is in
        # surplus[client]).
        assert http.headers["content-type"] == MSGPACK_TYPE, http.headers["content-type"]
        request = decode_columnar_request(await http.read()).to_request()
        response = RankResponse(
            request_id=request.request_id, model="powerful",
            scores=[c.prior for c in request.candidates], scored=len(request.candidates),
            optional_scored=len(request.candidates) - request.base_count, optional_shed=0,
            server=ServerState(queue_delay_ms=0.5, in_flight=1, shedding_level=0))
        return web.Response(body=encode(response), content_type="application/json")

    app = web.Application()
    app.router.add_post(RANK_PATH, handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    config = ClientConfig(scope="eu1", baseline_urls=[url], powerful_urls=[url],
                          router=RouterConfig(explore_rate=0.0), holdout_fraction=0.0)
    try:
        async with RankingClient(config) as client:
            client.apply_targets(ControlTargets(
                scope="eu1", epoch=1, issued_at_ms=wall_ms(), ttl_ms=30_000,
                rma=RmaTarget(extra_candidates=4, budget_units_per_s=1e9),
                sbm=SbmTarget(coverage=1.0)))
            await asyncio.sleep(0.01)     # the RMA bucket fills at the budget rate
            result = await client.rank(
                segment="s", value=2.0, base_count=3, deadline_ms=500.0,
                candidates=[Candidate(id=i, sparse=[i], prior=i / 10) for i in range(10)])
    finally:
        await server.close()
    assert result.response.model == "powerful", result
    assert result.response.scored == 7 and result.response.optional_scored == 4, result


def main() -> int:
    installed = [name for name in HEAVY if importlib.util.find_spec(name) is not None]
    if installed:
        print(f"client-only venv holds {', '.join(installed)}", file=sys.stderr)
        return 1
    untyped = [pkg for pkg in ("workers", "schemas")
               if not importlib.resources.files(pkg).joinpath("py.typed").is_file()]
    if untyped:
        print(f"no py.typed in {', '.join(untyped)}", file=sys.stderr)
        return 1
    asyncio.run(rank_once())
    print("client-only install: imported, typed, ranked one request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
