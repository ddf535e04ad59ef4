"""RankingClient over real HTTP on loopback, against small contract-speaking test workers
(no Kafka): the powerful pool may fail or be slow; baseline still serves, and it is counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest

from schemas.codec import ContractError
from tests.unit.client.contract_worker import Worker, serve
from tests.unit.policy.helpers import targets
from workers.api import Candidate
from workers.client.client import RankingClient, RankingError, RankResult, top_score_value
from workers.client.config import ClientConfig
from workers.policy.client_shed import ShedConfig
from workers.policy.powerful_hedge import HedgeConfig
from workers.policy.routing import RouterConfig

CANDIDATES = [Candidate(id=i, sparse=[i], prior=i / 10) for i in range(10)]


Pools = tuple[Worker, Worker, str, str]


@pytest.fixture
async def pools() -> AsyncIterator[Pools]:
    baseline, powerful = Worker("baseline"), Worker("powerful")
    servers = [await serve(baseline), await serve(powerful)]
    urls = [str(s.make_url("")).rstrip("/") for s in servers]
    yield baseline, powerful, urls[0], urls[1]
    for s in servers:
        await s.close()


def _client(base_url: str, power_url: str, **kw: object) -> RankingClient:
    # No holdout: a random request id lands in it one time in a hundred, and these tests pin
    # where one request goes.
    config = ClientConfig(scope="eu1", baseline_urls=[base_url], powerful_urls=[power_url],
                          router=RouterConfig(explore_rate=0.0), holdout_fraction=0.0,
                          **kw)  # type: ignore[arg-type]
    # The value known at response time (the decision carries it): the request's value times
    # its best score.
    client = RankingClient(config, outcome_value=top_score_value)
    client.apply_targets(targets(coverage=1.0, extra=4, budget=1e9,
                                 issued_at_ms=client._clock()))
    return client


async def _rank(client: RankingClient, deadline_ms: float = 200.0) -> RankResult:
    return await client.rank(segment="s", value=2.0, candidates=CANDIDATES, base_count=3,
                             dense=[0.1], deadline_ms=deadline_ms)


async def test_powerful_pool_serves_routed_requests_with_extras(pools: Pools) -> None:
    baseline, powerful, base_url, power_url = pools
    async with _client(base_url, power_url) as client:
        await asyncio.sleep(0.01)    # the RMA bucket starts empty and fills at the budget rate
        result = await _rank(client)
    assert result.response.model == "powerful" and result.fell_back is None
    assert len(powerful.seen) == 1 and not baseline.seen
    assert powerful.seen[0].base_count == 3 and len(powerful.seen[0].candidates) == 7
    assert result.value == pytest.approx(2.0 * 0.6)
    assert client.summary()["decisions"]["served"] == {"powerful": 1}


async def test_a_powerful_call_tells_the_replica_the_share_of_the_deadline_it_may_use(
        pools: Pools) -> None:
    baseline, powerful, base_url, power_url = pools
    powerful.status = 503
    async with _client(base_url, power_url, powerful_deadline_share=0.25) as client:
        await _rank(client, deadline_ms=200.0)
    assert powerful.seen[0].deadline_ms == pytest.approx(50.0)
    assert baseline.seen[0].deadline_ms > 50.0   # the fallback keeps the rest of the deadline


async def test_slow_powerful_pool_falls_back_to_baseline_within_the_deadline(pools: Pools) -> None:
    baseline, powerful, base_url, power_url = pools
    powerful.delay_s = 1.0
    async with _client(base_url, power_url, powerful_deadline_share=0.5) as client:
        await asyncio.sleep(0.01)
        result = await _rank(client, deadline_ms=100.0)
    assert result.response.model == "baseline" and result.fell_back == "timeout"
    assert result.latency_ms < 100.0 + 100.0  # the slow pool would have taken 1000 ms
    sent = baseline.seen[0]
    assert len(sent.candidates) == 3 and sent.base_count == 3    # extras dropped on fallback
    assert sent.deadline_ms < 55.0
    counters = client.summary()["decisions"]
    assert counters["fallback"] == {"timeout": 1}
    assert counters["rma_shed"]["fallback"] == 4
    assert client.summary()["client_shed"] == {"powerful": {"cuts": 1, "timeout": 1}}


async def test_a_powerful_replica_that_timed_out_is_skipped_while_another_serves(
        pools: Pools) -> None:
    baseline, frozen, base_url, frozen_url = pools
    frozen.delay_s = 1.0
    healthy = Worker("powerful")
    server = await serve(healthy)
    config = ClientConfig(scope="eu1", baseline_urls=[base_url],
                          powerful_urls=[frozen_url, str(server.make_url("")).rstrip("/")],
                          router=RouterConfig(explore_rate=0.0), holdout_fraction=0.0,
                          powerful_deadline_share=0.5, replica_down_s=60.0,
                          shed=ShedConfig(error_factor=1.0))    # coverage stays whole
    client = RankingClient(config)
    client.apply_targets(targets(coverage=1.0, extra=0, budget=1e9,
                                 issued_at_ms=client._clock()))
    try:
        async with client:
            results = [await _rank(client, deadline_ms=100.0) for _ in range(4)]
    finally:
        await server.close()
    assert [r.fell_back for r in results] == ["timeout", None, None, None]
    assert len(frozen.seen) == 1 and len(healthy.seen) == 3 and len(baseline.seen) == 1


def _hedging_client(base_url: str, power_url: str) -> RankingClient:
    """A client that measures the powerful pool over 10 answers, and waits for it up to 1 s
    (of a 2 s deadline): long enough that no load on the machine decides these tests."""
    return _client(base_url, power_url, powerful_deadline_share=0.5,
                   powerful_hedge=HedgeConfig(window_answers=10, min_wait_ms=20.0))


async def test_a_late_powerful_call_is_hedged_on_the_baseline_pool_which_serves_it(
        pools: Pools) -> None:
    baseline, powerful, base_url, power_url = pools
    async with _hedging_client(base_url, power_url) as client:
        for _ in range(10):     # the pool's latency, measured
            assert (await _rank(client, deadline_ms=2000.0)).fell_back is None
        powerful.delay_s = 5.0  # then it stalls
        result = await _rank(client, deadline_ms=2000.0)
    assert result.response.model == "baseline" and result.fell_back == "late"
    assert result.latency_ms < 1000.0           # not the whole powerful wait
    assert len(baseline.seen[0].candidates) == 3    # baseline work only, as a fallback's
    counters = client.summary()["decisions"]
    assert counters["powerful_hedge"] == {"late": 1} and counters["fallback"] == {"late": 1}
    assert client.summary()["client_shed"]["powerful"]["late"] == 1


async def test_a_powerful_answer_that_beats_its_hedge_serves_the_request(pools: Pools) -> None:
    baseline, powerful, base_url, power_url = pools
    async with _hedging_client(base_url, power_url) as client:
        for _ in range(10):
            await _rank(client, deadline_ms=2000.0)
        powerful.delay_s, baseline.delay_s = 0.1, 0.9   # late, but sooner than its hedge
        result = await _rank(client, deadline_ms=2000.0)
    assert result.response.model == "powerful" and result.fell_back is None
    counters = client.summary()["decisions"]
    assert counters["powerful_hedge"] == {"late": 1} and "fallback" not in counters


async def test_failing_powerful_pool_cuts_its_own_allowance_not_the_ranking_pools(
        pools: Pools) -> None:
    _, powerful, base_url, power_url = pools
    powerful.status = 503
    async with _client(base_url, power_url) as client:
        result = await _rank(client)
        assert result.fell_back == "http_503" and result.response.model == "baseline"
        allowance = client.summary()["allowance"]
        assert allowance["powerful"] < 1.0 and allowance["baseline"] == 1.0


async def test_unreachable_powerful_pool_falls_back(pools: Pools) -> None:
    _, _, base_url, _ = pools
    async with _client(base_url, "http://127.0.0.1:9") as client:
        result = await _rank(client)
    assert result.fell_back == "connection" and result.response.model == "baseline"


async def test_baseline_failure_is_raised_and_counted(pools: Pools) -> None:
    baseline, powerful, base_url, power_url = pools
    baseline.status = 500
    powerful.status = 500
    async with _client(base_url, power_url) as client:
        with pytest.raises(RankingError, match="http_500"):
            await _rank(client)
    assert client.summary()["decisions"]["baseline_failed"] == {"http_500": 1}


async def test_worker_load_signals_and_server_sheds_reach_the_counters(pools: Pools) -> None:
    _, powerful, base_url, power_url = pools
    powerful.shedding_level = 3
    powerful.shed_optional = True
    async with _client(base_url, power_url, shed=ShedConfig(level_factors=(0.5, 0.5, 0.2))) \
            as client:
        await asyncio.sleep(0.01)
        result = await _rank(client)
        assert result.response.optional_shed == 4
        summary = client.summary()
    assert summary["decisions"]["server_shed"] == {"overload": 4}
    assert summary["client_shed"]["powerful"]["shedding_level_3"] == 1
    assert summary["allowance"]["powerful"] == pytest.approx(0.2, abs=0.01)


async def test_extras_a_ranking_replica_trimmed_still_spent_the_rma_budget(pools: Pools) -> None:
    # The budget meters extras sent: giving back what a busy replica trimmed would send them
    # again at once, into the same busy moment (see docs/client.md).
    baseline, _, base_url, power_url = pools
    baseline.shed_optional = True
    async with _client(base_url, power_url, rma_burst_s=1.0) as client:
        client.apply_targets(targets(epoch=2, coverage=0.0, extra=4, budget=4.0,
                                     issued_at_ms=client._clock()))
        await asyncio.sleep(1.1)                     # the bucket fills to its burst: 4 units
        first = await _rank(client)
        assert (first.decision.extra, first.response.optional_shed) == (4, 4)
        second = await _rank(client)
    assert second.decision.extra < 4                 # refilled at 4/s only, nothing given back
    assert "refunded" not in client.decider.counters["rma_granted"]


async def test_a_ranking_replica_is_sent_no_more_extras_than_it_said_it_had_room_for(
        pools: Pools) -> None:
    baseline, _, base_url, power_url = pools
    baseline.room = 1
    async with _client(base_url, power_url) as client:
        client.apply_targets(targets(epoch=2, coverage=0.0, extra=4, budget=1e9,
                                     issued_at_ms=client._clock()))
        await asyncio.sleep(0.01)
        first = await _rank(client)              # no period ended yet: not capped
        client.apply_targets(targets(epoch=3, coverage=0.0, extra=4, budget=1e9,
                                     issued_at_ms=client._clock()))
        second = await _rank(client)
    assert baseline.seen[0].report_room
    assert (first.decision.extra, first.response.optional_scored) == (4, 4)
    assert (second.decision.extra, second.response.optional_scored) == (4, 1)
    assert len(baseline.seen[-1].candidates) == 3 + 1
    assert client.decider.counters["rma_shed"]["room"] == 3


async def test_requests_travel_as_msgpack_by_default_and_as_json_when_configured(
        pools: Pools) -> None:
    _, powerful, base_url, power_url = pools
    async with _client(base_url, power_url) as client:
        await asyncio.sleep(0.01)
        packed = await _rank(client)
    async with _client(base_url, power_url, encoding="json") as client:
        await asyncio.sleep(0.01)
        plain = await _rank(client)
    assert powerful.encodings == [("msgpack", "msgpack"), ("json", "json")]
    assert powerful.seen[0] == msgspec.structs.replace(powerful.seen[1],
                                                       request_id=powerful.seen[0].request_id)
    assert packed.response.scores == plain.response.scores == [c.prior for c in CANDIDATES[:7]]


async def test_a_json_answer_to_a_msgpack_request_is_read(pools: Pools) -> None:
    _, powerful, base_url, power_url = pools
    powerful.answer = "json"
    async with _client(base_url, power_url) as client:
        await asyncio.sleep(0.01)
        result = await _rank(client)
    assert powerful.encodings == [("msgpack", "json")]
    assert result.response.model == "powerful" and result.fell_back is None


async def test_candidates_msgpack_cannot_carry_are_refused_by_name_before_any_call(
        pools: Pools) -> None:
    baseline, powerful, base_url, power_url = pools
    ragged = [*CANDIDATES[:4], Candidate(id=4, sparse=[4, 4]), *CANDIDATES[5:]]
    async with _client(base_url, power_url) as client:
        with pytest.raises(ContractError, match=r"`\$\.candidates\[4\]\.sparse` has 2 ids"):
            await client.rank(segment="s", value=2.0, candidates=ragged, base_count=3)
    assert not baseline.seen and not powerful.seen
