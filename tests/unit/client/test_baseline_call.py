"""The baseline call (``workers.client.baseline_call``): a replica that is gone costs a retry
on another, a pool that fails everywhere raises the last reason, and a fallback sends its
baseline work alone."""

from __future__ import annotations

import time
from collections.abc import Mapping

import pytest

from workers.api import Candidate, RankRequest, RankResponse, ServerState
from workers.client.baseline_call import after_fallback, call_baseline, sized_for
from workers.client.result import RankingError
from workers.client.transport import CallFailed, Transport
from workers.policy.baseline_retry import BaselineRetry, RetryConfig
from workers.policy.shed_order import marginal_extra_value
from workers.wire import FeatureValue

URLS = ("http://a", "http://b")
REQUEST = RankRequest(request_id="r1", segment="s", value=1.0, deadline_ms=100.0,
                      candidates=[Candidate(id=i) for i in range(4)], base_count=2)


def _transport() -> Transport:
    return Transport({"baseline": URLS}, encoding="json", replica_down_s=2.0,
                     membership=None, clock=lambda: 0)


def _answer(request: RankRequest) -> RankResponse:
    return RankResponse(request_id=request.request_id, model="baseline", scores=[0.0],
                        scored=1, optional_scored=0, optional_shed=0,
                        server=ServerState(queue_delay_ms=0.0, in_flight=0, shedding_level=0))


class Pool:
    """Replicas that fail with a reason each (None: answer), calls counted by URL."""

    def __init__(self, failures: dict[str, str | None]) -> None:
        self.failures = failures
        self.calls: list[str | None] = []
        self.counts: dict[tuple[str, str], int] = {}

    async def call(self, request: RankRequest, timeout_s: float,
                   features: Mapping[str, FeatureValue] | None,
                   url: str | None) -> RankResponse:
        self.calls.append(url)
        reason = self.failures[url or ""]
        if reason is not None:
            raise CallFailed(reason, url)
        return _answer(request)

    def bump(self, cls: str, reason: str) -> None:
        self.counts[cls, reason] = self.counts.get((cls, reason), 0) + 1


async def _serve(pool: Pool) -> RankResponse:
    return await call_baseline(REQUEST, None, call=pool.call, transport=_transport(),
                               retry=BaselineRetry(RetryConfig(), 100.0), hung_s=0.1,
                               bump=pool.bump)


async def test_a_gone_replica_costs_a_retry_on_the_next() -> None:
    pool = Pool({"http://a/v1/rank": "connection", "http://b/v1/rank": None})
    response = await _serve(pool)
    assert response.request_id == "r1"
    assert len(pool.calls) == 2 and len(set(pool.calls)) == 2
    assert pool.counts == {("baseline_retry", "connection"): 1}


async def test_a_pool_failing_everywhere_raises_the_last_reason() -> None:
    pool = Pool({"http://a/v1/rank": "connection", "http://b/v1/rank": "http_503"})
    with pytest.raises(RankingError) as raised:
        await _serve(pool)
    first, last = ("connection", "http_503") if pool.calls[0] == "http://a/v1/rank" else (
        "http_503", "connection")
    assert raised.value.reason == last
    assert pool.counts == {("baseline_retry", first): 1, ("baseline_failed", last): 1}


async def test_a_reason_not_worth_a_retry_fails_at_once() -> None:
    pool = Pool({"http://a/v1/rank": "bad_response", "http://b/v1/rank": "bad_response"})
    with pytest.raises(RankingError, match="bad_response"):
        await _serve(pool)
    assert len(pool.calls) == 1


def test_a_fallback_sends_its_baseline_work_with_what_is_left_of_the_deadline() -> None:
    sent = after_fallback(REQUEST, time.perf_counter() - 0.03)
    assert [c.id for c in sent.candidates] == [0, 1]
    assert 1.0 <= sent.deadline_ms <= 70.0
    assert after_fallback(REQUEST, time.perf_counter() - 1.0).deadline_ms == 1.0


async def test_each_call_carries_the_extras_its_replica_has_room_for() -> None:
    pool = Pool({"http://a/v1/rank": "connection", "http://b/v1/rank": None})
    sizes: list[tuple[str, int, bool]] = []
    sent: list[int] = []

    async def call(request: RankRequest, timeout_s: float,
                   features: Mapping[str, FeatureValue] | None,
                   url: str | None) -> RankResponse:
        sent.append(request.optional_count)
        return await pool.call(request, timeout_s, features, url)

    def fit(url: str, extra: int, first: bool) -> int:
        sizes.append((url, extra, first))
        return 1 if url == "http://a/v1/rank" else extra

    await call_baseline(REQUEST, None, call=call, transport=_transport(),
                        retry=BaselineRetry(RetryConfig(), 100.0), hung_s=0.1,
                        bump=pool.bump, fit=fit)
    by_url = dict(zip(pool.calls, sent, strict=True))
    assert by_url == {"http://a/v1/rank": 1, "http://b/v1/rank": 2}
    assert sorted(first for _, _, first in sizes) == [False, True]   # one counted cut
    assert all(extra == 2 for _, extra, _ in sizes)   # each sized from what was offered


def test_a_request_sized_down_carries_its_last_extra_gain_and_fewer_candidates() -> None:
    request = sized_for(REQUEST, 1)
    assert (len(request.candidates), request.base_count) == (3, 2)
    assert request.gain == marginal_extra_value(1)
    assert sized_for(REQUEST, 0).gain is None
    assert sized_for(REQUEST, 2) is REQUEST
