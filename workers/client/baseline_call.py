"""The baseline call: the one call a request must not lose, so it is retried and hedged.

Scoring has no side effects, so sending a request twice costs capacity, never correctness. A
replica that is gone (`RETRY_ON_ANOTHER_REPLICA`) costs a retry on another one; one that has
not answered after a share of the deadline (frozen, hung) is hedged on another, within the
budget `workers.policy.baseline_retry` keeps so an overloaded pool is not sent twice its work.
The first answer serves the request; a replica a hedge beat is skipped for a while.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

import msgspec

from workers.api import RankRequest, RankResponse
from workers.client.result import RankingError
from workers.client.transport import RETRY_ON_ANOTHER_REPLICA, CallFailed, Transport
from workers.policy.baseline_retry import BaselineRetry
from workers.policy.shed_order import extras_gain
from workers.wire import FeatureValue

#: One call to a replica of the baseline pool: (request, timeout_s, features, url).
BaselineSend = Callable[[RankRequest, float, Mapping[str, FeatureValue] | None, str | None],
                        Awaitable[RankResponse]]
#: How many of a request's extra candidates one replica is sent: (replica url, extras, whether
#: this is the request's first call, whose cut is counted) -> extras (``Decider.fit_to_replica``).
FitExtras = Callable[[str, int, bool], int]


def after_fallback(request: RankRequest, started: float) -> RankRequest:
    """What a request that fell back from the powerful pool sends to the baseline one: its
    baseline work alone, with what is left of the deadline (``started``: perf_counter s)."""
    left_ms = request.deadline_ms - (time.perf_counter() - started) * 1000.0
    return msgspec.structs.replace(
        request, candidates=request.candidates[:request.base_count],
        deadline_ms=max(left_ms, 1.0))


def sized_for(request: RankRequest, extra: int) -> RankRequest:
    """``request`` with only its first ``extra`` extra candidates, and the expected gain of
    its last one (what a replica orders optional work by)."""
    if extra >= request.optional_count:
        return request
    return msgspec.structs.replace(
        request, candidates=request.candidates[:request.base_count + extra],
        gain=extras_gain(extra))


async def call_baseline(request: RankRequest, features: Mapping[str, FeatureValue] | None, *,
                        call: BaselineSend, transport: Transport, retry: BaselineRetry,
                        hung_s: float, bump: Callable[[str, str], None],
                        fit: FitExtras | None = None) -> RankResponse:
    """Serve ``request`` from the baseline pool, retrying and hedging it on other replicas.

    :param call: one call to a replica (the client's, which feeds client-side shedding).
    :param transport: picks the replicas and skips the ones a hedge beat.
    :param retry: the hedge delay and budget, and how long a beaten replica is skipped.
    :param hung_s: how long one call may take before it counts as failed.
    :param bump: counts a retry, a hedge or the failure, by class and reason.
    :param fit: sizes the extras each call carries to the replica it goes to (None: all).
    :raise RankingError: every replica it could be retried on failed (the last reason).
    """
    retry.request()
    begun = time.perf_counter()
    deadline_ms = request.deadline_ms
    replicas = max(1, len(transport.pool_urls("baseline")))
    tried: list[str] = []
    #: Calls in flight: the replica each went to and when it started.
    flights: dict[asyncio.Task[RankResponse], tuple[str | None, float]] = {}
    hedge_at: float | None = None
    failed: CallFailed | None = None

    def send() -> None:
        nonlocal hedge_at
        now = time.perf_counter()
        left_ms = deadline_ms - (now - begun) * 1000.0
        sent = request if not tried else msgspec.structs.replace(
            request, deadline_ms=max(left_ms, 1.0))
        url = transport.pick("baseline", tried)
        if url is not None:
            if fit is not None and sent.optional_count:
                sent = sized_for(sent, fit(url, sent.optional_count, not tried))
            tried.append(url)
        flights[asyncio.ensure_future(call(sent, hung_s, features, url))] = (url, now)
        wait_ms = retry.hedge_after_ms(left_ms, replicas - len(tried))
        hedge_at = None if wait_ms is None else now + wait_ms / 1000.0

    send()
    try:
        while flights:
            timeout = (None if hedge_at is None
                       else max(0.0, hedge_at - time.perf_counter()))
            done, _ = await asyncio.wait(flights, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if not done:     # slow: hedge it on another replica, budget allowing
                hedge_at = None
                if retry.take_hedge():
                    bump("baseline_hedge", "slow")
                    send()
                continue
            for task in done:
                _, at = flights.pop(task)
                try:
                    response = task.result()
                except CallFailed as exc:
                    failed = exc
                    if exc.reason in RETRY_ON_ANOTHER_REPLICA and len(tried) < replicas:
                        # A replica that died (or is draining) with the request in flight
                        # costs a retry on the next one, not the request.
                        bump("baseline_retry", exc.reason)
                        send()
                    continue
                answered_ms = (time.perf_counter() - at) * 1000.0
                for slow, slow_at in flights.values():    # a hedge won: skip the slow
                    if slow is not None:
                        transport.mark_down(
                            slow, retry.skip_s((at - slow_at) * 1000.0, answered_ms))
                return response
    finally:
        for task in flights:
            task.cancel()
        if flights:
            await asyncio.gather(*flights, return_exceptions=True)
    assert failed is not None
    bump("baseline_failed", failed.reason)
    raise RankingError(failed.reason) from None
