"""SBM policy: what share of requests the powerful model serves, and which segments first.

Coverage follows what the powerful model can actually serve:
``min(max_coverage, headroom * serviceable_rps / request_rps)``, where ``serviceable_rps`` is the
measured capacity of the opportunistic powerful-model pools, limited by the accelerator units
the allocator gave SBM at the measured cost of a powerful request (``streams.control.cost``;
``powerful_rps_per_accel_unit`` is its prior): replicas still reporting
after their grant is gone do not count. Coverage rises by at most ``max_increase_per_period``
per period (by ``increase_ratio`` while the powerful p99 is under ``slow_start_below`` of its
SLA: far from the SLA the measured capacity bounds it, not latency), falls to the capacity
bound at once, and is trimmed multiplicatively while the powerful pools' p99 exceeds their
own SLA. No powerful capacity means zero coverage. Without
enough latency samples coverage holds, except at zero: a pool that is sent nothing reports
no latency, so holding there would never start; one probing step is taken instead. Likewise a
coverage too small for a period to gather enough samples at the traffic seen steps up, as long
as none of the few samples it got was over the SLA. As with RMA's budget, a cut by capacity
(a reclaim) holds the coverage it cut, and coverage returns to it in one step once capacity
supports it again, unless the powerful pools have since been over their SLA.

``SegmentEstimator`` learns, per segment, how much better the powerful model's outcomes are
than the baseline's: a Normal-Normal posterior per (segment, model) whose prior is the model's
fleet-wide mean, so a segment seen on one model only is compared with the other model's
fleet-wide value rather than with zero. Clients use ``gain_mean``/``gain_std`` to decide which
segments to cover first and how much to explore.
"""

from __future__ import annotations

import math

import msgspec

from schemas.contract import LimitReason, RoutingOutcome, SbmTarget, SegmentPriority
from streams.control.config import SbmConfig
from streams.control.windows import (
    MIN_UTILISATION,
    TRIM_TOLERANCE,
    WindowStats,
    extras_room,
    overload_per_request,
)

_GAIN_BOUND = 1e6
#: Under the SLA, the cap on the extras of powerful requests grows by this ratio a period
#: (and by one candidate at least) until it reaches RMA's target and is lifted.
EXTRA_REGROWTH = 1.25
#: Share of the powerful replicas' measured room the extras take each period: the room is
#: read from one period's busy share, which is noisy, and taking all of it at once
#: overshoots.
ROOM_SHARE = 0.5


class SbmState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    coverage: float = 0.0
    held: float = 0.0
    """The coverage a capacity cut took away, to return to once capacity allows (0: none)."""
    extra_cap: int | None = None
    """The cap on the extra candidates of powerful requests (None: RMA's target applies)."""
    floor_ms: float | None = None
    """The lowest p99 the powerful pools were judged at: the model's own latency with nothing
    queued (None: not judged yet; see ``SbmPolicy.slow_start_ms``)."""


def measured_rps(stats: list[WindowStats]) -> float:
    """What the opportunistic powerful-model replicas measured they can serve."""
    return sum(w.capacity_rps for w in sorted(stats, key=lambda w: w.pool_id)
               if w.model == "powerful" and w.tier == "opportunistic")


def powerful_room(stats: list[WindowStats], headroom: float) -> tuple[float, float] | None:
    """Spare units/s the opportunistic powerful-model replicas have up to ``headroom`` of
    their time (negative past it), and the requests/s they serve; None when they serve too
    little to measure. A replica's throughput is the units it scored over its busy share."""
    live = [w for w in sorted(stats, key=lambda w: w.pool_id)
            if w.model == "powerful" and w.tier == "opportunistic"
            and w.utilisation >= MIN_UTILISATION and w.units_rate > 0]
    rps = sum(w.request_rate for w in live)
    if not live or rps <= 0:
        return None
    return sum(w.units_rate * (headroom / w.utilisation - 1.0) for w in live), rps


