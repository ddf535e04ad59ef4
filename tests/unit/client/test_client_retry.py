"""A baseline replica that is gone (refused, dropped the request mid-flight, or draining) costs
a retry on the next replica, never the request; one that is frozen (has not answered within a
share of the deadline) is hedged on another. Each is counted with its reason."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.unit.client.contract_worker import Worker, serve
from workers.api import RANK_PATH, Candidate
from workers.client.client import RankingClient, RankingError
from workers.client.config import ClientConfig
from workers.policy.baseline_retry import RetryConfig

CANDIDATES = [Candidate(id=i, sparse=[i], prior=i / 10) for i in range(5)]
REFUSED = "http://127.0.0.1:9"


async def _replica(handler: Callable[[web.Request], Awaitable[web.Response]]) -> TestServer:
    """A replica on a loopback port whose rank endpoint is `handler`."""
    app = web.Application()
    app.router.add_post(RANK_PATH, handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def _dropper() -> TestServer:
    """A replica that dies with the request in flight: the connection closes, no response."""
    async def drop(request: web.Request) -> web.Response:
        await request.read()
        assert request.transport is not None
        request.transport.close()
        await asyncio.sleep(1.0)
        return web.Response(status=500)

    return await _replica(drop)


@pytest.fixture
async def healthy() -> AsyncIterator[tuple[Worker, str]]:
    worker = Worker("baseline")
    server = await serve(worker)
    yield worker, str(server.make_url("")).rstrip("/")
    await server.close()


async def _rank_all(urls: list[str], n: int) -> RankingClient:
    client = RankingClient(ClientConfig(scope="eu1", baseline_urls=urls))
    async with client:
        for _ in range(n):
            result = await client.rank(segment="s", value=1.0, candidates=CANDIDATES,
                                       base_count=5)
            assert result.response.scored == 5
    return client


async def test_refused_replica_is_skipped_for_the_next(healthy: tuple[Worker, str]) -> None:
    worker, url = healthy
    client = await _rank_all([REFUSED, url], 4)
    decisions = client.summary()["decisions"]
    assert len(worker.seen) == 4
    assert decisions["baseline_retry"] == {"connection": 1}    # then skipped while down
    assert "baseline_failed" not in decisions


async def test_request_in_flight_on_a_dying_replica_is_retried(
        healthy: tuple[Worker, str]) -> None:
    worker, url = healthy
    dropper = await _dropper()
    try:
        client = await _rank_all([str(dropper.make_url("")).rstrip("/"), url], 2)
    finally:
        await dropper.close()
    assert client.summary()["decisions"]["baseline_retry"] == {"disconnected": 1}
    assert len(worker.seen) == 2


async def test_draining_replica_is_retried_then_skipped_but_a_model_failure_is_not(
        healthy: tuple[Worker, str]) -> None:
    _, url = healthy
    draining, failing = Worker("baseline", status=503), Worker("baseline", status=500)
    servers = [await serve(draining), await serve(failing)]
    urls = [str(s.make_url("")).rstrip("/") for s in servers]
    try:
        client = await _rank_all([urls[0], url], 4)
        assert client.summary()["decisions"]["baseline_retry"] == {"http_503": 1}  # then skipped
        assert len(draining.seen) == 1
        with pytest.raises(RankingError, match="http_500"):
            await _rank_all([urls[1], url], 1)
    finally:
        for s in servers:
            await s.close()


async def test_every_replica_gone_loses_the_request_and_counts_it() -> None:
    client = RankingClient(ClientConfig(scope="eu1", baseline_urls=[REFUSED, REFUSED]))
    async with client:
        with pytest.raises(RankingError, match="connection"):
            await client.rank(segment="s", value=1.0, candidates=CANDIDATES, base_count=5)
    decisions = client.summary()["decisions"]
    assert decisions["baseline_retry"] == {"connection": 1}
    assert decisions["baseline_failed"] == {"connection": 1}


async def _hanging() -> tuple[TestServer, list[float]]:
    """A frozen replica: it accepts the connection and the request, and never answers (a
    process stopped with SIGSTOP, as the kernel still completes its TCP handshakes)."""
    seen: list[float] = []

    async def hang(request: web.Request) -> web.Response:
        await request.read()
        seen.append(time.perf_counter())
        await asyncio.sleep(30.0)
        return web.Response(status=500)

    return await _replica(hang), seen


async def test_frozen_replica_is_hedged_within_the_deadline_then_skipped(
        healthy: tuple[Worker, str]) -> None:
    worker, url = healthy
    frozen, seen = await _hanging()
    client = RankingClient(ClientConfig(scope="eu1", default_deadline_ms=250.0,
                                        baseline_urls=[str(frozen.make_url("")).rstrip("/"),
                                                       url]))
    try:
        async with client:
            latencies = []
            for _ in range(6):
                result = await client.rank(segment="s", value=1.0, candidates=CANDIDATES,
                                           base_count=5)
                assert result.response.scored == 5
                latencies.append(result.latency_ms)
    finally:
        await frozen.close()
    decisions = client.summary()["decisions"]
    assert decisions["baseline_hedge"] == {"slow": 1}      # then skipped while down
    assert "baseline_failed" not in decisions and "baseline_retry" not in decisions
    assert len(seen) == 1 and len(worker.seen) == 6
    assert 125.0 <= latencies[0] < 250.0                   # half the deadline, then the hedge
    assert worker.seen[0].deadline_ms < 126.0              # the hedge carries what is left
    assert max(latencies[1:]) < 100.0


async def test_slow_pool_is_hedged_within_the_budget_and_keeps_its_replicas() -> None:
    """Every replica slower than half the deadline: the request is hedged while the budget
    lasts, the first call still answers first (a hedge never makes a request later), and
    no replica is skipped."""
    slow = [Worker("baseline", delay_s=0.08), Worker("baseline", delay_s=0.08)]
    servers = [await serve(w) for w in slow]
    config = ClientConfig(scope="eu1", default_deadline_ms=100.0,
                          baseline_urls=[str(s.make_url("")).rstrip("/") for s in servers],
                          baseline_retry=RetryConfig(budget_burst=2.0, budget_ratio=0.0))
    client = RankingClient(config)
    try:
        async with client:
            for _ in range(6):
                result = await client.rank(segment="s", value=1.0, candidates=CANDIDATES,
                                           base_count=5)
                assert result.response.scored == 5
                assert result.latency_ms < 125.0           # not 50 ms + another 80 ms
    finally:
        for s in servers:
            await s.close()
    assert client.summary()["decisions"]["baseline_hedge"] == {"slow": 2}   # the budget
    assert not client.transport._down_until                 # no replica skipped
    assert len(slow[0].seen) + len(slow[1].seen) == 8
