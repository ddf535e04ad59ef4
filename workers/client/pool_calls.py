"""The calls a request makes to the worker pools, each feeding client-side shedding with what
came of it: the powerful call, given up past its share of the deadline so the baseline pool
still has time to serve the request, and the baseline call, which must succeed
(`baseline_call`: retried and hedged on other replicas)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import msgspec

from workers.api import RankRequest, RankResponse
from workers.client.baseline_call import after_fallback, call_baseline
from workers.client.config import ClientConfig, powerful_wait_ms
from workers.client.decision import Decider
from workers.client.transport import CallFailed, Transport
from workers.policy.baseline_retry import BaselineRetry
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
        self.decider.observe(response.server, self._clock(), model=model)
        return response

    async def powerful(self, request: RankRequest, deadline_ms: float, extra: int,
                       features: Mapping[str, FeatureValue] | None = None,
                       ) -> tuple[RankResponse | None, str | None]:
        """The powerful pool's answer, or None and why it failed (counted as a fallback, its
        ``extra`` candidates as shed by it).

        The powerful replica is told the share of the deadline this call may use, so it trims
        or refuses what it could not finish before the client gives up on it."""
        budget_ms = powerful_wait_ms(deadline_ms, self.config.powerful_deadline_share)
        try:
            return await self.call(
                "powerful", msgspec.structs.replace(request, deadline_ms=budget_ms),
                budget_ms / 1000.0, features), None
        except CallFailed as failed:
            self.decider.bump("fallback", failed.reason)
            self.decider.bump("rma_shed", "fallback", extra)
            return None, failed.reason

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
                                   bump=self.decider.bump)