def planned_rps(measured_rps: float, sbm_accel_units: float,
                rps_per_accel_unit: float) -> float:
    """Measured powerful-model capacity, limited by what SBM's allocation pays for at the
    measured cost of a request (``rps_per_accel_unit``)."""
    return min(measured_rps, max(0.0, sbm_accel_units) * rps_per_accel_unit)


class SbmPolicy:
    """One step per control period: powerful-pool windows and allocation in, coverage out."""

    def __init__(self, config: SbmConfig, state: SbmState | None = None) -> None:
        self.config = config
        state = state or SbmState()
        self.coverage = state.coverage
        self._held = state.held
        self.extra_cap = state.extra_cap
        self.floor_ms = state.floor_ms
        #: What kept the last coverage from being higher (see ``LimitReason``).
        self.limited_by: LimitReason = "hold"

    def cap(self, serviceable: float, request_rps: float) -> float | None:
        """Coverage the capacity supports; None when traffic is unknown (no basis to raise)."""
        if serviceable <= 0:
            return 0.0
        if request_rps <= 0:
            return None
        return min(self.config.max_coverage, self.config.headroom * serviceable / request_rps)

    def step(self, stats: list[WindowStats], sbm_accel_units: float, request_rps: float,
             rps_per_accel_unit: float, *, ceiling: float | None = None,
             starved: bool = False, allocation_limit: LimitReason = "capacity",
             rma_extra: int = 0) -> float:
        """New coverage. ``stats`` may hold every window; only powerful pools are read.
        ``starved``: at this coverage and traffic a period cannot gather enough samples.
        ``allocation_limit``: why the allocator gave SBM no more units (``Allocation.sbm_limit``),
        the reason reported when those units, not the replicas' measured capacity, bind.
        ``rma_extra``: RMA's extra candidates this period, which powerful requests carry too
        unless ``extra_cap`` holds them lower (see ``_over_sla``)."""
        cfg = self.config
        measured = measured_rps(stats)
        serviceable = planned_rps(measured, sbm_accel_units, rps_per_accel_unit)
        if allocation_limit == "capacity" and sbm_accel_units > 0 and measured > 0:
            # SBM holds every unit it can run on: what the replicas measure they serve is the
            # bound, read each report, not their cost averaged over minutes, which trails a
            # change of request size (extras cut to cover more) by its half-life.
            serviceable = measured
        bound = allocation_limit if serviceable < measured else "capacity"
        cap = self.cap(serviceable, request_rps)
        powerful = [w for w in stats if w.model == "powerful"]
        judged = [w.p99_ms for w in powerful if w.enough_samples]
        few = [w.p99_ms for w in powerful if not w.enough_samples and w.samples > 0]
        over = bool(judged) and max(judged) > cfg.sla_p99_ms
        why: LimitReason
        if cap is None:
            cap = min(self.coverage, cfg.max_coverage)
        if not judged and starved and not (few and max(few) > cfg.sla_p99_ms):
            # This coverage cannot bring a period enough samples to judge: holding would
            # hold for ever, as at zero. Step up while no request it got was over the SLA.
            wanted, why = self.coverage + cfg.max_increase_per_period, "sla"
        elif not judged and self.coverage > 0:
            wanted, why = self.coverage, "hold"                 # no evidence: hold
        elif not judged:  # at zero coverage no latency can exist: probe one step
            wanted, why = cfg.max_increase_per_period, "sla"
        elif over:
            self._learn_floor(judged)
            wanted, why = self._over_sla(rma_extra), "sla"       # powerful pools too slow
            self._trim_held()
        else:
            self._learn_floor(judged)
            wanted, why = self.coverage + self._increase(max(judged)), "sla"
            self._regrow_extra(rma_extra, powerful_room(stats, cfg.headroom),
                               overload_per_request(stats, "powerful", "opportunistic"))
            self._hold_extra_to_room(extras_room(stats, "powerful"), rma_extra)
        if ceiling is not None:
            cap, why = min(cap, ceiling), "hold"
        if self._held > wanted and why == "sla" and not over:
            wanted = self._held          # back to where capacity cut it, as far as it allows
        self._hold(cap)
        self.coverage = max(0.0, min(wanted, cap, 1.0))
        if self._held <= self.coverage:
            self._held = 0.0
        if serviceable <= 0:
            why = bound
        elif request_rps <= 0:
            why = "demand"
        elif self.coverage >= 1.0:
            why = self._extras_limit(rma_extra, over_sla=over)
        elif self.coverage >= cfg.max_coverage:
            why = "max"
        elif wanted > cap and ceiling is None:
            why = bound
        self.limited_by = why
        return self.coverage

    def _extras_limit(self, rma_extra: int, *, over_sla: bool) -> LimitReason:
        """Why a lever that covers every request does no more: a covered request's extras
        are SBM's work too, so where they are held under RMA's target (what a request may
        carry) the powerful replicas, not the traffic, bind: ``sla`` in a period over it,
        else ``capacity`` (their room). Only with the extras unheld is it ``demand``: read as
        demand alone, the live demo's SBM said so in half its periods while its cap trimmed
        every covered request's extras."""
        if self.extra_cap is None or self.extra_cap >= rma_extra:
            return "demand"                       # every request is covered, all it carries
        return "sla" if over_sla else "capacity"

    def _over_sla(self, rma_extra: int) -> float:
        """The powerful pools are over their SLA: shed load, the extra candidates their requests
        carry first. A covered request is worth its segment's gain, and coverage leaves the
        segments of least gain first, while the extras are the last, flattest stretch of RMA's
        concave value curve: in `diurnal_day` shedding them first kept coverage at its maximum
        through the afternoon peak, where cutting coverage lost 5% of the day's value.
        Coverage is trimmed once powerful requests carry none. Returns the wanted coverage."""
        cap, trim = self.extra_cap, self.config.trim_factor
        if rma_extra > 0 and (cap is None or cap > 0):
            self.extra_cap = math.floor((rma_extra if cap is None else min(cap, rma_extra)) * trim)
            return self.coverage
        return self.coverage * trim

    def _regrow_extra(self, rma_extra: int, room: tuple[float, float] | None = None,
                      trimmed: float | None = None) -> None:
        """Under the SLA: the powerful requests' extras take the room coverage leaves on the
        powerful replicas, and no more. With the replicas' measured room (``powerful_room``:
        spare units/s up to the headroom, negative past it, and their requests/s) each request
        may carry ``ROOM_SHARE`` of its share of the room more (or less); where the replicas
        are too idle to measure, the cap grows by ``EXTRA_REGROWTH`` a period. It is lifted at
        RMA's target. Sized by RMA's target alone, as before, a covered request carried extras
        the replica could not fit: the end-to-end p99 on `preemption_storm_tight` was 263-273
        ms, 257 ms with the room (the powerful SLA is 250 ms).

        Room in units/s is not room in one request: a replica admits a request's extras only
        as far as they drain within its queue bound, behind the base rows of the requests
        queued for their longer deadline. Where it trimmed more than ``TRIM_TOLERANCE`` of
        what the requests carried (``trimmed``: overload sheds per request), the cap falls to
        what it kept, whatever the room says."""
        cap = self.extra_cap
        current = rma_extra if cap is None else min(cap, rma_extra)
        if trimmed is not None and current > 0 and trimmed > TRIM_TOLERANCE * current:
            self.extra_cap = max(0, math.floor(current - trimmed))
            return
        if room is not None:
            spare, rps = room
            grown = max(0, math.floor(current + ROOM_SHARE * spare / rps))
        elif cap is None:
            return
        else:
            grown = max(current + 1, math.ceil(current * EXTRA_REGROWTH))
        self.extra_cap = None if grown >= rma_extra else grown

    def _hold_extra_to_room(self, room: int | None, rma_extra: int) -> None:
        """No covered request carries more extras than one could keep on a powerful replica
        (``WindowStats.extras_room``): past that every request is trimmed to it, whatever the
        room the replicas have in units/s says."""
        if room is not None and room < rma_extra and (self.extra_cap is None
                                                      or self.extra_cap > room):
            self.extra_cap = room

    def _increase(self, p99_ms: float) -> float:
        """How far coverage may rise this period. Far under the SLA it grows by a ratio (slow
        start, as TCP's): the capacity cap from the measured cost, not the latency, is what
        stops it there, so climbing one fixed step at a time would only leave the lent
        capacity idle for longer. Near the SLA it climbs one step at a time."""
        cfg = self.config
        step = cfg.max_increase_per_period
        if p99_ms < self.slow_start_ms():
            step = max(step, self.coverage * (cfg.increase_ratio - 1.0))
        return step

    def slow_start_ms(self) -> float:
        """The p99 under which coverage may double: ``slow_start_below`` of the way from the
        latency floor to the SLA. Queueing is what coverage adds to a powerful request's
        latency; the model's own time is there at any coverage. Measured from zero, a model
        whose idle p99 is most of its SLA never slow-starts: `preemption_storm_tight`'s
        (about 40 ms of 55) climbed one step a period from nothing, its first 25 s earning 173
        against the hindsight oracle's 474. The floor is the lowest p99 judged, so it only
        falls: a stale one makes the rule the stricter one it replaced, never looser."""
        cfg = self.config
        floor = min(self.floor_ms or 0.0, cfg.sla_p99_ms)
        return floor + cfg.slow_start_below * (cfg.sla_p99_ms - floor)

    def _learn_floor(self, judged: list[float]) -> None:
        lowest = min(judged)
        if self.floor_ms is None or lowest < self.floor_ms:
            self.floor_ms = lowest

    def clamp(self, serviceable: float, request_rps: float) -> float:
        """Fast path: lower coverage to what remaining capacity supports; never raises it."""
        cap = self.cap(serviceable, request_rps)
        if cap is not None:
            self._hold(cap)
            self.coverage = max(0.0, min(self.coverage, cap))
        self.limited_by = "preemption"
        return self.coverage

    def _trim_held(self) -> None:
        """Over the SLA, a coverage held for capacity's return is trimmed as coverage is, not
        forgotten. The period in which a reclaim cuts coverage is judged on the traffic before
        the cut, which a lent pool run full keeps at the SLA's edge; forgetting the held
        coverage there left the return to climb from nothing (`preemption_storm_tight`: 35 s
        back to the coverage the hindsight oracle holds, 8% of the run's value)."""
        self._held *= self.config.trim_factor   # 0 where nothing is held

    def _hold(self, cap: float) -> None:
        """Capacity is about to cut coverage: remember the coverage it had reached."""
        if self.coverage > cap:
            self._held = max(self._held, self.coverage)

    def target(self, estimator: SegmentEstimator) -> SbmTarget:
        """The wire target: current coverage and every tracked segment's priority."""
        return sbm_target(self.coverage, estimator.priorities(), self.limited_by, self.extra_cap)

    @property
    def state(self) -> SbmState:
        return SbmState(coverage=self.coverage, held=self._held, extra_cap=self.extra_cap,
                        floor_ms=self.floor_ms)


