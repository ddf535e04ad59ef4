"""`RankingClient`: what a ranking service embeds to send its requests to Surplus workers.

Per request it decides (no I/O, see `decision.py`) how many extra candidates to send and whether
the powerful pool serves it, calls the worker over HTTP (`transport.py`: the next replica, the
body in msgpack or JSON), and falls back to the baseline pool when the powerful call fails or
runs out of its share of the deadline — so losing opportunistic capacity only ever costs
optional work. It feeds every worker's load signals into client-side shedding, and publishes a
decision record (RoutingOutcome v4: lever choices, the router's propensity, explored, holdout)
per request, or for the ``decision_sample`` share of them picked by request-id hash (v9, with
their inclusion probability; every holdout request's), in batches (`records.py`), so the
control plane can join them with the outcome labels that arrive later (`label`, or any
labeller writing to the labels topic) and learn what optional work paid. A service that
knows a request's value at response time passes `outcome_value`: its decisions carry the
value, and the router learns from it at once.

Targets arrive on a background thread (`TargetsFeed`) and are applied on the event loop, so all
policy state is touched from one thread. So do the replicas, with ``membership`` on: each
pool's live set (`workers.policy.membership`) comes from the replicas topic (`MembershipFeed`),
and the fixed URLs serve only while it names no live replica of that pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
from msgspec import UNSET

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.contract import (
    SAMPLED_VERSION,
    SUPPLY_VERSION,
    ControlTargets,
    OutcomeLabel,
    ReplicaAnnouncement,
    RoutingOutcome,
)
from schemas.kafka_config import KafkaSettings
from schemas.signing import REFUSALS, Keyring, KeySource
from workers.api import Candidate, RankRequest, RankResponse
from workers.client.config import ClientConfig, powerful_wait_ms
from workers.client.decision import Decider, Decision, logged_propensity
from workers.client.feed import MembershipFeed, Refuse, TargetsFeed
from workers.client.records import RecordQueue
from workers.client.transport import RETRY_ON_ANOTHER_REPLICA, CallFailed, Transport
from workers.policy.baseline_retry import BaselineRetry
from workers.policy.holdout import in_holdout
from workers.policy.membership import Membership
from workers.policy.routing import Model
from workers.policy.sampling import decision_inclusion
from workers.wire import FeatureValue, check_feature_rows

OutcomeValue = Callable[[RankRequest, RankResponse], float]
VALUE_BOUND = 1e6


#: Served requests whose segment and model `label` still remembers (for local learning).
LABEL_MEMORY = 100_000


def top_score_value(request: RankRequest, response: RankResponse) -> float:
    """A stand-in value: the request's value signal times its best score. It compares raw
    scores of two different models, so it is no measure of what the powerful model adds; it
    is not the default. A service with a real outcome signal (clicks, dwell, revenue) sends
    it as a label (`label`), or passes its own `outcome_value` when known at response time."""
    best = max(response.scores, default=0.0)
    return request.value * best


class RankingError(RuntimeError):
    """The baseline pool could not serve a request (`reason` says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"baseline call failed: {reason}")
        self.reason = reason


class RankResult(msgspec.Struct, frozen=True):
    """One served request: the worker's response and what the client decided and observed."""

    response: RankResponse
    decision: Decision
    fell_back: str | None
    value: float | None
    latency_ms: float


