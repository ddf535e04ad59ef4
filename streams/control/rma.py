"""RMA policy: how many extra candidates each ranking request may score.

A PID holds the ranking pools' p99 at ``sla_p99_ms * margin``: while p99 is below that aim the
error (``setpoint - p99``) is positive and extra candidates rise; above it they fall. The
measurement is the *worst* p99 among ranking pools (model ``baseline``) whose window has
enough samples: one hot pool is enough to breach the SLA for its users.

Isolation is logical (extra candidates run on the same replicas as baseline work), so a budget
caps the extra work: ``extra_candidates * request_rate <= budget_units_per_s``, where the budget
comes from the capacity the allocator gave RMA at the measured cost of a candidate
(``streams.control.cost``). The cap is a hard ceiling on the PID, not a
post-hoc clamp, so the integral cannot wind up behind it; when the budget falls the target
falls with it in the same period, without waiting for a PID ramp. When p99 breaches the SLA
itself (not just the aim), extra work is cut multiplicatively at once.

A clamp by the budget (capacity reclaimed, a burst that raised the request rate) is not a
verdict of the latency loop: the output the loop had reached before it is *held*, and once the
budget allows more again, while p99 is under the aim, the output returns to it in one step
rather than ramping from the clamp (as TCP restores its window after a loss it knows was not
congestion). Whenever p99 reaches the aim the held point is forgotten: the loop itself then
says less.
"""

from __future__ import annotations

import math

import msgspec

from schemas.contract import LimitReason, RmaTarget
from streams.control.allocator import Allocation
from streams.control.config import RmaConfig
from streams.control.pid import Pid, PidState
from streams.control.windows import (
    MIN_UTILISATION,
    TRIM_TOLERANCE,
    WindowStats,
    extras_room,
    overload_per_request,
)

#: Periods of ranking request rate the budget is divided by (their median).
RATE_PERIODS = 5
#: How far past what the replicas served a request on average the held target may go: room
#: varies from replica to replica and moment to moment, and a request that finds a replica
#: idle takes more. Measured on the capacity-tight scenarios (docs/benchmarks.md): 1.0 cut
#: `demo_tight`'s value by 6% and `azure_steady_tight`'s by 4%; 1.5 kept both, with under a
#: tenth of the overload shedding on `demo_tight`.
OVERSEND = 1.5
#: While the replicas serve what the target sends, the served cap grows by this ratio a period
#: (and by ``max_step`` at least), until it passes the configured maximum and is lifted.
SERVED_REGROWTH = 1.25
#: A period whose ranking request rate is over this many times the settled rate holds the
#: served cap: what the replicas shed for overload then is the burst's, shed by their surge
#: rule, not a target sending more than a request can carry (`burst` lost 0.8% of its value
#: to cuts after each burst without it).
SURGE_RATIO = 1.5


class RmaState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pid: PidState = msgspec.field(default_factory=PidState)
    rates: list[float] = []
    """Ranking request rates of the last periods, oldest first (see ``RmaPolicy.cap``)."""
    held: float = 0.0
    """The output a budget clamp cut, to return to once the budget allows (0: none)."""
    served: float | None = None
    """The most extra candidates a request was served with lately (None: no cap; see
    ``RmaPolicy.served_cap``)."""
    issued: int = 0
    """The extra candidates of the last target issued."""
    room: int | None = None
    """The most extra candidates one request could carry on a ranking replica, last period
    (``WindowStats.extras_room``; None: not measured)."""
    threshold: float | None = None
    """Half the output at which p99 last reached the aim: slow start stops there (TCP's
    ssthresh; None: it has not, or a reclaim reset it; see ``RmaPolicy._slow_start``)."""


class CandidateSupply:
    """The most extra candidates a caller offered one request over the last ``periods``
    control periods, from the decision records (``RoutingOutcome.available``).

    A target above it scores nothing more, so it bounds RMA's target and the allocator's
    demand for RMA units, and a target at it is limited by ``demand``, not by a configured
    maximum. The largest offer, not a typical one: requests with fewer candidates simply send
    all they have. ``most`` is None until a record says (clients before contract v6).
    """

    def __init__(self, periods: int = RATE_PERIODS) -> None:
        self._periods = periods
        self._current: int | None = None
        self._maxima: list[int] = []

    def observe(self, available: int | None) -> None:
        if available is not None and (self._current is None or available > self._current):
            self._current = available

    def close_period(self) -> None:
        """Keep this period's largest offer; a period without records keeps the old ones."""
        if self._current is not None:
            self._maxima = [*self._maxima, self._current][-self._periods:]
            self._current = None

    @property
    def most(self) -> int | None:
        seen = self._maxima if self._current is None else [*self._maxima, self._current]
        return max(seen) if seen else None


