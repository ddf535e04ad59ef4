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

Its parts are modules of their own: the calls to the pools (`pool_calls.py`), the baseline one
retried and hedged (`baseline_call.py`), what a request comes to (`result.py`), its decision
record and label sampling (`decision_log.py`), the requests a label can still teach the router
about (`served.py`), the Kafka side (`kafka_side.py`) and the summary (`summary.py`). Their
public names are importable from here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from schemas.clock import wall_ms
from schemas.contract import AnswerUse, ControlTargets, OutcomeLabel, ReplicaAnnouncement
from schemas.kafka_config import KafkaSettings
from schemas.signing import REFUSALS, Keyring, KeySource
from workers.api import Candidate, RankRequest, RankResponse
from workers.client.config import ClientConfig
from workers.client.decision import Decider, Decision
from workers.client.decision_log import decision_record, label_logged
from workers.client.feed import MembershipFeed, Refuse, TargetsFeed
from workers.client.kafka_side import KafkaSide
from workers.client.pool_calls import PoolCalls
from workers.client.precompute import PrecomputeSide
from workers.client.records import RecordQueue
from workers.client.result import (
    VALUE_BOUND,
    OutcomeValue,
    RankingError,
    RankResult,
    bounded_value,
    top_score_value,
)
from workers.client.served import LABEL_MEMORY, ServedRequests
from workers.client.summary import client_summary
from workers.client.transport import Transport
from workers.policy.membership import Membership
from workers.policy.routing import Model
from workers.policy.sampling import decision_inclusion
from workers.wire import FeatureValue, check_feature_rows

__all__ = ["LABEL_MEMORY", "VALUE_BOUND", "MembershipFeed", "OutcomeValue", "RankResult",
           "RankingClient", "RankingError", "TargetsFeed", "top_score_value"]


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
        if config.membership:
            self.membership = Membership(config.scope, config.membership_limits)
        pools: dict[Model, tuple[str, ...]] = {
            "baseline": tuple(config.baseline_urls),
            "powerful": tuple(config.powerful_urls or ([] if config.membership
                                                       else config.baseline_urls))}
        self.transport = Transport(pools, encoding=config.encoding,
                                   replica_down_s=config.replica_down_s,
                                   membership=self.membership, clock=clock)
        self._calls = PoolCalls(config, self.transport, self.decider, clock)
        #: The feeds and the record queue (None: no Kafka, or not started).
        self._kafka: KafkaSide | None = None
        #: Decision records and labels on their way to Kafka (None: no Kafka, or not started).
        self._records: RecordQueue | None = None
        self._served = ServedRequests()
        #: The precompute lever's jobs and answers (``config.precompute``, with Kafka, started).
        self.precompute: PrecomputeSide | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the HTTP pool, the outcome producer and the targets feed; wait (bounded by
        ``config.catch_up_timeout_s``) until the feed has read the targets topic to its end, so
        the first requests use targets. Without Kafka only the HTTP pool opens."""
        self.transport.open(self.config.max_connections)
        if self.kafka is None:
            return  # targets and membership, if any, come through apply_targets/_membership
        side = self._kafka = KafkaSide(self.config, self.kafka, self.decider.bump)
        self._records = side.open_records()
        if self.config.precompute:
            self.precompute = PrecomputeSide(self.config.scope, self.kafka,
                                             self._records.producer, self._clock,
                                             self._records.dead_letter,
                                             self.config.holdout_fraction,
                                             self.config.answer_holdout_fraction)
            self.precompute.start()
        await side.follow(self.apply_targets,
                          None if self.membership is None else self.apply_membership)

    async def close(self) -> None:
        """Stop the feeds, close the HTTP pool, and send the decision records and labels still
        queued (waiting up to 5 s for the broker; what it did not take is counted)."""
        if self._kafka is not None:
            await self._kafka.stop()
        if self.precompute is not None:
            await self.precompute.stop()
        await self.transport.close()
        if self._records is not None:
            await self._records.close()

    async def __aenter__(self) -> RankingClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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
                              base_count=base_count, gain=decision.gain, report_room=True)
        fell_back = None
        if decision.model == "powerful":
            response, fell_back = await self._calls.powerful(request, started, deadline,
                                                             decision.extra, features)
        else:
            response = await self._calls.baseline(request, started, False, features)
        return self._finish(request, response, decision, fell_back, started, offered)

    def _finish(self, request: RankRequest, response: RankResponse, decision: Decision,
                fell_back: str | None, started: float, offered: int) -> RankResult:
        """Count what the server shed, learn from the value, publish the outcome (``offered``:
        the extra candidates the caller had)."""
        decider = self.decider
        decider.bump("served", response.model)
        if response.optional_shed:
            decider.bump("server_shed", response.shed_reason or "unspecified",
                         response.optional_shed)
        value: float | None = None
        if self._outcome_value is not None:
            value = bounded_value(self._outcome_value(request, response))
            decider.router.observe(request.segment, response.model, value)
        else:
            self._served.remember(request.request_id, request.segment, response.model)
        answer = (None if self.precompute is None
                  else self.precompute.take(request.request_id))
        self._publish(request, response, decision, fell_back, value, offered, answer)
        return RankResult(response=response, decision=decision, fell_back=fell_back,
                          value=value, latency_ms=(time.perf_counter() - started) * 1000.0,
                          answer=answer)

    # ---- Kafka output ------------------------------------------------------------------------

    def _publish(self, request: RankRequest, response: RankResponse, decision: Decision,
                 fell_back: str | None, value: float | None, offered: int,
                 answer: AnswerUse | None) -> None:
        """Queue the request's decision record (`decision_log`), if it is sampled."""
        if self._records is None or not self.config.publish_outcomes:
            return
        inclusion = decision_inclusion(request.request_id, self.config.decision_sample,
                                       decision.holdout)
        if inclusion is None:
            self.decider.bump("outcomes", "unsampled")
            return
        self._records.decision(decision_record(self.config, request, response, decision,
                                               fell_back, value, offered, inclusion,
                                               self._clock(), answer))

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
        value = bounded_value(value)
        served = self._served.pop(request_id)
        if served is not None:
            self.decider.router.observe(served[0], served[1], value)
        if self._records is None or not self.config.publish_outcomes:
            return
        if not label_logged(self.config, request_id):
            self.decider.bump("labels", "unsampled")   # its decision was never logged
            return
        self._records.label(OutcomeLabel(ts_ms=self._clock(), scope=self.config.scope,
                                         request_id=request_id, value=value))

    # ---- reporting ---------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Counters by class and reason, for the demo's summary.json (`client_summary`)."""
        side = self._kafka
        out = client_summary(self.config, self.decider, self._clock(),
                             feed=None if side is None else side.feed,
                             membership=self.membership,
                             membership_feed=None if side is None else side.membership_feed)
        if self.precompute is not None:
            out["precompute"] = self.precompute.summary()
        return out
