"""Admission on one worker: baseline work always goes first, optional work only while it is cheap.

Two classes of work share one accelerator. Baseline work (what the service must do) has its own
FIFO queue that is never refused and always drained before any optional work, so optional work
can never delay it. Optional work (extra candidates of a request, or a whole request on an
opportunistic replica) waits in a value-ordered queue and is the only thing ever shed:

- ``overload``: the predicted wait of the queue exceeds its bound; the lowest-value optional
  work goes first until the prediction is back under it. The bound is ``max_queue_delay_ms``
  on a replica that also serves baseline work. A replica that serves whole requests as optional
  work (the powerful-model pool) runs no baseline that a queue could delay, and one of its
  requests may take longer to serve than a ranking queue may wait: there the bound is the
  deadline its requests carry (a recent average of how far ahead their deadlines lie) less the
  batcher's own wait, never less than ``max_queue_delay_ms``;
- ``deadline``: its deadline passed while it waited (work done after that is wasted);
- ``preemption``: the replica is being reclaimed; every queued optional unit goes at once,
  nothing optional is admitted until :meth:`Admission.resume`, and the answers of optional
  work that was in service when the notice came are not used (:meth:`Admission.usable`);
- ``budget``: the optional-work rate would exceed the budget the control plane gave us.

Bursts shorter than a control period are caught here, within milliseconds: admission meters
the offered load (units admitted per ms) over a recent window and a settled one. While the
baseline rate surges (recent over ``surge_ratio`` times settled), optional work yields to it:
new optional work is admitted only while the recent offered load, baseline included, stays
under the settled load the control loop has been running (``surge_load_factor``), or under
``surge_floor_share`` of the replicas' throughput; queued optional work is shed, lowest value
first, until it does (reason ``overload``). Optional work already in service runs out. The
shedding level clients see is at least 1 during a surge, so they send less optional work.

Every shed unit is counted by reason (invariant 4). Time comes in as integer milliseconds and
nothing here reads a clock, so the fake-clock tests pin each rule exactly. Not thread-safe: the
runtime wraps it in one lock.

Its parts live one a module: the config (``admission_config``), the shed order and reasons
(``shed_order``), what it hands out and reports (``admission_state``), the forward-pass fit
(``service_model``), the optional-work budget (``token_bucket``), the offered load
(``load_meter``), the surge rule (``surge``), the two queues and the order a pass takes work
from them (``work_queues``, ``optional_queue``), what of a request fits under the bound
(``fit``) and a whole-request replica's bound (``deadline_horizon``). Their public names are
importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from schemas.contract import ShedReason
from workers.policy import fit
from workers.policy.admission_config import MAX_LEVEL, AdmissionConfig, PositiveMs
from workers.policy.admission_state import AdmissionState, Admitted, shedding_level
from workers.policy.deadline_horizon import HORIZON_ALPHA, DeadlineHorizon
from workers.policy.load_meter import LoadMeter
from workers.policy.optional_queue import Queued
from workers.policy.service_model import ServiceModel
from workers.policy.shed_order import (
    REASON_BUDGET,
    REASON_DEADLINE,
    REASON_OVERLOAD,
    REASON_PREEMPTION,
    marginal_extra_value,
    shed_priority,
)
from workers.policy.shedding import Shedding
from workers.policy.surge import SurgeRule
from workers.policy.token_bucket import TokenBucket
from workers.policy.work_queues import WorkQueues

__all__ = ["HORIZON_ALPHA", "MAX_LEVEL", "REASON_BUDGET", "REASON_DEADLINE", "REASON_OVERLOAD",
           "REASON_PREEMPTION", "Admission", "AdmissionConfig", "AdmissionState", "Admitted",
           "PositiveMs", "marginal_extra_value", "shed_priority"]

T = TypeVar("T")


class Admission(Generic[T]):
    """Two queues and the rules that shed optional work; see the module docstring.

    ``on_shed(item, reason)`` is called for optional work that was *queued* and is dropped later
    (so the runtime can answer its waiter); work refused at admission is reported by the return
    value of :meth:`admit_optional` instead. Both are counted in :attr:`shed_units`.
    """

    def __init__(self, config: AdmissionConfig | None = None,
                 on_shed: Callable[[T, ShedReason], None] | None = None,
                 batch_units: int | None = None, *, whole_requests: bool = False,
                 batch_wait_ms: float = 0.0) -> None:
        """``whole_requests``: this replica serves only optional work, whole requests, so its
        queue is bounded by their deadlines (see the module docstring), less
        ``batch_wait_ms``, the time the batcher may hold a request to fill a batch, which the
        predicted wait does not count."""
        self.config = config or AdmissionConfig()
        self.whole_requests = whole_requests
        self.batch_wait_ms = batch_wait_ms
        #: How far ahead of their arrival the deadlines of recent optional work lay.
        self._horizon = DeadlineHorizon()
        self.on_shed = on_shed
        #: Largest forward pass in units (the batcher's limit), for the drain-time prediction.
        self.batch_units = batch_units
        self._queues: WorkQueues[T] = WorkQueues()
        self._optional = self._queues.optional
        self._budget = TokenBucket(self.config.budget_burst_s)
        self.service = ServiceModel(self.config.initial_ms_per_unit,
                                    self.config.service_ewma_alpha)
        self.in_flight_units = 0
        self.load = LoadMeter(self.config.surge_window_ms, self.config.settled_window_ms)
        self._surge = SurgeRule(self.config, self.load)
        self._shedding = Shedding(self._optional, self.load, self._notify)
        self.preempted = False
        #: Notices applied since start: a batch that saw this change while in service ran
        #: across a notice (:meth:`usable`).
        self.preemptions = 0
        #: Why the last refused :meth:`admit_optional` call was refused (None after a success).
        self.last_refusal: ShedReason | None = None
        #: Optional units shed, by reason (invariant 4).
        self.shed_units = self._shedding.units
        self.admitted_units = {"baseline": 0, "optional": 0}
        #: The most extras one request could have kept since :meth:`take_room` last read it.
        self._room: int | None = None

    # -- admission -------------------------------------------------------------------------------

    def admit_baseline(self, item: T, now_ms: int, units: int = 1) -> None:
        """Queue baseline work. Never refused, whatever the load or preemption state."""
        self._queues.add_baseline(item, units, now_ms)
        self.admitted_units["baseline"] += units
        self.load.advance(now_ms)
        self.load.add(units, optional=False)
        # A surge: queued optional work yields the room it would take.
        if self._optional.items and self.surging(now_ms):
            ceiling = self.surge_ceiling()
            while self._optional.items and self.load.rate(0) > ceiling:
                self._shedding.shed(self._optional.worst(), REASON_OVERLOAD)
        # Baseline work lengthens the wait of everything optional behind it.
        self._enforce_delay_bound(now_ms)

    def admit_optional(self, item: T, value: float, deadline_ms: int, now_ms: int,
                       units: int = 1) -> bool:
        """Queue optional work if every rule allows it; False (and counted) when refused."""
        if math.isnan(value):
            raise ValueError("optional work needs a comparable value, got NaN")
        self._shedding.expire(now_ms)
        reason = self.last_refusal = self._refusal(units, deadline_ms, now_ms)
        if reason is not None:
            self.count_shed(reason, units)
            return False
        entry = self._optional.push(item, value, units, deadline_ms, now_ms)
        self.admitted_units["optional"] += units
        self.load.add(units, optional=True)
        if self.whole_requests:
            self._horizon.admit(deadline_ms, now_ms)
        self._enforce_delay_bound(now_ms, newcomer=entry)
        if not entry.live:
            self.last_refusal = REASON_OVERLOAD
        return entry.live

    def _refusal(self, units: int, deadline_ms: int, now_ms: int) -> ShedReason | None:
        if self.preempted:
            return REASON_PREEMPTION
        if deadline_ms <= now_ms:
            return REASON_DEADLINE
        if self._surge.refuses(units, now_ms, self.service.per_unit_ms):
            return REASON_OVERLOAD
        if not self._budget.take(units, now_ms):
            return REASON_BUDGET
        return None

    def count_shed(self, reason: ShedReason, units: int = 1) -> None:
        """Count optional units shed for a reason decided elsewhere (e.g. stale targets)."""
        self._shedding.count(reason, units)

    def set_budget(self, units_per_s: float | None, now_ms: int,
                   floor_units: float = 0.0) -> None:
        """Optional units per second this worker may admit; None lifts the limit.
        ``floor_units``: the least the budget may bank (``ExtraAllowance.banked_units``)."""
        self._budget.set_rate(units_per_s, now_ms, floor_units)

    # -- serving ---------------------------------------------------------------------------------

    def next_batch(self, max_units: int, now_ms: int) -> list[Admitted[T]]:
        """Work for one forward pass, once what expired or no longer fits is shed: all
        baseline that fits first, then optional by value (``WorkQueues.take``)."""
        self._shedding.expire(now_ms)
        self._enforce_delay_bound(now_ms)
        batch = self._queues.take(max_units)
        self.in_flight_units += sum(work.units for work in batch)
        return batch

    def calibrate(self, passes: Iterable[tuple[int, float]]) -> None:
        """Forward passes timed before serving, as the service model's first batches
        (``ServiceModel.calibrate``)."""
        self.service.calibrate(passes)

    def record_service(self, units: int, elapsed_ms: float) -> None:
        """A batch of ``units`` finished in ``elapsed_ms``: learn the service time."""
        self.in_flight_units = max(0, self.in_flight_units - units)
        if units > 0 and elapsed_ms >= 0:
            self.service.add(units, elapsed_ms)

    # -- preemption ------------------------------------------------------------------------------

    def preempt(self, now_ms: int) -> int:
        """Drop every queued optional item at once and refuse more; returns the items dropped."""
        self.preempted = True
        self.preemptions += 1
        return self._shedding.all(REASON_PREEMPTION)

    def resume(self) -> None:
        """Admit optional work again (the control plane has re-issued targets)."""
        self.preempted = False

    def usable(self, batch: list[Admitted[T]], preemptions_at_start: int) -> list[bool]:
        """Which answers of a batch that finished may be used, given :attr:`preemptions` when
        it went into service: every one, unless a notice came while it was in service; then
        its baseline answers only (``Shedding.stopped``)."""
        if self.preemptions == preemptions_at_start:
            return [True] * len(batch)
        return self._shedding.stopped(batch)

    # -- bursts ----------------------------------------------------------------------------------

    def surging(self, now_ms: int) -> bool:
        """Whether baseline surges now (``SurgeRule.surging``)."""
        return self._surge.surging(now_ms)

    def surge_ceiling(self) -> float:
        """Offered load (units per ms) a surge may reach with optional work in it."""
        return self._surge.ceiling(self.service.per_unit_ms)

    # -- state -----------------------------------------------------------------------------------

    @property
    def delay_bound_ms(self) -> float:
        """Predicted wait above which optional work is shed (see the module docstring)."""
        if not self.whole_requests:
            return self.config.max_queue_delay_ms
        return self._horizon.bound(self.config.max_queue_delay_ms, self.batch_wait_ms)

    def predicted_delay_ms(self) -> float:
        """How long work admitted now would wait behind everything queued and in flight."""
        return self.service.drain_ms(self._queues.units + self.in_flight_units, self.batch_units)

    def optional_room(self) -> int:
        """Optional units that could fit under the delay bound now (``fit.room``)."""
        ahead = self._queues.baseline_units + self.in_flight_units
        return fit.room(self.service, ahead, self.delay_bound_ms, self.batch_units)

    def fit_optional(self, units: int) -> int:
        """How many of one request's `units` divisible optional units to queue: those that fit
        under the delay bound now (:meth:`optional_room`). The rest are counted as shed for
        ``overload`` here, so the live and the simulated worker cannot count them apart."""
        if units <= 0:
            return 0
        fits = min(units, self._note_room(self.optional_room()))
        self.count_shed(REASON_OVERLOAD, units - fits)
        return fits

    def fit_whole(self, base: int, extra: int) -> int:
        """How many of a whole request's ``extra`` candidates to serve with its ``base`` ones:
        those that keep the queue's predicted wait, this request included, under
        ``max_queue_delay_ms`` (``fit.extras_that_fit``). The rest are counted as shed for
        ``overload``; a request whose base alone does not fit is left to admission."""
        if extra <= 0:
            return 0
        ahead = self._queues.units + self.in_flight_units + base
        room = fit.extras_that_fit(self.service, ahead, fit.ROOM_SEARCH_LIMIT,
                                   self.config.max_queue_delay_ms, self.batch_units)
        kept = min(extra, self._note_room(room))
        self.count_shed(REASON_OVERLOAD, extra - kept)
        return kept

    def _note_room(self, room: int) -> int:
        if self._room is None or room > self._room:
            self._room = room
        return room

    def take_room(self) -> int | None:
        """The most extra candidates one request could have kept at its admission since the
        last call (None: no request carried extras), and start again. A target past it is
        trimmed on every request, so the control plane holds RMA's target to it, and SBM's
        cap on a powerful request's extras (``WindowReport.extras_room``)."""
        room, self._room = self._room, None
        return room

    def queue_delay_ms(self, now_ms: int) -> float:
        """The larger of the predicted wait and the age of the oldest queued baseline work."""
        return max(self.predicted_delay_ms(), float(self._queues.baseline_age_ms(now_ms)))

    def shedding_level(self, now_ms: int) -> int:
        """0 (all clear) .. 3 (send no optional work): queue delay against the bounds; at
        least 1 while baseline surges (optional work is being held back: send less)."""
        if self.preempted:
            return MAX_LEVEL
        level = shedding_level(self.queue_delay_ms(now_ms), self.delay_bound_ms,
                               self.config.level_fractions)
        if level == 0 and self.surging(now_ms):
            return 1
        return level

    def oldest_enqueued_ms(self) -> int | None:
        """When the oldest queued work arrived (the batcher's wait is measured from it)."""
        return self._queues.oldest_enqueued_ms()

    @property
    def queued_units(self) -> int:
        return self._queues.units

    @property
    def queued_items(self) -> int:
        return self._queues.items

    def state(self, now_ms: int) -> AdmissionState:
        return AdmissionState(
            queue_delay_ms=self.queue_delay_ms(now_ms),
            shedding_level=self.shedding_level(now_ms),
            preempted=self.preempted,
            baseline_items=len(self._queues.baseline),
            baseline_units=self._queues.baseline_units,
            optional_items=self._optional.items,
            optional_units=self._optional.units,
            in_flight_units=self.in_flight_units,
            ms_per_unit=self.service.per_unit_ms,
            batch_overhead_ms=self.service.overhead_ms,
            shed_units=dict(self.shed_units),
            optional_room=None if self.whole_requests else self.optional_room(),
        )

    # -- internals -------------------------------------------------------------------------------

    def _enforce_delay_bound(self, now_ms: int, newcomer: Queued[T] | None = None) -> None:
        """Shed the lowest-value optional work while the predicted wait is over the bound or
        the queue over its cap; a ``newcomer`` shed so is refused rather than dropped."""
        bound = self.delay_bound_ms
        while self._optional.items and (self.predicted_delay_ms() > bound
                                        or self._optional.items > self.config.max_optional_items):
            entry = self._optional.worst()
            if entry is newcomer:
                self._shedding.refuse(entry)
                self.admitted_units["optional"] -= entry.units
            else:
                self._shedding.shed(entry, REASON_OVERLOAD)

    def _notify(self, item: T, reason: ShedReason) -> None:
        if self.on_shed is not None:
            self.on_shed(item, reason)