def rma_budget(allocation: Allocation, config: RmaConfig, units_per_accel_s: float) -> float:
    """Extra candidates per second the allocated CPU and accelerators can score, at
    ``units_per_accel_s`` per accelerator unit (measured; the CPU rate is a configured cap)."""
    return min(allocation.rma_cpu * config.candidates_per_cpu_unit_s,
               allocation.rma_accel_units * units_per_accel_s)




def provisioned_headroom(stats: list[WindowStats], target_utilisation: float) -> float:
    """Extra candidates per second the provisioned (baseline-tier) ranking replicas have room
    for: capacity bought for the peak stands idle off it, and extra candidates are the one
    kind of optional work that can run there (same model, logical isolation).

    Measured, per pool: its throughput when busy all the time is the units it scored per
    second over the share of time it was busy; the room is that throughput, at
    ``target_utilisation``, less the baseline units it scored. A pool too idle to measure
    (under ``MIN_UTILISATION``) counts for nothing rather than for a guess.
    """
    room = 0.0
    for w in sorted(stats, key=lambda w: w.pool_id):
        if w.model != "baseline" or w.tier != "baseline" or w.utilisation < MIN_UTILISATION:
            continue
        baseline_rate = max(0.0, w.units_rate - w.optional_done_rate)
        room += max(0.0, target_utilisation * w.units_rate / w.utilisation - baseline_rate)
    return room


def ranking_request_rate(stats: list[WindowStats]) -> float:
    """Requests per second over the ranking pools (model ``baseline``), in pool-id order."""
    return sum(w.request_rate for w in sorted(stats, key=lambda w: w.pool_id)
               if w.model == "baseline")


def ranking_starved(stats: list[WindowStats]) -> bool:
    """The ranking pools see too few requests to judge while the powerful pool's traffic is
    judged: SBM covers nearly every request (see ``RmaPolicy.step``'s ``starved``)."""
    return (any(w.enough_samples for w in stats if w.model == "powerful")
            and not any(w.enough_samples for w in stats if w.model == "baseline"))


def worst_p99(stats: list[WindowStats], model: str) -> float | None:
    """Worst p99 among windows of ``model`` with enough samples; None when none qualifies."""
    judged = [w.p99_ms for w in stats if w.model == model and w.enough_samples]
    return max(judged) if judged else None


