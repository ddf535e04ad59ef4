"""What admission hands out and reports: a unit of admitted work (to the batcher) and the
queue's state (to clients on every response, and in telemetry)."""

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