class RankingClient:
    """Decides, calls the worker pools, falls back, sheds, learns and reports, per request.

    Use it from one event loop: `rank`, `label` and the ``apply_*`` methods touch policy state
    that is not locked (the Kafka feeds' threads hand their messages to that loop). Open it with
    ``async with`` (or `start` and `close`).
    """

    def __init__(self, config: ClientConfig, kafka: KafkaSettings | None = None, *,
                 signing_key: KeySource | Keyring | bytes | str | None = None,
                 outcome_value: OutcomeValue | None = None,
                 clock: Callable[[], int] = wall_ms) -> None:
        """
        :param config: where the pools are, deadlines, the budget share, the holdout and the
            local limits and policies (`ClientConfig`, strict).
        :param kafka: the cluster to follow targets (and, with ``config.membership``, the
            replicas) from and to publish decision records and labels to. None: no Kafka; the
            client serves baseline only unless targets are given with `apply_targets`.
        :param signing_key: the keyring (or one HMAC key, id ``default``) the control plane
            signs targets with; given, targets unsigned, under an unknown key id or forged are
            dropped, counted and dead-lettered. A `KeySource` follows a rotation as it
            reloads. None accepts unsigned targets.
        :param outcome_value: for a service that knows a request's value when it is served:
            called with the request and the response, its value goes into the decision record
            and the router learns from it at once (no `label` needed).
        :param clock: wall-clock milliseconds (targets' ages, decision times); a simulation
            passes its own.
        """
        self.config = config
        self.kafka = kafka
        self.decider = Decider(config, signing_key)
        self._outcome_value = outcome_value
        self._clock = clock
        self.membership: Membership | None = None
        self._membership_feed: MembershipFeed | None = None
        if config.membership:
            self.membership = Membership(config.scope, config.membership_limits)
        pools: dict[Model, tuple[str, ...]] = {
            "baseline": tuple(config.baseline_urls),
            "powerful": tuple(config.powerful_urls or ([] if config.membership
                                                       else config.baseline_urls))}
        self.transport = Transport(pools, encoding=config.encoding,
                                   replica_down_s=config.replica_down_s,
                                   membership=self.membership, clock=clock)
        self._retry = BaselineRetry(config.baseline_retry, config.baseline_timeout_ms)
        self._feed: TargetsFeed | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Decision records and labels on their way to Kafka (None: no Kafka, or not started).
        self._records: RecordQueue | None = None
        self._served: dict[str, tuple[str, Model]] = {}
        self._flusher: asyncio.Task[None] | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the HTTP pool, the outcome producer and the targets feed; wait (bounded by
        ``config.catch_up_timeout_s``) until the feed has read the targets topic to its end, so
        the first requests use targets. Without Kafka only the HTTP pool opens."""
        self._loop = asyncio.get_running_loop()
        self.transport.open(self.config.max_connections)
        if self.kafka is None:
            return  # targets and membership, if any, come through apply_targets/_membership
        producer = kafka_clients.producer(self.kafka, **{"client.id": "surplus-ranking-client"})
        records = self._records = RecordQueue(self.config, self.kafka, producer,
                                              self.decider.bump)
        self._flusher = asyncio.create_task(records.flush_every())
        self._feed = TargetsFeed(self.kafka, self.config.scope, self._from_feed,
                                 records.dead_letter)
        self._feed.start()
        if self.membership is not None:
            self._membership_feed = MembershipFeed(self.kafka, self.config.scope,
                                                   self._from_membership_feed,
                                                   records.dead_letter)
            self._membership_feed.start()
        if self.config.catch_up_timeout_s > 0:
            for name, feed in (("feed", self._feed), ("membership", self._membership_feed)):
                if feed is None:
                    continue
                caught_up = await asyncio.to_thread(feed.caught_up.wait,
                                                    self.config.catch_up_timeout_s)
                if not caught_up:
                    self.decider.bump(name, "catch_up_timeout")

    async def close(self) -> None:
        """Stop the feeds, close the HTTP pool, and send the decision records and labels still
        queued (waiting up to 5 s for the broker; what it did not take is counted)."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        if self._feed is not None:
            await asyncio.to_thread(self._feed.stop)
        if self._membership_feed is not None:
            await asyncio.to_thread(self._membership_feed.stop)
        await self.transport.close()
        if self._records is not None:
            await self._records.close()

    async def __aenter__(self) -> RankingClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _from_feed(self, targets: ControlTargets, refuse: Refuse) -> None:
        """Feed thread -> event loop: policy state is only touched on the loop."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):     # loop closing under us
                loop.call_soon_threadsafe(self.apply_targets, targets, refuse)

    def apply_targets(self, targets: ControlTargets, refuse: Refuse | None = None) -> None:
        """Offer a targets message to the target state (also usable without Kafka).

        :param targets: applied if it is for this scope, newer, fresh, in the contract and
            (with a signing key) signed; clamped to ``config.limits``; else dropped and counted.
        :param refuse: called with the verdict when the target state refuses the target for
            its signature (the feed's dead letter; the worker does the same with its own). An
            expired target is dropped before its signature is judged, so it never is.
        """
        verdict = self.decider.offer(targets, self._clock())
        if refuse is not None and verdict.reason in REFUSALS:
            refuse(verdict.reason)

    def _from_membership_feed(self, replica_id: str,
                              announcement: ReplicaAnnouncement | None) -> None:
        """Feed thread -> event loop, as for targets."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.apply_membership, replica_id, announcement)

    def apply_membership(self, replica_id: str,
                         announcement: ReplicaAnnouncement | None) -> None:
        """Offer an announcement to the live set (with ``config.membership``; else ignored).

        :param replica_id: the replica the announcement is keyed by.
        :param announcement: its latest state and lease; None is a tombstone (a clean stop).
        """
        membership = self.membership
        if membership is None:
            return
        if announcement is None:
            membership.withdraw(replica_id)
        else:
            now = self._clock()
            membership.offer(announcement, now)
            membership.forget_expired(now)

    # ---- per request -------------------------------------------------------------------------

    async def rank(self, *, segment: str, value: float, candidates: Sequence[Candidate],
                   base_count: int, dense: Sequence[float] = (),
                   features: Mapping[str, FeatureValue] | None = None,
                   deadline_ms: float | None = None, request_id: str | None = None) -> RankResult:
        """Rank one request: the first `base_count` candidates are baseline work, the rest are
        offered as optional extra candidates (RMA) within the targets, allowance and budget.

        :param segment: the request's segment (cohort, surface): SBM coverage and the learned
            gain are per segment.
        :param value: what the request is worth to the service (>= 0), sent with it: a
            worker orders optional work by it when a request carries no expected gain.
        :param candidates: the items to score, baseline ones first.
        :param base_count: how many of `candidates` are baseline work, always scored.
        :param dense: the request's dense features, passed to the model (the fixed
            signature's ``dense``).
        :param features: the inputs of a model that declares its own (``[[model.inputs]]``,
            see docs/models.md), by name: a 1-D numpy array for the request, a 2-D one with a
            row per candidate, or `workers.features.Jagged` multi-hot ids (values and offsets)
            per candidate. Per-candidate ones are cut with the candidates the call sends.
        :param deadline_ms: the time the request may take, in ms (default
            ``config.default_deadline_ms``); a powerful call may use
            ``config.powerful_deadline_share`` of it, the rest is kept for the fallback.
        :param request_id: the id its decision record and label are keyed by (default: a
            random one); pass yours to `label` it later.
        :return: the worker's response (its scores, in the order of the candidates sent), what
            the client decided, why it fell back if it did, the value if `outcome_value` gave
            one, and the latency.
        :raise RankingError: when the baseline call failed on every replica it could be
            retried on (the reason: the last failure's).
        :raise ContractError: (a ValueError) when the candidates cannot travel as msgpack:
            different numbers of sparse ids, or a value that is not a number; or a feature
            without one row per candidate. It names the candidate or the feature.
        """
        started = time.perf_counter()
        if features:
            check_feature_rows(features, len(candidates))
        base_count = min(base_count, len(candidates))
        request_id = request_id or uuid.uuid4().hex
        offered = len(candidates) - base_count
        decision = self.decider.decide(segment, offered, self._clock(), request_id)
        deadline = deadline_ms or self.config.default_deadline_ms
        request = RankRequest(request_id=request_id, segment=segment,
                              value=value, deadline_ms=deadline, dense=list(dense),
                              candidates=list(candidates[:base_count + decision.extra]),
                              base_count=base_count, gain=decision.gain)
        fell_back = None
        response: RankResponse | None = None
        if decision.model == "powerful":
            # The powerful replica is told the share of the deadline this call may use, so it
            # trims or refuses what it could not finish before the client gives up on it.
            budget_ms = powerful_wait_ms(deadline, self.config.powerful_deadline_share)
            try:
                response = await self._call(
                    "powerful", msgspec.structs.replace(request, deadline_ms=budget_ms),
                    budget_ms / 1000.0, features)
            except CallFailed as failed:
                fell_back = failed.reason
                self.decider.bump("fallback", failed.reason)
                self.decider.bump("rma_shed", "fallback", decision.extra)
        if response is None:
            response = await self._baseline(request, started, fell_back is not None, features)
        return self._finish(request, response, decision, fell_back, started, offered)

    async def _baseline(self, request: RankRequest, started: float, fallback: bool,
                        features: Mapping[str, FeatureValue] | None = None) -> RankResponse:
        """Baseline pool: the call that must succeed. After a fallback, only baseline work is
        sent, with what is left of the deadline. A replica that is gone
        (`RETRY_ON_ANOTHER_REPLICA`) costs a retry on another one; one that has not answered
        after a share of the deadline (frozen, hung) is hedged on another
        (`workers.policy.baseline_retry`), and the first answer serves the request."""
        if fallback:
            left_ms = request.deadline_ms - (time.perf_counter() - started) * 1000.0
            request = msgspec.structs.replace(
                request, candidates=request.candidates[:request.base_count],
                deadline_ms=max(left_ms, 1.0))
        retry = self._retry
        retry.request()
        begun = time.perf_counter()
        deadline_ms = request.deadline_ms
        replicas = max(1, len(self.transport.pool_urls("baseline")))
        hung_s = self.config.baseline_timeout_ms / 1000.0
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
            url = self.transport.pick("baseline", tried)
            if url is not None:
                tried.append(url)
            flights[asyncio.ensure_future(
                self._call("baseline", sent, hung_s, features, url))] = (url, now)
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
                        self.decider.bump("baseline_hedge", "slow")
                        send()
                    continue
                for task in done:
                    _, at = flights.pop(task)
                    try:
                        response = task.result()
                    except CallFailed as exc:
                        failed = exc
                        if exc.reason in RETRY_ON_ANOTHER_REPLICA and len(tried) < replicas:
                            # Scoring has no side effects: a replica that died (or is
                            # draining) with the request in flight costs a retry on the
                            # next one, not the request.
                            self.decider.bump("baseline_retry", exc.reason)
                            send()
                        continue
                    answered_ms = (time.perf_counter() - at) * 1000.0
                    for slow, slow_at in flights.values():    # a hedge won: skip the slow
                        if slow is not None:
                            self.transport.mark_down(
                                slow, retry.skip_s((at - slow_at) * 1000.0, answered_ms))
                    return response
        finally:
            for task in flights:
                task.cancel()
            if flights:
                await asyncio.gather(*flights, return_exceptions=True)
        assert failed is not None
        self.decider.bump("baseline_failed", failed.reason)
        raise RankingError(failed.reason) from None

    async def _call(self, model: Model, request: RankRequest, timeout_s: float,
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

    def _finish(self, request: RankRequest, response: RankResponse, decision: Decision,
                fell_back: str | None, started: float, offered: int) -> RankResult:
        """Count what the server shed, learn from the value, publish the outcome (``offered``:
        the extra candidates the caller had)."""
        decider = self.decider
        decider.bump("served", response.model)
        decider.settle(decision.model, decision.extra, response.optional_shed, self._clock())
        if response.optional_shed:
            decider.bump("server_shed", response.shed_reason or "unspecified",
                         response.optional_shed)
        value: float | None = None
        if self._outcome_value is not None:
            value = min(max(float(self._outcome_value(request, response)), -VALUE_BOUND),
                        VALUE_BOUND)
            decider.router.observe(request.segment, response.model, value)
        else:
            served = self._served
            if len(served) >= LABEL_MEMORY:
                del served[next(iter(served))]
            served[request.request_id] = (request.segment, response.model)
        self._publish(request, response, decision, fell_back, value, offered)
        return RankResult(response=response, decision=decision, fell_back=fell_back,
                          value=value, latency_ms=(time.perf_counter() - started) * 1000.0)

    # ---- Kafka output ------------------------------------------------------------------------

    def _publish(self, request: RankRequest, response: RankResponse, decision: Decision,
                 fell_back: str | None, value: float | None, offered: int) -> None:
        """Queue the request's decision record (`RecordQueue.decision`)."""
        if self._records is None or not self.config.publish_outcomes:
            return
        inclusion = decision_inclusion(request.request_id, self.config.decision_sample,
                                       decision.holdout)
        if inclusion is None:
            self.decider.bump("outcomes", "unsampled")
            return
        model = response.model
        propensity = logged_propensity(decision.model, decision.propensity, model)
        sampled = inclusion < 1.0
        self._records.decision(RoutingOutcome(
            v=SAMPLED_VERSION if sampled else SUPPLY_VERSION, ts_ms=self._clock(),
            scope=self.config.scope, request_id=request.request_id,
            segment=request.segment, model=model, value=value,
            explored=decision.explored and fell_back is None,
            extra=response.optional_scored if fell_back is None else 0,
            propensity=propensity, holdout=decision.holdout, available=offered,
            inclusion=inclusion if sampled else UNSET))

    def flush_decisions(self) -> None:
        """Send the decision records queued so far as one outcomes message, and the labels
        as one labels message (keyed by the scope; a lone label by its request id)."""
        if self._records is not None:
            self._records.flush()

    def label(self, request_id: str, value: float) -> None:
        """The outcome of a request served earlier (a click, a conversion, watch time): sent
        to the labels topic on the partition of this client's scope, batched as decisions are
        (a batch keyed by the scope, a lone label by its request id); the router learns from
        it while it still remembers the request.

        :param request_id: the served request's id (``result.response.request_id``).
        :param value: its outcome, clamped to +-1e6.
        """
        value = min(max(float(value), -VALUE_BOUND), VALUE_BOUND)
        served = self._served.pop(request_id, None)
        if served is not None:
            self.decider.router.observe(served[0], served[1], value)
        if self._records is None or not self.config.publish_outcomes:
            return
        rate = self.config.decision_sample
        if rate < 1.0 and decision_inclusion(
                request_id, rate, in_holdout(request_id, self.config.holdout_fraction)) is None:
            self.decider.bump("labels", "unsampled")   # its decision was never logged
            return
        self._records.label(OutcomeLabel(ts_ms=self._clock(), scope=self.config.scope,
                                         request_id=request_id, value=value))

    # ---- reporting ---------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Counters by class and reason, for the demo's summary.json."""
        now = self._clock()
        eff = self.decider.targets.current(now)
        return {
            "scope": self.config.scope,
            "decisions": {cls: dict(reasons) for cls, reasons in self.decider.counters.items()},
            "targets": dict(self.decider.targets.counters),
            "client_shed": self.decider.shed_counters(),
            "feed": {} if self._feed is None else dict(self._feed.counters),
            "feed_failed": None if self._feed is None else self._feed.failed,
            "membership": None if self.membership is None else {
                "offers": dict(self.membership.counters),
                "feed": ({} if self._membership_feed is None
                         else dict(self._membership_feed.counters)),
                "routable": {m: len(self.membership.routable(m, now))
                             for m in ("baseline", "powerful")}},
            "effective": {"epoch": eff.epoch, "baseline_only": eff.baseline_only,
                          "reason": eff.reason, "coverage": eff.coverage,
                          "extra_candidates": eff.extra_candidates},
            "allowance": {model: shedder.allowance(now)
                          for model, shedder in self.decider.shedders.items()},
        }
