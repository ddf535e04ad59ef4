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
(``service_model``), the optional-work budget (``token_bucket``) and the offered load
(``load_meter``). Their public names are importable from here too.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from schemas.contract import ShedReason
from workers.policy.admission_config import MAX_LEVEL, AdmissionConfig, PositiveMs
from workers.policy.admission_state import AdmissionState, Admitted
from workers.policy.load_meter import LoadMeter
from workers.policy.service_model import ServiceModel
from workers.policy.shed_order import (
    REASON_BUDGET,
    REASON_DEADLINE,
    REASON_OVERLOAD,
    REASON_PREEMPTION,
    marginal_extra_value,
    shed_priority,
)
from workers.policy.token_bucket import TokenBucket

__all__ = ["MAX_LEVEL", "REASON_BUDGET", "REASON_DEADLINE", "REASON_OVERLOAD",
           "REASON_PREEMPTION", "Admission", "AdmissionConfig", "AdmissionState", "Admitted",
           "PositiveMs", "marginal_extra_value", "shed_priority"]

T = TypeVar("T")

#: Weight of the newest request in the deadline horizon of a whole-request replica.
HORIZON_ALPHA = 0.05


@dataclass(slots=True)
class _Entry(Generic[T]):
    seq: int
    item: T
    value: float
    units: int
    deadline_ms: int
    enqueued_ms: int
    live: bool = True


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
        #: How far ahead of their arrival the deadlines of recent optional work lay (EWMA).
        self._horizon_ms = 0.0
        self.on_shed = on_shed
        #: Largest forward pass in units (the batcher's limit), for the drain-time prediction.
        self.batch_units = batch_units
        self._baseline: deque[Admitted[T]] = deque()
        self._baseline_units = 0
        self._by_value: list[tuple[Any, int, _Entry[T]]] = []      # max-heap: serve best
        self._by_low_value: list[tuple[Any, int, _Entry[T]]] = []  # min-heap: shed worst
        self._by_deadline: list[tuple[Any, int, _Entry[T]]] = []     # min-heap: expire first
        self._arrivals: deque[_Entry[T]] = deque()                   # arrival order: oldest
        self._optional_items = 0
        self._optional_units = 0
        self._seq = itertools.count()
        self._budget = TokenBucket(self.config.budget_burst_s)
        self.service = ServiceModel(self.config.initial_ms_per_unit,
                                    self.config.service_ewma_alpha)
        self.in_flight_units = 0
        self.load = LoadMeter(self.config.surge_window_ms, self.config.settled_window_ms)
        self.preempted = False
        #: Notices applied since start: a batch that saw this change while in service ran
        #: across a notice (:meth:`usable`).
        self.preemptions = 0
        #: Why the last refused :meth:`admit_optional` call was refused (None after a success).
        self.last_refusal: ShedReason | None = None
        self.shed_units: dict[str, int] = {}
        self.admitted_units = {"baseline": 0, "optional": 0}

    # -- admission -------------------------------------------------------------------------------

    def admit_baseline(self, item: T, now_ms: int, units: int = 1) -> None:
        """Queue baseline work. Never refused, whatever the load or preemption state."""
        self._baseline.append(Admitted(item, False, units, now_ms))
        self._baseline_units += units
        self.admitted_units["baseline"] += units
        self.load.advance(now_ms)
        self.load.add(units, optional=False)
        # A surge: queued optional work yields the room it would take.
        if self._optional_items and self.surging(now_ms):
            ceiling = self.surge_ceiling()
            while self._optional_items and self.load.rate(0) > ceiling:
                self._shed(self._peek(self._by_low_value), REASON_OVERLOAD)
        # Baseline work lengthens the wait of everything optional behind it.
        self._enforce_delay_bound(now_ms)

    def admit_optional(self, item: T, value: float, deadline_ms: int, now_ms: int,
                       units: int = 1) -> bool:
        """Queue optional work if every rule allows it; False (and counted) when refused."""
        if math.isnan(value):
            raise ValueError("optional work needs a comparable value, got NaN")
        self._expire(now_ms)
        reason = self.last_refusal = self._refusal(units, deadline_ms, now_ms)
        if reason is not None:
            self.count_shed(reason, units)
            return False
        entry = _Entry(next(self._seq), item, value, units, deadline_ms, now_ms)
        heapq.heappush(self._by_value, (-value, entry.seq, entry))
        heapq.heappush(self._by_low_value, (value, -entry.seq, entry))
        heapq.heappush(self._by_deadline, (deadline_ms, entry.seq, entry))
        self._arrivals.append(entry)
        self._optional_items += 1
        self._optional_units += units
        self.admitted_units["optional"] += units
        self.load.add(units, optional=True)
        if self.whole_requests:
            self._horizon_ms = self._next_horizon(deadline_ms, now_ms)
        self._enforce_delay_bound(now_ms, newcomer=entry)
        if not entry.live:
            self.last_refusal = REASON_OVERLOAD
        return entry.live

    def _refusal(self, units: int, deadline_ms: int, now_ms: int) -> ShedReason | None:
        if self.preempted:
            return REASON_PREEMPTION
        if deadline_ms <= now_ms:
            return REASON_DEADLINE
        if self.surging(now_ms) and (self.load.rate(0) + units / max(self.load.norm[0], 1.0)
                                     > self.surge_ceiling()):
            return REASON_OVERLOAD
        if not self._budget.take(units, now_ms):
            return REASON_BUDGET
        return None

    def count_shed(self, reason: ShedReason, units: int = 1) -> None:
        """Count optional units shed for a reason decided elsewhere (e.g. stale targets)."""
        if units > 0:
            self.shed_units[reason] = self.shed_units.get(reason, 0) + units

    def set_budget(self, units_per_s: float | None, now_ms: int) -> None:
        """Optional units per second this worker may admit; None lifts the limit."""
        self._budget.set_rate(units_per_s, now_ms)

    # -- serving ---------------------------------------------------------------------------------

    def next_batch(self, max_units: int, now_ms: int) -> list[Admitted[T]]:
        """Work for one forward pass: all baseline that fits first, then optional by value.

        The first item is always taken even if it alone exceeds ``max_units``, so large
        requests are never starved; after that, taking stops at the first item that does not
        fit (skipping it would let small low-value work overtake large high-value work).
        """
        self._expire(now_ms)
        self._enforce_delay_bound(now_ms)
        batch: list[Admitted[T]] = []
        used = 0
        while self._baseline and (not batch or used + self._baseline[0].units <= max_units):
            work = self._baseline.popleft()
            self._baseline_units -= work.units
            batch.append(work)
            used += work.units
        while self._optional_items and not self._baseline:
            entry = self._peek(self._by_value)
            if batch and used + entry.units > max_units:
                break
            self._remove(entry)
            batch.append(Admitted(entry.item, True, entry.units, entry.enqueued_ms, entry.value))
            used += entry.units
        self.in_flight_units += used
        return batch

    def calibrate(self, passes: Iterable[tuple[int, float]]) -> None:
        """Forward passes timed before serving (the model's warm-up, on the replica's own
        device and CPU slice) as the service model's first batches. Until the first batch is
        measured, admission otherwise predicts with ``initial_ms_per_unit``, a prior that a
        lent replica in a small slice can exceed tenfold: its first requests were admitted as
        fitting and ended at 150-190 ms of a 100 ms deadline."""
        for units, elapsed_ms in passes:
            if units > 0 and elapsed_ms >= 0:
                self.service.add(units, elapsed_ms)

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
        dropped = 0
        while self._optional_items:
            self._shed(self._peek(self._by_value), REASON_PREEMPTION)
            dropped += 1
        return dropped

    def resume(self) -> None:
        """Admit optional work again (the control plane has re-issued targets)."""
        self.preempted = False

    def usable(self, batch: list[Admitted[T]], preemptions_at_start: int) -> list[bool]:
        """Which answers of a batch that finished may be used, given :attr:`preemptions` when
        it went into service: every one, unless a notice came while it was in service; then
        its baseline answers only, and each optional item's units are counted as shed for
        ``preemption``.

        A notice means the capacity is going: optional work in service when it came is as
        stopped as the queued work :meth:`preempt` dropped, whether its answer comes back
        a microsecond or a remote model server's round trip later, so what the clients see
        does not depend on how long the backend took. Baseline answers are always used.
        """
        if self.preemptions == preemptions_at_start:
            return [True] * len(batch)
        for work in batch:
            if work.optional:
                self.count_shed(REASON_PREEMPTION, work.units)
        return [not work.optional for work in batch]

    # -- bursts ----------------------------------------------------------------------------------

    def surging(self, now_ms: int) -> bool:
        """Whether the baseline rate of the recent window is over ``surge_ratio`` times the
        settled one (a burst the control loop has not seen yet)."""
        load = self.load
        load.advance(now_ms)
        cfg = self.config
        return load.recent_items >= cfg.surge_min_items and load.rate(
            0, optional=False) > cfg.surge_ratio * load.rate(1, optional=False)

    def surge_ceiling(self) -> float:
        """Offered load (units per ms) a surge may reach with optional work in it."""
        cfg = self.config
        floor = cfg.surge_floor_share / max(self.service.per_unit_ms, 1e-12)
        return max(cfg.surge_load_factor * self.load.rate(1), floor)

    # -- state -----------------------------------------------------------------------------------

    @property
    def delay_bound_ms(self) -> float:
        """Predicted wait above which optional work is shed (see the module docstring)."""
        if not self.whole_requests:
            return self.config.max_queue_delay_ms
        return self._whole_bound(self._horizon_ms)

    def _whole_bound(self, horizon_ms: float) -> float:
        return max(self.config.max_queue_delay_ms, horizon_ms - self.batch_wait_ms)

    def _next_horizon(self, deadline_ms: int, now_ms: int) -> float:
        """The deadline horizon once a whole request due at ``deadline_ms`` is admitted."""
        horizon = float(deadline_ms - now_ms)
        if not self._horizon_ms:
            return horizon
        return self._horizon_ms + HORIZON_ALPHA * (horizon - self._horizon_ms)

    def predicted_delay_ms(self) -> float:
        """How long work admitted now would wait behind everything queued and in flight."""
        queued = self._baseline_units + self._optional_units + self.in_flight_units
        return self.service.drain_ms(queued, self.batch_units)

    def optional_room(self) -> int:
        """Optional units that could fit under the delay bound now, queued optional work
        counted as room (lower-value work gives way to higher). Extra candidates are
        divisible: a request gets as many of its extras as fit, instead of none because all
        of them would not."""
        ahead = self.service.drain_ms(self._baseline_units + self.in_flight_units,
                                      self.batch_units)
        spare = self.delay_bound_ms - ahead
        if spare <= 0.0:
            return 0
        return int(spare / max(self.service.per_unit_ms, 1e-9))

    def fit_optional(self, units: int) -> int:
        """How many of one request's `units` divisible optional units to queue: those that fit
        under the delay bound now (:meth:`optional_room`). The rest are counted as shed for
        ``overload`` here, so the live and the simulated worker cannot count them apart."""
        if units <= 0:
            return 0
        fits = min(units, self.optional_room())
        if fits < units:
            self.count_shed("overload", units - fits)
        return fits

    def fit_whole(self, base: int, extra: int) -> int:
        """How many of a whole request's ``extra`` candidates to serve with its ``base`` ones:
        those that keep the queue's predicted wait, this request included, under
        ``max_queue_delay_ms``, as extra candidates are everywhere. Only the request's base
        rides the longer deadline bound of a whole-request replica: its extras are RMA work
        at the powerful model's price per candidate, so they take the replica's idle time and
        give way to other requests' base when it is busy (serving more requests with the
        powerful model is worth more than more candidates on fewer of them). Trimming keeps
        the request where refusing it whole for carrying more than fits would send it back to
        the baseline pool with nothing. The rest are counted as shed for ``overload``; a
        request whose base alone does not fit is left to admission."""
        if extra <= 0:
            return 0
        bound = self.config.max_queue_delay_ms
        ahead = self._baseline_units + self._optional_units + self.in_flight_units + base
        low, high = 0, extra
        while low < high:  # the most extras whose drain time stays within the bound
            mid = (low + high + 1) // 2
            if self.service.drain_ms(ahead + mid, self.batch_units) <= bound:
                low = mid
            else:
                high = mid - 1
        if low < extra:
            self.count_shed(REASON_OVERLOAD, extra - low)
        return low

    def queue_delay_ms(self, now_ms: int) -> float:
        """The larger of the predicted wait and the age of the oldest queued baseline work."""
        oldest = now_ms - self._baseline[0].enqueued_ms if self._baseline else 0
        return max(self.predicted_delay_ms(), float(oldest))

    def shedding_level(self, now_ms: int) -> int:
        """0 (all clear) .. 3 (send no optional work): queue delay against the bounds; at
        least 1 while baseline surges (optional work is being held back: send less)."""
        if self.preempted:
            return MAX_LEVEL
        bound = self.delay_bound_ms
        delay = self.queue_delay_ms(now_ms)
        if delay >= bound:
            return 3
        low, high = self.config.level_fractions
        level = 2 if delay >= high * bound else 1 if delay >= low * bound else 0
        if level == 0 and self.surging(now_ms):
            return 1
        return level

    def oldest_enqueued_ms(self) -> int | None:
        """When the oldest queued work arrived (the batcher's wait is measured from it)."""
        stamps = [self._baseline[0].enqueued_ms] if self._baseline else []
        while self._arrivals and not self._arrivals[0].live:
            self._arrivals.popleft()
        if self._arrivals:
            stamps.append(self._arrivals[0].enqueued_ms)
        return min(stamps) if stamps else None

    @property
    def queued_units(self) -> int:
        return self._baseline_units + self._optional_units

    @property
    def queued_items(self) -> int:
        return len(self._baseline) + self._optional_items

    def state(self, now_ms: int) -> AdmissionState:
        return AdmissionState(
            queue_delay_ms=self.queue_delay_ms(now_ms),
            shedding_level=self.shedding_level(now_ms),
            preempted=self.preempted,
            baseline_items=len(self._baseline),
            baseline_units=self._baseline_units,
            optional_items=self._optional_items,
            optional_units=self._optional_units,
            in_flight_units=self.in_flight_units,
            ms_per_unit=self.service.per_unit_ms,
            batch_overhead_ms=self.service.overhead_ms,
            shed_units=dict(self.shed_units),
        )

    # -- internals -------------------------------------------------------------------------------

    def _expire(self, now_ms: int) -> None:
        while self._optional_items:
            entry = self._peek(self._by_deadline)
            if entry.deadline_ms > now_ms:
                return
            self._shed(entry, REASON_DEADLINE)

    def _enforce_delay_bound(self, now_ms: int, newcomer: _Entry[T] | None = None) -> None:
        bound = self.delay_bound_ms
        while self._optional_items and (self.predicted_delay_ms() > bound
                                        or self._optional_items > self.config.max_optional_items):
            entry = self._peek(self._by_low_value)
            if entry is newcomer:
                # Refused at the door, not dropped from the queue: no on_shed callback.
                self._remove(entry)
                self.count_shed(REASON_OVERLOAD, entry.units)
                self.admitted_units["optional"] -= entry.units
                self.load.add(-entry.units, optional=True)
            else:
                self._shed(entry, REASON_OVERLOAD)

    def _shed(self, entry: _Entry[T], reason: ShedReason) -> None:
        self._remove(entry)
        self.count_shed(reason, entry.units)
        self.load.add(-entry.units, optional=True)  # offered, never served
        if self.on_shed is not None:
            self.on_shed(entry.item, reason)

    def _remove(self, entry: _Entry[T]) -> None:
        entry.live = False
        self._optional_items -= 1
        self._optional_units -= entry.units
        if self._optional_items == 0:
            self._by_value.clear()
            self._by_low_value.clear()
            self._by_deadline.clear()
            self._arrivals.clear()
        elif len(self._by_value) > 4 * self._optional_items + 64:
            self._compact()

    def _compact(self) -> None:
        """Rebuild the heaps without dead entries (they are removed lazily otherwise)."""
        self._by_value = [t for t in self._by_value if t[2].live]
        self._by_low_value = [t for t in self._by_low_value if t[2].live]
        self._by_deadline = [t for t in self._by_deadline if t[2].live]
        self._arrivals = deque(e for e in self._arrivals if e.live)
        for heap in (self._by_value, self._by_low_value, self._by_deadline):
            heapq.heapify(heap)

    @staticmethod
    def _peek(heap: list[tuple[Any, int, _Entry[T]]]) -> _Entry[T]:
        """The first live entry of a heap (dead ones are popped on the way)."""
        while not heap[0][2].live:
            heapq.heappop(heap)
        return heap[0][2]
