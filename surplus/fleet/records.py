"""What the fleet's ranking load saw: one record a request and one a targets message offered
to its client. The load runner (`surplus.fleet.load`) keeps them in memory, the fault tests
judge windows of them, and `surplus chaos` writes them into its history as they are
(`surplus.chaos.history`, the tags ``request`` and ``target``), its times shifted to the
schedule's clock.

Pure: typed records only.
"""

from __future__ import annotations

import msgspec


class Request(msgspec.Struct, frozen=True, tag="request"):
    """One ranking request, as the client saw it, with the targets it was decided under
    (times in seconds on the load's monotonic clock)."""

    t: float
    #: When the answer (or the failure) came.
    end_t: float
    request_id: str
    served: bool
    latency_ms: float
    error: str | None = None
    model: str = "baseline"
    routed: str = "baseline"
    fell_back: str | None = None
    #: Extra candidates the client decided to send (RMA) and those a replica scored, and
    #: those it shed, with why.
    extra: int = 0
    optional_scored: int = 0
    optional_shed: int = 0
    shed_reason: str | None = None
    #: The wall clock when the client decided.
    wall_ms: int = 0
    #: The targets the client held then (-1: none), when they were issued (the control
    #: plane's clock) and their TTL; whether the effective targets said baseline only.
    epoch: int = -1
    issued_at_ms: int = 0
    ttl_ms: int = 0
    baseline_only: bool = True


class TargetOffer(msgspec.Struct, frozen=True, tag="target"):
    """A targets message offered to the client (from Kafka) and its verdict."""

    t: float
    wall_ms: int
    epoch: int
    issued_at_ms: int
    ttl_ms: int
    accepted: bool
    reason: str
