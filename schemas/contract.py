"""The event contract: every message that crosses a Surplus topic, as typed, versioned structs.

These structs are the whole agreement between workers, the scheduler, clients and the control
plane. Field names are the JSON names on the wire. Bounds live here (msgspec `Meta`) so that a
decoded value is already known to be in range; policies still clamp to their *local* limits.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from schemas.base import (
    AnswerUse,
    Event,
    Fraction,
    KeyId,
    LatencySketch,
    ModelKind,
    Name,
    NonNegFloat,
    NonNegInt,
    ReplicaState,
    Signature,
    Tier,
    TimestampMs,
)
from schemas.base import check_signed as _check_signed
from schemas.reasons import LIMIT_REASONS, SHED_REASONS, LimitReason, ShedReason
from schemas.telemetry import PoolPartial, WindowPartial, WindowReport
from schemas.versions import (  # the contract's versions, kept with their rules
    ANSWER_VERSION,
    DECISION_VERSION,
    OPERATOR_VERSION,
    POWERFUL_EXTRA_VERSION,
    PRECOMPUTE_SHARE_VERSION,
    READABLE_VERSIONS,
    REPLICA_GRANT_VERSION,
    ROOM_VERSION,
    SAMPLED_VERSION,
    SCHEMA_VERSION,
    SIGNED_VERSION,
    SUPPLY_VERSION,
)


class CapacityEvent(Event, frozen=True, kw_only=True):
    """Opportunistic units granted or revoked (capacity topic, keyed by region).

    Without ``replica`` it is a pool-wide statement (a scheduler's): a grant sets the pool's
    units and holds until ``expires_at_ms`` unless renewed by another grant of the same
    ``pool_id``; a revoke drops the whole pool, its replicas' own grants included. With
    ``replica`` (v7) it is one replica's share, announced by the capacity agent beside it: the
    grant holds under its own lease (renewed by that replica's next grant) and adds to the
    pool's other grants; its revoke drops that share alone.
    """

    event_id: Name
    ts_ms: TimestampMs
    region: Name
    pool_id: Name
    kind: Literal["grant", "revoke"]
    accelerator: Name
    accelerator_units: NonNegFloat = 0.0
    cpu_units: NonNegFloat = 0.0
    expires_at_ms: TimestampMs | None = None
    replica: Name | UnsetType = UNSET
    """v7: the replica (worker id) whose share this is; left out of the encoding when unset,
    so a pool-wide event is written exactly as before v7."""
    key_id: KeyId | UnsetType = UNSET
    """v8: the keyring entry that signed it (`schemas.signing`); unset when unsigned."""
    signature: Signature | UnsetType = UNSET
    """v8: the issuer's HMAC over the event's canonical bytes; unset when unsigned."""

    def __post_init__(self) -> None:
        _check_signed(self)
        if self.replica is not UNSET and self.v < REPLICA_GRANT_VERSION:
            raise ValueError(f"`replica` is a v{REPLICA_GRANT_VERSION} field: an event that "
                             f"names one is written as v{REPLICA_GRANT_VERSION}, so an older "
                             "reader refuses it rather than read one replica's share as the "
                             "pool's")


class PreemptionNotice(Event, frozen=True, kw_only=True):
    """Opportunistic replicas are being reclaimed by `deadline_ms` (preemption topic).

    An empty `replicas` list means the whole pool.
    """

    notice_id: Name
    ts_ms: TimestampMs
    region: Name
    pool_id: Name
    replicas: Annotated[list[Name], Meta(max_length=10_000)] = []
    deadline_ms: TimestampMs
    accelerator: Name = "any"
    accelerator_units: NonNegFloat = 0.0
    cpu_units: NonNegFloat = 0.0
    key_id: KeyId | UnsetType = UNSET
    """v8: the keyring entry that signed it (`schemas.signing`); unset when unsigned."""
    signature: Signature | UnsetType = UNSET
    """v8: the issuer's HMAC over the notice's canonical bytes; unset when unsigned."""

    def __post_init__(self) -> None:
        _check_signed(self)




class RmaTarget(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
                omit_defaults=True):
    """Rank-more-candidates: extra candidates per request, and the fleet's extra-work budget."""

    extra_candidates: Annotated[int, Meta(ge=0, le=10_000)]
    budget_units_per_s: NonNegFloat
    limited_by: LimitReason | None = None


class SegmentPriority(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Posterior of one segment's incremental gain from the powerful model."""

    gain_mean: Annotated[float, Meta(ge=-1e6, le=1e6)]
    gain_std: Annotated[float, Meta(ge=0.0, le=1e6)]
    observations: NonNegInt = 0


class SbmTarget(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
               omit_defaults=True):
    """Serve-a-better-model: share of requests for the powerful model, and segment priorities.

    ``extra_candidates`` (v5): at most this many of RMA's extra candidates ride on a request
    the powerful model serves; unset, RMA's target applies to it as to any other. Set while
    the powerful pools are over their SLA: they shed the extras before coverage.
    """

    coverage: Fraction
    segments: Annotated[dict[Name, SegmentPriority], Meta(max_length=10_000)] = {}
    limited_by: LimitReason | None = None
    extra_candidates: Annotated[int, Meta(ge=0, le=10_000)] | None = None


class PrecomputeTarget(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
                       omit_defaults=True):
    """The precompute lever (v13): the share of a lent replica's CPU its requests and its
    precompute slices together may use (``workers.policy.precompute.Pace``), within the
    replica's own ``precompute.max_share``."""

    share: Fraction
    limited_by: LimitReason | None = None


class ControlTargets(Event, frozen=True, kw_only=True):
    """What the control plane decided for one scope (targets topic, compacted, keyed by scope).

    Receivers apply a target only while `issued_at_ms + ttl_ms` is in the future and only if its
    `epoch` is newer than the one they hold; otherwise they serve baseline only.
    """

    scope: Name
    epoch: Annotated[int, Meta(ge=0)]
    issued_at_ms: TimestampMs
    ttl_ms: Annotated[int, Meta(gt=0, le=86_400_000)]
    rma: RmaTarget
    sbm: SbmTarget
    reason: Literal["period", "preemption", "restart", "manual", "operator"] = "period"
    """Why these targets were issued; ``operator`` (v3): an active override shaped them."""
    signature: Signature | None = None
    key_id: KeyId | UnsetType = UNSET
    """v8: the keyring entry that signed them; unset on unsigned targets and on those signed
    before key ids (checked against every key a receiver holds)."""
    precompute: PrecomputeTarget | UnsetType = UNSET
    """v13: the precompute lever's share; unset where no replica of the scope runs it (the
    replicas pace to their own ``precompute.max_share``)."""

    def __post_init__(self) -> None:
        _check_signed(self)
        if self.precompute is not UNSET and self.v < PRECOMPUTE_SHARE_VERSION:
            raise ValueError(f"`precompute` is a v{PRECOMPUTE_SHARE_VERSION} field: targets "
                             f"that carry it are written as v{PRECOMPUTE_SHARE_VERSION}")

    @property
    def limits(self) -> tuple[tuple[str, LimitReason | None], ...]:
        """Per lever, what keeps its target from going higher (the precompute lever's only
        where the targets set it): one reading for metrics, the simulator and the demo."""
        levers: tuple[tuple[str, LimitReason | None], ...] = (
            ("rma", self.rma.limited_by), ("sbm", self.sbm.limited_by))
        if isinstance(self.precompute, PrecomputeTarget):
            levers += (("precompute", self.precompute.limited_by),)
        return levers

    @property
    def powerful_extra_candidates(self) -> int:
        """Extra candidates a request the powerful model serves may carry: RMA's target, or
        the SBM target's lower cap on them (v5). One rule for clients, replicas and metrics."""
        cap = self.sbm.extra_candidates
        extra = self.rma.extra_candidates
        return extra if cap is None else min(cap, extra)


class OperatorOverride(Event, frozen=True, kw_only=True):
    """An operator's kill switch or caps on one scope (overrides topic, compacted, keyed by scope).

    The latest message of a scope is the whole override: a ``set`` replaces the one before, a
    ``clear`` lifts it. It applies while ``issued_at_ms + ttl_ms`` is in the future, so a
    forgotten cap lapses by itself; ``reason`` and ``ttl_ms`` have no default, so a message
    without them is refused naming the field (an override nobody can explain is not applied).
    """

    v: int = OPERATOR_VERSION
    scope: Name
    action: Literal["set", "clear"] = "set"
    issued_at_ms: TimestampMs
    ttl_ms: Annotated[int, Meta(gt=0, le=30 * 86_400_000)]
    reason: Annotated[str, Meta(min_length=1, max_length=500)]
    by: Name | None = None
    kill: bool = False
    """Baseline only: no extra candidates, no coverage. Published at once (the fast path)."""
    freeze: bool = False
    """Hold the targets last issued (a preemption still lowers them)."""
    max_extra: Annotated[int, Meta(ge=0, le=10_000)] | None = None
    max_coverage: Fraction | None = None
    key_id: KeyId | UnsetType = UNSET
    """v8: the keyring entry that signed it (`schemas.signing`); unset when unsigned."""
    signature: Signature | UnsetType = UNSET
    """v8: the operator's HMAC over the override's canonical bytes; unset when unsigned."""

    def __post_init__(self) -> None:
        _check_signed(self)
        if not self.reason.strip():
            raise ValueError("`reason` is blank: say why optional work is overridden")
        if self.action == "set" and not (self.kill or self.freeze or self.max_extra is not None
                                         or self.max_coverage is not None):
            raise ValueError("a set override needs one of `kill`, `freeze`, `max_extra`, "
                             "`max_coverage`")


class RoutingOutcome(Event, frozen=True, kw_only=True):
    """A decision record: what a client did for one served request (outcomes topic, keyed by
    scope; a client sends them in batches, a JSON array per message).

    v4 made it the decision half of a join: the lever choices (``extra`` candidates sent,
    ``model``), the probability with which the router chose that model (``propensity``),
    whether that was exploration and whether the request was in the randomized holdout (no
    optional work). ``value`` is set only when the client knew the outcome at response time;
    otherwise the outcome arrives later as an `OutcomeLabel` with the same ``request_id``.
    A v1-v3 message (value always set) is a valid v4 one; v6 added ``available``, v9
    ``inclusion`` (a client that logs a sample of its decisions).
    """

    v: int = DECISION_VERSION
    ts_ms: TimestampMs
    scope: Name
    request_id: Name
    segment: Name
    model: ModelKind
    value: Annotated[float, Meta(ge=-1e6, le=1e6)] | None = None
    explored: bool = False
    extra: Annotated[int, Meta(ge=0, le=10_000)] = 0
    """Extra candidates scored for the request (RMA): the replica's ``optional_scored``, not
    those sent, so what a request's value is compared against is the work it got (clients
    before 2026-12 logged those sent: the same figure unless a replica shed some)."""
    propensity: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    """P(the router picks ``model``) for this request: the logged propensity."""
    holdout: bool = False
    """In the randomized holdout (request-id hash): no optional work, whatever the targets."""
    available: Annotated[int, Meta(ge=0, le=100_000)] | None = None
    """v6: extra candidates the caller had beyond its base, of which ``extra`` were sent: the
    most an RMA target can use on this request (None: a client before the field)."""
    inclusion: Annotated[float, Meta(gt=0.0, le=1.0)] | UnsetType = UNSET
    """v9: the probability that this record was logged at all (the client's
    ``decision_sample``, by request-id hash, `workers.policy.sampling`); unset: 1, every
    decision logged. The estimators weigh the record by its inverse (Horvitz-Thompson). A
    holdout record is always logged, so it never carries one below 1."""
    answer: AnswerUse | UnsetType = UNSET
    """v12: the request held a fresh precompute answer and ``used`` it, or it was
    ``withheld`` by the answer holdout (ranked live as if there were none); unset: it held
    none (or is in the holdout). Used against withheld, segment by segment, is the precompute
    lever's measured lift."""

    def __post_init__(self) -> None:
        if self.answer is not UNSET and self.v < ANSWER_VERSION:
            raise ValueError(f"`answer` is a v{ANSWER_VERSION} field: a decision record that "
                             f"says what became of an answer is written as v{ANSWER_VERSION}")
        if self.inclusion is not UNSET:
            if self.v < SAMPLED_VERSION:
                raise ValueError(f"`inclusion` is a v{SAMPLED_VERSION} field: a sampled "
                                 f"decision record is written as v{SAMPLED_VERSION}")
            if self.holdout and self.inclusion < 1.0:
                raise ValueError("a holdout decision is always logged: its `inclusion` is 1")

    @property
    def sample_weight(self) -> float:
        """1/inclusion: how many served requests this logged record stands for."""
        return 1.0 if self.inclusion is UNSET else 1.0 / self.inclusion


class OutcomeLabel(Event, frozen=True, kw_only=True):
    """The outcome of one request (click, conversion, watch time), arriving late, out of order
    or never (labels topic, keyed by ``request_id``, written to the partition of its scope:
    `schemas.topics.scope_partition`, so it meets its decision in the same process)."""

    v: int = DECISION_VERSION
    ts_ms: TimestampMs
    """When the outcome was observed (the labeller's clock)."""
    scope: Name
    request_id: Name
    value: Annotated[float, Meta(ge=-1e6, le=1e6)]


class LiftEstimate(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
                   omit_defaults=True):
    """A measured lift (value per treated request) with its interval; unset: not enough
    labels yet."""

    measured: Annotated[float, Meta(ge=-1e9, le=1e9)] | None = None
    ci_low: Annotated[float, Meta(ge=-1e9, le=1e9)] | None = None
    ci_high: Annotated[float, Meta(ge=-1e9, le=1e9)] | None = None


class LiftReport(Event, frozen=True, kw_only=True):
    """What optional work measurably paid in one scope, as of one control period (estimates
    topic, compacted, keyed by scope; the control plane's output, like the targets).

    ``lift`` per lever (``all``, ``sbm``, ``rma``, ``rma_per_extra``): treated requests'
    mean value minus the holdout's; ``join``: the attribution join's counts by reason."""

    v: int = DECISION_VERSION
    scope: Name
    ts_ms: TimestampMs
    epoch: Annotated[int, Meta(ge=0)]
    """The epoch of the targets issued with it."""
    lift: Annotated[dict[Name, LiftEstimate], Meta(max_length=16)] = {}
    join: Annotated[dict[Name, NonNegInt], Meta(max_length=32)] = {}
    treated: NonNegInt = 0
    holdout: NonNegInt = 0
    curves_learned: bool = False


class DeadLetter(Event, frozen=True, kw_only=True):
    """A message nobody could use, kept with why and where it came from (deadletter topic)."""

    ts_ms: TimestampMs
    source_topic: Name
    partition: Annotated[int, Meta(ge=-1)]
    offset: Annotated[int, Meta(ge=-1)]
    reason: Annotated[str, Meta(max_length=2000)]
    key_b64: str | None = None
    value_b64: str


class ReplicaAnnouncement(Event, frozen=True, kw_only=True):
    """One replica's membership (replicas topic, compacted, keyed by ``replica_id``).

    Clients route to the replicas whose latest announcement says ``serving`` and whose lease
    has not run out. A replica renews well inside its lease while it runs, says ``draining``
    the moment a reclaim reaches it (a notice for it, or SIGTERM), and leaves a tombstone (a
    null value under its id) when it stops; one killed outright simply stops renewing, and
    its lease ends it. ``ts_ms`` and ``lease_expires_at_ms`` are on the replica's own clock:
    receivers read them through an estimated offset, as they read the targets' TTL.
    """

    replica_id: Name
    endpoint: Annotated[str, Meta(pattern=r"^https?://", max_length=500)]
    """Base URL clients call (``/v1/rank`` is appended)."""
    region: Name
    pool_id: Name
    tier: Tier
    model: ModelKind
    state: ReplicaState
    ts_ms: TimestampMs
    """When this announcement was sent, on the replica's clock."""
    lease_expires_at_ms: TimestampMs
    """Past this (the replica's clock), the replica counts as gone unless it renewed."""
    deadline_ms: TimestampMs | None = None
    """Draining: when the replica goes (its notice's deadline, or the end of its grace)."""

    def __post_init__(self) -> None:
        if self.lease_expires_at_ms <= self.ts_ms:
            raise ValueError("`lease_expires_at_ms` must be after `ts_ms`: a lease that has "
                             "run out when it is sent admits nothing")


#: The control loop's types (every type on the wire: `schemas.events.EVENT_TYPES`).
CONTROL_TYPES: tuple[type[Event], ...] = (
    WindowReport, CapacityEvent, PreemptionNotice, ControlTargets, RoutingOutcome, DeadLetter,
    OperatorOverride, ReplicaAnnouncement, OutcomeLabel, LiftReport, WindowPartial,
)

__all__ = [
    "ANSWER_VERSION", "CONTROL_TYPES", "DECISION_VERSION", "LIMIT_REASONS", "OPERATOR_VERSION",
    "POWERFUL_EXTRA_VERSION", "PRECOMPUTE_SHARE_VERSION", "READABLE_VERSIONS",
    "REPLICA_GRANT_VERSION", "ROOM_VERSION",
    "SAMPLED_VERSION", "SCHEMA_VERSION", "SHED_REASONS", "SIGNED_VERSION", "SUPPLY_VERSION",
    "AnswerUse", "CapacityEvent", "ControlTargets",
    "DeadLetter", "Event", "KeyId", "LatencySketch", "LiftEstimate", "LiftReport",
    "LimitReason", "ModelKind", "OperatorOverride", "OutcomeLabel", "PoolPartial",
    "PrecomputeTarget", "PreemptionNotice", "ReplicaAnnouncement", "ReplicaState", "RmaTarget",
    "RoutingOutcome",
    "SbmTarget",
    "SegmentPriority", "ShedReason", "Tier", "WindowPartial", "WindowReport", "msgspec",
]
