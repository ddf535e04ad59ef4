"""What workers report about their load (the telemetry topic), and what a first-stage shard
of a scaled-out control plane sums of it (its partials topic); `schemas.contract` re-exports
them."""

from __future__ import annotations

from typing import Annotated

from msgspec import UNSET, Meta, Struct, UnsetType

from schemas.base import (
    Event,
    LatencySketch,
    ModelKind,
    Name,
    NonNegFloat,
    NonNegInt,
    Tier,
    TimestampMs,
)
from schemas.versions import PRECOMPUTE_SHARE_VERSION, ROOM_VERSION


class WindowReport(Event, frozen=True, kw_only=True):
    """What one worker saw in one reporting interval (telemetry topic, keyed by pool id)."""

    pool_id: Name
    worker_id: Name
    region: Name
    service: Name
    model: ModelKind
    tier: Tier
    accelerator: Name
    window_start_ms: TimestampMs
    window_end_ms: TimestampMs
    requests: NonNegInt
    baseline_requests: NonNegInt
    baseline_rejected: NonNegInt = 0
    optional_units_done: NonNegInt = 0
    optional_units_shed: dict[Name, NonNegInt] = {}
    latency_ms: LatencySketch
    queue_depth: NonNegInt = 0
    queue_delay_ms: NonNegFloat = 0.0
    utilisation: Annotated[float, Meta(ge=0.0, le=10.0)] = 0.0
    capacity_rps: NonNegFloat = 0.0
    busy_s: Annotated[float, Meta(ge=0.0, le=86_400.0)] = 0.0
    """Seconds the replica's model was busy (forward passes) in the window: the measured cost."""
    units_done: NonNegInt = 0
    """Units (candidates) scored in the window, baseline and optional: what ``busy_s`` paid for."""
    optional_requests_done: NonNegInt = 0
    """Requests with optional work done (RMA extras, or whole SBM requests on ``powerful``)."""
    extras_room: NonNegInt | UnsetType = UNSET
    """v10: the most extra candidates one request could have kept at its admission in the
    window (what fitted under the queue bound then, whatever it asked for; a whole request's
    beyond its base). A target past it is trimmed on every request. Unset: no request
    carried extras to measure it on."""
    precompute_utilisation: Annotated[float, Meta(ge=0.0, le=10.0)] | UnsetType = UNSET
    """v13: the share of its CPU quota (one core without one) over the window the replica
    spent scoring precompute jobs: the lever's slices, which ``utilisation`` and ``busy_s``
    leave out; the share the control plane sets is of the same quota. Unset: it does not
    run the lever."""

    def __post_init__(self) -> None:
        if self.extras_room is not UNSET and self.v < ROOM_VERSION:
            raise ValueError(f"`extras_room` is a v{ROOM_VERSION} field: a report that "
                             f"carries it is written as v{ROOM_VERSION}")
        if self.precompute_utilisation is not UNSET and self.v < PRECOMPUTE_SHARE_VERSION:
            raise ValueError(f"`precompute_utilisation` is a v{PRECOMPUTE_SHARE_VERSION} "
                             f"field: a report that carries it is written as "
                             f"v{PRECOMPUTE_SHARE_VERSION}")


class PoolPartial(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What one shard's replicas of one pool reported over one control period, summed.

    Everything a latency window holds, in a form that merges by addition (the sketch's bins,
    the counts, the busy seconds, the utilisation's sum over reports) or by max/min (the room,
    the span), so the second stage gets the same window from any number of shards."""

    pool_id: Name
    model: ModelKind
    tier: Tier
    accelerator: Name
    reports: Annotated[int, Meta(ge=1)]
    requests: NonNegInt
    baseline_requests: NonNegInt
    optional_units_done: NonNegInt = 0
    optional_units_shed: NonNegInt = 0
    """All reasons together."""
    overload_shed: NonNegInt = 0
    utilisation_sum: NonNegFloat = 0.0
    """The sum of the reports' utilisation (the window's is its mean over every report)."""
    capacity_rps: NonNegFloat = 0.0
    """The sum over the shard's replicas of each one's latest reported capacity."""
    busy_s: NonNegFloat = 0.0
    units_done: NonNegInt = 0
    optional_requests_done: NonNegInt = 0
    extras_room: NonNegInt | None = None
    precompute_utilisation_sum: NonNegFloat = 0.0
    """The sum of the reports' ``precompute_utilisation`` (as ``utilisation_sum``)."""
    first_start_ms: TimestampMs
    last_end_ms: TimestampMs
    latency_ms: LatencySketch


class WindowPartial(Event, frozen=True, kw_only=True):
    """One first-stage shard's part of a scope's control period (the control plane's own
    partials topic, keyed by scope): its pools' sums, or none at all, which still tells the
    second stage this shard has nothing more for the period (``streams.control.shards``)."""

    region: Name
    shard: Name
    """The first stage's input partition: whichever process owns it speaks for it."""
    period_end_ms: TimestampMs
    """The control period these reports belong to ends here (a multiple of the period)."""
    pools: Annotated[list[PoolPartial], Meta(max_length=10_000)] = []
