"""The bounds of one worker's admission (``workers.policy.admission``), as its TOML
``[admission]`` table gives them: validated at construction, unknown keys refused."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

#: The highest shedding level: the queue-delay bound itself, or preemption.
MAX_LEVEL = 3

PositiveMs = Annotated[float, Meta(gt=0.0, le=60_000.0)]


class AdmissionConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Bounds of one worker's admission; decoded from the worker's TOML ``[admission]`` table."""

    #: Predicted wait above which optional work is shed, lowest value first.
    max_queue_delay_ms: PositiveMs = 25.0
    #: Queue delay, as fractions of the bound, at which the shedding level reaches 1 and 2
    #: (level 3 is the bound itself, or preemption). Clients shed harder at higher levels.
    level_fractions: tuple[Annotated[float, Meta(gt=0.0, lt=1.0)],
                           Annotated[float, Meta(gt=0.0, lt=1.0)]] = (0.25, 0.5)
    #: Hard cap on queued optional items (memory bound); beyond it the lowest value goes.
    max_optional_items: Annotated[int, Meta(ge=1, le=1_000_000)] = 4096
    #: Service time per unit (row) assumed before the first batch is measured.
    initial_ms_per_unit: Annotated[float, Meta(gt=0.0, le=10_000.0)] = 0.05
    #: Weight of the newest batch in the fit of service time (overhead + per-unit cost).
    service_ewma_alpha: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.05
    #: The optional-work budget may be spent this many seconds ahead (token bucket depth).
    budget_burst_s: Annotated[float, Meta(gt=0.0, le=60.0)] = 1.0
    #: Time constants of the recent and of the settled offered load (exponential windows).
    surge_window_ms: PositiveMs = 100.0
    settled_window_ms: PositiveMs = 30_000.0
    #: Baseline surges while its recent rate is over this multiple of its settled rate ...
    surge_ratio: Annotated[float, Meta(gt=1.0)] = 3.0
    #: ... and at least this many baseline items arrived in the recent window (fewer are
    #: chance, not a burst: at a few requests per second the recent window sees 0, 1 or 2).
    surge_min_items: Annotated[float, Meta(ge=0.0)] = 8.0
    #: During a surge, optional work may bring the recent offered load up to this multiple of
    #: the settled offered load ...
    surge_load_factor: Annotated[float, Meta(gt=0.0)] = 1.0
    #: ... or up to this share of the replicas' throughput, whichever is more.
    surge_floor_share: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5

    def __post_init__(self) -> None:
        low, high = self.level_fractions
        if low >= high:
            raise ValueError(f"level_fractions must increase, got {list(self.level_fractions)}")
        if self.surge_window_ms >= self.settled_window_ms:
            raise ValueError("surge_window_ms must be shorter than settled_window_ms")