class RmaPolicy:
    """One step per control period: stats and budget in, ``RmaTarget`` out."""

    def __init__(self, config: RmaConfig, state: RmaState | None = None) -> None:
        self.config = config
        state = state or RmaState()
        self.pid = Pid(config.pid(), state.pid)
        self._rates = list(state.rates[-RATE_PERIODS:])
        self._held = state.held
        self._served = state.served
        self._issued = state.issued
        self._room = state.room
        self._threshold = state.threshold
        self.last_p99_ms: float | None = None
        #: Requests/s the last cap spread the budget over (see ``cap``).
        self.spread_rate = 0.0
        #: What kept the last target from being higher (see ``LimitReason``).
        self.limited_by: LimitReason = "hold"

    def most(self, supply: int | None = None) -> float:
        """The most extra candidates a target may hold: the configured maximum, or fewer when
        the callers offer fewer (``supply``, see ``CandidateSupply``)."""
        top = float(self.config.max_extra_candidates)
        return top if supply is None else min(top, float(supply))

    def cap(self, budget_units_per_s: float, request_rate: float,
            supply: int | None = None) -> float:
        """Most extra candidates per request the budget pays for at the settled request rate.

        The rate is the median of the last ``RATE_PERIODS`` periods' (``request_rate`` among
        them), not the last one: a burst that fills one period would otherwise cut the target
        to a sliver and leave the PID to climb back for several periods after it. During the
        burst the clients' budget buckets, not the target, keep the spending within the
        budget (the extra work is spread over fewer of the burst's requests).
        """
        self.spread_rate = max(min(self.settled_rate(request_rate), request_rate),
                               self.config.min_request_rate)
        if budget_units_per_s <= 0:
            return 0.0
        per_request = budget_units_per_s / self.spread_rate
        return min(self.most(supply), per_request)

    def settled_rate(self, request_rate: float) -> float:
        """Median of the recorded rates and ``request_rate`` (which is not recorded); of an
        even count the lower middle one, so that in the first periods of a run one burst
        among two rates is not half of the rate the budget is spread over."""
        rates = sorted([*self._rates[-(RATE_PERIODS - 1):], request_rate])
        return rates[(len(rates) - 1) // 2]

    def step(self, stats: list[WindowStats], budget_units_per_s: float, dt_s: float, *,
             ceiling: float | None = None, supply: int | None = None,
             starved: bool = False, unallocated: bool = False) -> RmaTarget:
        """Advance the PID on this period's ranking windows.

        ``ceiling`` is an extra upper bound from the caller (the first period after a restart
        is held to what was issued before it). ``supply``: the most extra candidates callers
        offer a request (``CandidateSupply``), past which a target buys nothing. With no
        window of enough samples the output is held, still under the budget cap, unless
        ``starved``: the scope's traffic is judged elsewhere (SBM covers nearly every request)
        and the ranking pools get too few to judge. Holding would then hold for ever, at zero
        after a reclaim, and the powerful requests, whose extras RMA's target bounds too,
        would carry none: the output steps up by ``max_step`` (to the cap, where no step is
        set) while none of the few ranking samples was over the SLA. ``unallocated``: the
        allocator gave RMA no accelerator units, so a target of zero is limited by
        ``capacity``, whatever else would bind it.
        """
        budget = max(0.0, budget_units_per_s)
        rate = ranking_request_rate(stats)
        high = self.cap(budget, rate, supply)
        if ceiling is not None:
            high = min(high, ceiling)
        self._hold(high)
        surging = rate > SURGE_RATIO * self.settled_rate(rate)
        served = self.served_cap(None if surging else overload_per_request(stats, "baseline"))
        if served is not None and served < high:
            high = served
        p99 = worst_p99(stats, "baseline")
        if p99 is not None:  # a period too thin to judge moves no state, this one included
            self._rates = [*self._rates, rate][-RATE_PERIODS:]
        self.last_p99_ms = p99
        budget_high = high
        stepped = False
        if p99 is None:
            few = [w.p99_ms for w in stats if w.model == "baseline" and w.samples > 0]
            if starved and not (few and max(few) > self.config.sla_p99_ms):
                step = self.config.max_step
                self.pid.move_to(high if step is None else min(self.pid.output + step, high))
                stepped = True
            else:
                self.pid.limit(high)
        else:
            if p99 >= self.config.setpoint_ms:
                self._held = 0.0                     # the latency loop says less, not the budget
                self._threshold = self.pid.output / 2.0
            if p99 > self.config.sla_p99_ms:
                high = min(high, self.pid.output * self.config.overload_cut)
                self.pid.limit(high)
            before = self.pid.output
            self.pid.update(p99, dt_s, limit_high=high)
            self._slow_start(p99, before, high)
            self._restore(high)
        target = self._target(budget, high)
        room = self._room = self._room if surging else extras_room(stats, "baseline")
        if room is not None and target.extra_candidates > room:
            target = msgspec.structs.replace(target, extra_candidates=room)
        if room is not None and (served is None or room < served):
            served = room
        self._issued = target.extra_candidates
        target = self._spend(target, rate)
        self.limited_by = self._limit(target.extra_candidates, budget_high,
                                      self.config.setpoint_ms if stepped else p99, ceiling,
                                      supply, served, unallocated=unallocated, rate=rate)
        return msgspec.structs.replace(target, limited_by=self.limited_by)

    def _spend(self, target: RmaTarget, rate: float) -> RmaTarget:
        """The budget issued is at most what the target spends at the settled request rate.

        The latency loop judges a target by the p99 it gave at the settled rate; the
        allocator's budget is what the capacity could score. Issued whole, a burst of requests
        each took the full target, the extra work rose with the arrivals and p99 with it (the
        Azure trace's 5 s windows swing by a third: `azure_steady` broke two windows at
        targets the loop had judged safe). Held to the spend, the clients' and the workers'
        budget buckets keep the extra work level through the burst, spread over more of its
        requests (a worker's bucket banks a few requests' worth, ``BANKED_REQUESTS``)."""
        settled = max(self.settled_rate(rate), self.config.min_request_rate)
        spend = target.extra_candidates * settled
        if spend >= target.budget_units_per_s:
            return target
        return msgspec.structs.replace(target, budget_units_per_s=spend)

    def served_cap(self, trimmed: float | None) -> float | None:
        """The most extra candidates the ranking replicas serve a request, from what they shed
        for overload per request (``trimmed``) under the last target. A replica admits a
        request's extras only as far as they drain within its queue bound and trims the rest,
        which keeps its latency, and so the PID's, under the SLA while the target runs far
        past what the lent capacity serves. Where they trimmed more than ``TRIM_TOLERANCE``
        of what the target sent, the cap falls to ``OVERSEND`` times what they kept; while they
        keep the rest it grows by ``SERVED_REGROWTH`` a period, probing for room, and is
        lifted past the configured maximum. The cap is a measured capacity, not the latency
        loop's verdict, so it is never held for a return (as a budget clamp is)."""
        issued, cap = self._issued, self._served
        if trimmed is not None and issued > 0 and trimmed > TRIM_TOLERANCE * issued:
            self._served = max(0.0, issued - trimmed) * OVERSEND
        elif cap is not None and (trimmed is not None or issued == 0):
            grown = max(cap * SERVED_REGROWTH, cap + (self.config.max_step or 1.0))
            self._served = None if grown >= self.config.max_extra_candidates else grown
        return self._served

    def _hold(self, high: float) -> None:
        """The budget is about to cut the output: remember where the latency loop had it."""
        if self.pid.output > high:
            self._held = max(self._held, self.pid.output)

    def _restore(self, high: float) -> None:
        """Back to the held output, as far as the budget allows (p99 is under the aim)."""
        held = self._held
        if held <= self.pid.output:
            self._held = 0.0
            return
        if high > self.pid.output:
            self.pid.move_to(min(held, high))
            if self.pid.output >= held:
                self._held = 0.0

    def _slow_start(self, p99_ms: float, before: float, high: float) -> None:
        """Far under the SLA, let the output grow by a ratio (as TCP's slow start): there the
        budget from the measured cost is what bounds it, and a latency curve that is flat at
        low load gives the PID too small an error to climb fast. The PID then continues from
        the new output without a bump.

        Once p99 has reached the aim, doubling stops at half the output that took it there
        (as TCP's ssthresh): a cut leaves p99 far under the aim, and doubling from there went
        straight back past it (`azure_steady`: 32 -> 65 -> 99 -> 117 extras in three periods
        after a cut from 108, and a window over the SLA)."""
        cfg = self.config
        if p99_ms >= cfg.slow_start_below * cfg.sla_p99_ms or before <= 0.0:
            return
        top = high if self._threshold is None else min(high, self._threshold)
        wanted = min(before * cfg.increase_ratio, top)
        if wanted > self.pid.output:
            self.pid.move_to(wanted)

    def _limit(self, extra: int, budget_high: float, p99: float | None,
               ceiling: float | None, supply: int | None,
               served: float | None = None, *, unallocated: bool = False,
               rate: float = 1.0) -> LimitReason:
        """Why ``extra`` is not higher: the first bound it sits at, else the SLA loop. A
        target held with no ranking traffic at all (``rate``) is held for want of demand."""
        cfg = self.config
        if unallocated and extra == 0:
            return "capacity"                 # no accelerator to score extras on
        if supply is not None and extra >= supply:
            return "demand"                   # every candidate the callers offer is scored
        if served is not None and extra >= math.floor(served + 1e-9):
            return "capacity"                 # what the replicas serve a request
        if extra >= cfg.max_extra_candidates:
            return "max"
        if budget_high <= 0.0:
            return "budget"
        if extra >= math.floor(budget_high + 1e-9) and budget_high < cfg.max_extra_candidates:
            return "budget"
        if p99 is None or ceiling is not None:
            return "hold" if rate > 0 else "demand"
        return "sla"

    def clamp(self, budget_units_per_s: float, request_rate: float) -> RmaTarget:
        """Fast path: lower the held output to what the budget still pays for, no PID step."""
        budget = max(0.0, budget_units_per_s)
        high = self.cap(budget, request_rate)
        self._hold(high)
        self.pid.limit(high)
        self._threshold = None  # the capacity changed: what p99 said of it is past
        self.limited_by = "preemption"
        target = self._target(budget, high)
        self._issued = target.extra_candidates
        return msgspec.structs.replace(target, limited_by="preemption")

    def _target(self, budget: float, high: float) -> RmaTarget:
        extra = min(math.floor(self.pid.output + 1e-9), math.floor(high + 1e-9))
        return RmaTarget(extra_candidates=max(0, extra), budget_units_per_s=budget)

    @property
    def state(self) -> RmaState:
        return RmaState(pid=self.pid.state, rates=list(self._rates), held=self._held,
                        served=self._served, issued=self._issued, room=self._room,
                        threshold=self._threshold)
