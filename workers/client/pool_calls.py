"""The calls a request makes to the worker pools, each feeding client-side shedding with what
came of it: the powerful call, hedged on the baseline pool once it is late by the pool's
measured latency (`workers.policy.powerful_hedge`) and given up past its share of the deadline
so the baseline pool still has time to serve the request, and the baseline call, which must
succeed (`baseline_call`: retried and hedged on other replicas)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping

import msgspec

from workers.api import RankRequest, RankResponse
from workers.client.baseline_call import after_fallback, call_baseline
from workers.client.config import ClientConfig, powerful_wait_ms
from workers.client.decision import Decider
from workers.client.transport import CallFailed, Transport
from workers.policy.baseline_retry import BaselineRetry
from workers.policy.powerful_hedge import PowerfulHedge
from workers.policy.routing import Model
from workers.wire import FeatureValue


class PoolCalls:
    """One client's calls; use them from its event loop.

    :param config: deadlines, the powerful share and the baseline retry budget.
    :param transport: the pools' replicas and the HTTP pool.
    :param decider: learns from every call (`Decider.observe`) and counts fallbacks.
    :param clock: wall-clock milliseconds, as the client's.
    """

    def __init__(self, config: ClientConfig, transport: Transport, decider: Decider,
                 clock: Callable[[], int]) -> None:
        self.config = config
        self.transport = transport
        self.decider = decider
        self._clock = clock
        self.retry = BaselineRetry(config.baseline_retry, config.baseline_timeout_ms)
        self.hedge = PowerfulHedge(config.powerful_hedge)

    async def call(self, model: Model, request: RankRequest, timeout_s: float,
                   features: Mapping[str, FeatureValue] | None = None,
                   url: str | None = None) -> RankResponse:
        """One call to a replica of a pool (`url`; None: the next in turn); what came of it
        feeds client-side shedding."""
        try:
            response = await self.transport.call(model, request, timeout_s, features, url)
        except CallFailed as failed:
            self.decider.observe(None, self._clock(), error=failed.reason, model=model)
            raise
        self.decider.observe(response.server, self._clock(), model=model, replica=url)
        return response

    async def powerful(self, request: RankRequest, started: float, deadline_ms: float,
                       extra: int, features: Mapping[str, FeatureValue] | None = None,
                       ) -> tuple[RankResponse, str | None]:
        """A request routed to the powerful pool, served by it or, after a fallback, by the
        baseline pool; and why it fell back (None: it did not). A fallback's ``extra``
        candidates count as shed by it.

        The powerful replica is told the share of the deadline this call may use, so it trims
        or refuses what it could not finish before the client gives up on it. A call late by
        the pool's measured latency is hedged on the baseline pool
        (`workers.policy.powerful_hedge`), and the first answer serves.

        :raise RankingError: the baseline call the request fell back to failed everywhere.
        """
        budget_ms = powerful_wait_ms(deadline_ms, self.config.powerful_deadline_share)
        url = self.transport.pick("powerful")
        sent = time.perf_counter()
        self.hedge.request()
        call = asyncio.ensure_future(self.call(
            "powerful", msgspec.structs.replace(request, deadline_ms=budget_ms),
            budget_ms / 1000.0, features, url))
        hedge: asyncio.Future[RankResponse] | None = None
        try:
            after_ms = self.hedge.hedge_after_ms(budget_ms)
            if after_ms is not None:
                await asyncio.wait({call}, timeout=after_ms / 1000.0)
                if not call.done() and self.hedge.take():
                    self.decider.bump("powerful_hedge", "late")
                    hedge = asyncio.ensure_future(self.baseline(request, started, True, features))
                    await asyncio.wait({call, hedge}, return_when=asyncio.FIRST_COMPLETED)
                    if not call.done() and hedge.exception() is None:
                        self._late(url, sent, extra)
                        return hedge.result(), "late"
            try:
                response = await call
            except CallFailed as failed:
                self._fell_back(failed.reason, extra)
                if failed.reason == "timeout" and url is not None:
                    # No answer within the whole wait: frozen or swamped. The next requests
                    # try another replica for a while, not each the whole wait.
                    self.transport.mark_down(url, self.config.replica_down_s)
                if hedge is None:
                    return await self.baseline(request, started, True, features), failed.reason
                return await hedge, failed.reason
            self.hedge.answered((time.perf_counter() - sent) * 1000.0)
            return response, None
        finally:
            await _cancel(call, hedge)

    def _late(self, url: str | None, sent: float, extra: int) -> None:
        """The hedge answered before the powerful call: give that call up as failed, late
        (its pool's allowance is cut) and skip its replica for a while."""
        self.hedge.answered((time.perf_counter() - sent) * 1000.0)
        self.decider.observe(None, self._clock(), error="late", model="powerful")
        self._fell_back("late", extra)
        if url is not None:
            self.transport.mark_down(url, self.config.replica_down_s)

    def _fell_back(self, reason: str, extra: int) -> None:
        self.decider.bump("fallback", reason)
        self.decider.bump("rma_shed", "fallback", extra)

    async def baseline(self, request: RankRequest, started: float, fallback: bool,
                       features: Mapping[str, FeatureValue] | None = None) -> RankResponse:
        """Baseline pool: the call that must succeed. After a fallback, only baseline work is
        sent, with what is left of the deadline (``started``: the request's perf_counter s).

        :raise RankingError: it failed on every replica it could be retried on.
        """
        if fallback:
            request = after_fallback(request, started)
        return await call_baseline(request, features,
                                   call=functools.partial(self.call, "baseline"),
                                   transport=self.transport, retry=self.retry,
                                   hung_s=self.config.baseline_timeout_ms / 1000.0,
                                   bump=self.decider.bump, fit=self.decider.fit_to_replica)


async def _cancel(*calls: asyncio.Future[RankResponse] | None) -> None:
    """Cancel the calls still in flight (the one that did not serve) and wait for them."""
    pending = [c for c in calls if c is not None and not c.done()]
    for c in pending:
        c.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
