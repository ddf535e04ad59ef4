"""What admission hands out and reports: a unit of admitted work (to the batcher), the
queue's state and its shedding level (to clients on every response, and in telemetry)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Admitted(Generic[T]):
    """One unit of work handed to the batcher, with what it needs for accounting."""

    item: T
    optional: bool
    units: int
    enqueued_ms: int
    value: float = 0.0


@dataclass(frozen=True, slots=True)
class AdmissionState:
    """What the worker reports: to clients on every response, and in telemetry."""

    queue_delay_ms: float
    shedding_level: int
    preempted: bool
    baseline_items: int
    baseline_units: int
    optional_items: int
    optional_units: int
    in_flight_units: int
    ms_per_unit: float
    batch_overhead_ms: float
    shed_units: dict[str, int] = field(default_factory=dict)
    #: Optional units one request could queue now (``Admission.optional_room``); None where
    #: optional work comes in whole requests, which have no divisible room.
    optional_room: int | None = None


def shedding_level(delay_ms: float, bound_ms: float, fractions: tuple[float, float]) -> int:
    """0 (all clear) .. 3 (send no optional work): the queue delay against the delay bound,
    level 1 and 2 from ``fractions`` of it (``AdmissionConfig.level_fractions``); clients
    shed harder at higher levels."""
    if delay_ms >= bound_ms:
        return 3
    low, high = fractions
    return 2 if delay_ms >= high * bound_ms else 1 if delay_ms >= low * bound_ms else 0