class ModelStats(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Running mean and (population) variance of one model's outcome values."""

    n: int = 0
    mean: float = 0.0
    var: float = 0.0


def _observe(stats: ModelStats, value: float, max_n: int) -> ModelStats:
    """Welford's update; past ``max_n`` it becomes an exponentially weighted one."""
    n = stats.n + 1
    w = 1.0 / min(n, max_n)
    delta = value - stats.mean
    return ModelStats(n=n, mean=stats.mean + w * delta, var=(1.0 - w) * (stats.var + w * delta
                                                                       * delta))


class SegmentStats(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    baseline: ModelStats = ModelStats()
    powerful: ModelStats = ModelStats()

    @property
    def observations(self) -> int:
        return self.baseline.n + self.powerful.n


class SegmentState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    fleet: SegmentStats = SegmentStats()
    segments: dict[str, SegmentStats] = {}


class SegmentEstimator:
    """Per-segment posterior of the powerful model's incremental gain; bounded in segments."""

    def __init__(self, config: SbmConfig, state: SegmentState | None = None) -> None:
        self.config = config
        state = state or SegmentState()
        self._fleet = state.fleet
        self._segments: dict[str, SegmentStats] = dict(state.segments)

    def observe(self, outcome: RoutingOutcome) -> None:
        """Fold one outcome in; a new segment beyond the bound evicts the least observed."""
        if outcome.value is None:
            return
        value = outcome.value
        max_n = self.config.max_effective_n
        seg = self._segments.get(outcome.segment)
        if seg is None:
            if len(self._segments) >= self.config.max_segments:
                victim = min(self._segments,
                             key=lambda name: (self._segments[name].observations, name))
                del self._segments[victim]
            seg = SegmentStats()
        if outcome.model == "powerful":
            seg = SegmentStats(baseline=seg.baseline,
                               powerful=_observe(seg.powerful, value, max_n))
            fleet = SegmentStats(baseline=self._fleet.baseline,
                                 powerful=_observe(self._fleet.powerful, value, max_n))
        else:
            seg = SegmentStats(baseline=_observe(seg.baseline, value, max_n),
                               powerful=seg.powerful)
            fleet = SegmentStats(baseline=_observe(self._fleet.baseline, value, max_n),
                                 powerful=self._fleet.powerful)
        self._segments[outcome.segment] = seg
        self._fleet = fleet

    def _posterior(self, stats: ModelStats, prior: ModelStats) -> tuple[float, float]:
        """(mean, variance) of a model's mean value in one segment."""
        cfg = self.config
        prior_mean = prior.mean if prior.n else cfg.prior_mean
        n = min(stats.n, cfg.max_effective_n)
        noise = ((n * stats.var + cfg.prior_obs_weight * cfg.prior_obs_std ** 2)
                 / (n + cfg.prior_obs_weight))
        precision = 1.0 / cfg.prior_std ** 2 + n / noise
        mean = (prior_mean / cfg.prior_std ** 2 + n * stats.mean / noise) / precision
        return mean, 1.0 / precision

    def priority(self, name: str) -> SegmentPriority:
        seg = self._segments[name]
        mean_p, var_p = self._posterior(seg.powerful, self._fleet.powerful)
        mean_b, var_b = self._posterior(seg.baseline, self._fleet.baseline)
        gain = max(-_GAIN_BOUND, min(_GAIN_BOUND, mean_p - mean_b))
        std = min(_GAIN_BOUND, math.sqrt(var_p + var_b))
        return SegmentPriority(gain_mean=gain, gain_std=std, observations=seg.observations)

    def priorities(self) -> dict[str, SegmentPriority]:
        """Every tracked segment's priority, keyed in name order (stable encoding)."""
        return {name: self.priority(name) for name in sorted(self._segments)}

    def __len__(self) -> int:
        return len(self._segments)

    @property
    def state(self) -> SegmentState:
        return SegmentState(fleet=self._fleet,
                            segments={k: self._segments[k] for k in sorted(self._segments)})


def sbm_target(coverage: float, segments: dict[str, SegmentPriority],
               limited_by: LimitReason | None = None,
               extra_cap: int | None = None) -> SbmTarget:
    return SbmTarget(coverage=max(0.0, min(1.0, coverage)), segments=segments,
                     limited_by=limited_by, extra_candidates=extra_cap)
