"""With membership on, the client routes to the live set: an announced replica gets calls, a
draining or tombstoned one none, and the fixed URLs serve only while nobody is live."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from schemas.contract import ReplicaAnnouncement
from tests.unit.client.contract_worker import Worker, serve
from workers.api import Candidate
from workers.client.client import RankingClient, RankingError
from workers.client.config import ClientConfig

CANDIDATES = [Candidate(id=i, sparse=[i], prior=i / 10) for i in range(5)]
T0 = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def ann(replica: str, url: str, ts: int, state: str = "serving") -> ReplicaAnnouncement:
    return ReplicaAnnouncement(
        replica_id=replica, endpoint=url, region="eu1", pool_id="eu1/rank/baseline/cpu/o",
        tier="opportunistic", model="baseline", state=state,  # type: ignore[arg-type]
        ts_ms=ts, lease_expires_at_ms=ts + 3_000)


@pytest.fixture
async def two() -> AsyncIterator[list[tuple[Worker, str]]]:
    out, servers = [], []
    for _ in range(2):
        worker = Worker("baseline")
        server = await serve(worker)
        servers.append(server)
        out.append((worker, str(server.make_url("")).rstrip("/")))
    yield out
    for server in servers:
        await server.close()


async def _rank(client: RankingClient, n: int) -> None:
    for _ in range(n):
        await client.rank(segment="s", value=1.0, candidates=CANDIDATES, base_count=5)


async def test_calls_go_to_announced_replicas_only(two: list[tuple[Worker, str]]) -> None:
    (a, url_a), (b, url_b) = two
    clock = Clock()
    client = RankingClient(ClientConfig(scope="eu1", membership=True), clock=clock)
    async with client:
        client.apply_membership("a", ann("a", url_a, T0))
        await _rank(client, 4)
        assert (len(a.seen), len(b.seen)) == (4, 0)
        client.apply_membership("b", ann("b", url_b, T0))
        await _rank(client, 4)
        assert (len(a.seen), len(b.seen)) == (6, 2)


async def test_a_draining_replica_gets_no_more_calls(two: list[tuple[Worker, str]]) -> None:
    (a, url_a), (b, url_b) = two
    clock = Clock()
    client = RankingClient(ClientConfig(scope="eu1", membership=True), clock=clock)
    async with client:
        client.apply_membership("a", ann("a", url_a, T0))
        client.apply_membership("b", ann("b", url_b, T0))
        client.apply_membership("a", ann("a", url_a, T0 + 1, state="draining"))
        await _rank(client, 4)
        assert (len(a.seen), len(b.seen)) == (0, 4)
        client.apply_membership("b", None)        # b's tombstone: nobody is live
        with pytest.raises(RankingError, match="no_replica"):
            await _rank(client, 1)


async def test_a_replica_whose_lease_ran_out_gets_no_calls_and_fixed_urls_take_over(
        two: list[tuple[Worker, str]]) -> None:
    (a, url_a), (b, url_b) = two
    clock = Clock()
    client = RankingClient(ClientConfig(scope="eu1", membership=True, baseline_urls=[url_b]),
                           clock=clock)
    async with client:
        client.apply_membership("a", ann("a", url_a, T0))
        await _rank(client, 2)
        clock.now = T0 + 3_000
        await _rank(client, 2)
        assert (len(a.seen), len(b.seen)) == (2, 2)
        assert client.summary()["membership"]["routable"] == {"baseline": 0, "powerful": 0}


def test_a_client_with_no_urls_and_no_membership_is_refused_naming_both() -> None:
    import msgspec

    with pytest.raises(msgspec.ValidationError, match=r"baseline_urls.*membership"):
        msgspec.convert({"scope": "eu1"}, ClientConfig)
