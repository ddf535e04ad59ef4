"""ScopeController: the whole control loop of one scope (region), as plain method calls.

The Faust agents, the offline replayer and the fleet simulator all drive this one class, so
what runs live is what was replayed and simulated. Inputs are events plus ``now_ms``; outputs
are ``ControlTargets``. No clock, no randomness, no I/O: the same calls in the same order give
byte-identical targets.

Two speeds (DESIGN invariant 3):

- ``tick`` (every ``period_s``): close the latency windows, expire grants, allocate spare
  capacity between the levers, step the RMA PID and the SBM coverage, emit targets.
- ``on_preemption`` (fast path): drop the reclaimed capacity, re-allocate, and emit targets
  clamped to what remains *now*. It only ever lowers optional work, and it lowers the PID's
  held output and integral with it, so nothing springs back when the next tick runs. A notice
  that leaves the targets as the last notice's were (a reclaim re-announced) emits nothing.

Restart (DESIGN invariant 5): ``snapshot()`` is a JSON-encodable ``ControllerState`` with the
PID state, inventory, segment estimates, SBM coverage, epoch, the last targets and the rates
the fast path needs. A controller built from it continues the epoch. Its first tick is held
to at most the snapshot's last targets (extra candidates and coverage), with reason
"restart": the open window died with the old process, so the first period after a restart
acts on partial evidence, and a PID that was mid-ramp must not jump a step on it. From the
second tick on, the usual step limits apply from there.

Writers of agents: persist the snapshot before publishing the targets it produced, so a crash
in between cannot make a restored controller reuse an epoch already on the wire.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from schemas.contract import (
    OPERATOR_VERSION,
    POWERFUL_EXTRA_VERSION,
    SCHEMA_VERSION,
    CapacityEvent,
    ControlTargets,
    LiftReport,
    OperatorOverride,
    OutcomeLabel,
    PreemptionNotice,
    RmaTarget,
    RoutingOutcome,
    SbmTarget,
    WindowReport,
)
from streams.control import override as operator
from streams.control.allocation_memo import AllocationMemo
from streams.control.allocator import Allocation
from streams.control.config import ControlConfig
from streams.control.cost import CostModel, PoolCost
from streams.control.inventory import CapacityVector, InventoryState, PoolInventory
from streams.control.labels import AttributionJoin
from streams.control.offpolicy import (
    EstimatesState,
    GainEstimator,
    learned_curves,
    lift_report,
)
from streams.control.pending import PendingStore
from streams.control.rma import (
    CandidateSupply,
    RmaPolicy,
    RmaState,
    provisioned_headroom,
    ranking_request_rate,
    ranking_starved,
    rma_budget,
)
from streams.control.sbm import (
    SbmPolicy,
    SbmState,
    SegmentState,
    planned_rps,
    sbm_target,
)
from streams.control.windows import WindowSet, WindowStats

STATE_VERSION = 1
Reason = Literal["period", "preemption", "restart", "operator"]


class ScopeMismatch(ValueError):
    """An event for another scope reached this controller (a routing bug upstream)."""


class Observed(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What the last tick measured that the fast path needs between ticks."""

    ranking_rps: float = 0.0
    """Requests/s on the ranking pools (model baseline)."""
    total_rps: float = 0.0
    """Requests/s over ranking and powerful pools: the traffic SBM coverage is a share of."""
    powerful_capacity: dict[str, float] = {}
    """Measured capacity_rps per opportunistic powerful-model pool id."""
    provisioned_units_per_s: float = 0.0
    """Extra candidates/s the provisioned ranking replicas have room for (``rma``)."""
    serving: dict[str, str] = {}
    """Opportunistic pool id -> the model its replicas last reported serving (kept while the
    inventory knows the pool: granted, or reclaimed and may return): the allocator gives
    those units to that model's lever only."""


class ControllerState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """All state of a ScopeController that must survive a restart (JSON-encodable)."""

    version: int = STATE_VERSION
    scope: str
    epoch: int = 0
    last_tick_ms: int | None = None
    last_targets: ControlTargets | None = None
    rma: RmaState = msgspec.field(default_factory=RmaState)
    sbm: SbmState = msgspec.field(default_factory=SbmState)
    inventory: InventoryState = msgspec.field(default_factory=InventoryState)
    segments: SegmentState = msgspec.field(default_factory=SegmentState)
    """Before the join (v4 decisions): per-model outcome means. Read, no longer written."""
    estimates: EstimatesState = msgspec.field(default_factory=EstimatesState)
    """Off-policy gains and holdout lift from joined decisions (``streams.control.offpolicy``)."""
    observed: Observed = msgspec.field(default_factory=Observed)
    cost: dict[str, PoolCost] = {}
    override: OperatorOverride | None = None
    """The scope's latest operator override (``streams.control.override``), active or not."""


_state_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(ControllerState)


def encode_state(state: ControllerState) -> bytes:
    return _state_encoder.encode(state)


def decode_state(payload: bytes | str) -> ControllerState:
    state = _state_decoder.decode(payload)
    if state.version != STATE_VERSION:
        raise ValueError(f"controller state version {state.version} is not {STATE_VERSION}")
    return state


def _grid_up(units: float, steps_per_octave: int = 16) -> float:
    """`units` rounded up to the next point of a geometric grid (0 stays 0)."""
    if units <= 0.0:
        return 0.0
    return float(2.0 ** (math.ceil(math.log2(units) * steps_per_octave) / steps_per_octave))


def _version(reason: Reason, sbm: SbmTarget) -> int:
    """The oldest contract version that says all these targets say, so that older readers keep
    reading every target they can (a v4 reader refuses a capped one: baseline only)."""
    if sbm.extra_candidates is not None:
        return POWERFUL_EXTRA_VERSION
    return OPERATOR_VERSION if reason == "operator" else SCHEMA_VERSION


class ScopeController:
    """The control loop of one scope. See the module docstring for timing and restart rules."""

    def __init__(self, scope: str, config: ControlConfig,
                 state: ControllerState | None = None,
                 pending: PendingStore | None = None) -> None:
        """:param scope: the region this controller runs.
        :param config: its control laws (``ControlConfig.for_scope``).
        :param state: a snapshot to continue from (a restart); None: a fresh start.
        :param pending: where the label join keeps decisions waiting for labels (the live
            plane's disk store); None: in this process (replay, simulator, tests).
        """
        if state is not None and state.scope != scope:
            raise ValueError(f"state of scope {state.scope!r} given to controller of {scope!r}")
        self.scope = scope
        self.config = config
        restored = state is not None
        state = state or ControllerState(scope=scope)
        self._epoch = state.epoch
        self._last_tick_ms = state.last_tick_ms
        self._last_targets = state.last_targets
        self._observed = state.observed
        self._override = state.override
        self._windows = WindowSet(config.min_samples, config.relative_accuracy,
                                  max_pools=config.max_pools,
                                  forget_after_periods=config.forget_pool_after_periods,
                                  opened_ms=state.last_tick_ms)
        self._inventory = PoolInventory(state.inventory,
                                        tombstone_ms=round(config.preemption_tombstone_s * 1000))
        self._rma = RmaPolicy(config.rma, state.rma)
        self._supply = CandidateSupply()
        self._sbm = SbmPolicy(config.sbm, state.sbm)
        self._join = AttributionJoin(config.labels, pending)
        self._estimates = GainEstimator(config.sbm, config.labels, state.estimates)
        self._cost = CostModel(config.cost, state.cost)
        self._restart_ceiling: tuple[float, float, float] | None = None
        #: The allocator's curves as measured (None: the configured ones), set each tick.
        self._learned_curves: tuple[tuple[tuple[float, float], ...],
                                    tuple[tuple[float, float], ...]] | None = None
        if restored:
            last = state.last_targets
            self._restart_ceiling = ((float(last.rma.extra_candidates), last.sbm.coverage,
                                      last.rma.budget_units_per_s)
                                     if last is not None else (0.0, 0.0, 0.0))
        self._last_windows: list[WindowStats] = []
        self._memo = AllocationMemo()
        self._allocation = Allocation()

    # -- inputs --------------------------------------------------------------------------

    def on_report(self, report: WindowReport, now_ms: int) -> None:
        """Hot path: route into the pool's window (a dict lookup and a sketch merge)."""
        if report.region != self.scope:
            raise ScopeMismatch(f"WindowReport of region {report.region!r} sent to scope "
                                f"{self.scope!r}")
        self._windows.add(report)

    def on_capacity(self, event: CapacityEvent, now_ms: int) -> None:
        if event.region != self.scope:
            raise ScopeMismatch(f"CapacityEvent of region {event.region!r} sent to scope "
                                f"{self.scope!r}")
        self._inventory.apply(event)

    def on_outcome(self, outcome: RoutingOutcome, now_ms: int) -> None:
        """A decision record: held for its label, or joined at once if it carries its value."""
        if outcome.scope != self.scope:
            raise ScopeMismatch(f"RoutingOutcome of scope {outcome.scope!r} sent to scope "
                                f"{self.scope!r}")
        self._supply.observe(outcome.available)
        joined = self._join.on_decision(outcome, now_ms)
        if joined is not None:
            self._estimates.observe(joined)

    def on_label(self, label: OutcomeLabel, now_ms: int) -> None:
        """An outcome label: joined with its decision within the window, else counted."""
        if label.scope != self.scope:
            raise ScopeMismatch(f"OutcomeLabel of scope {label.scope!r} sent to scope "
                                f"{self.scope!r}")
        joined = self._join.on_label(label, now_ms)
        if joined is not None:
            self._estimates.observe(joined)

    def on_override(self, override: OperatorOverride, now_ms: int) -> ControlTargets | None:
        """Hold the operator's override; a kill goes out now (the fast path), the rest apply
        at the next tick."""
        if override.scope != self.scope:
            raise ScopeMismatch(f"OperatorOverride of scope {override.scope!r} sent to scope "
                                f"{self.scope!r}")
        self._override = override
        if not (override.kill and operator.active(override, now_ms)):
            return None
        last = self._last_targets
        rma, sbm = operator.baseline_only(last.sbm if last is not None else SbmTarget(coverage=0))
        return self._emit(now_ms, rma, sbm, "operator")

    # -- the fast path -------------------------------------------------------------------

    def on_preemption(self, notice: PreemptionNotice, now_ms: int) -> ControlTargets | None:
        """Drop the reclaimed capacity and emit targets clamped to what remains, now (None
        when the last targets, emitted for an earlier notice, already say exactly that)."""
        if notice.region != self.scope:
            raise ScopeMismatch(f"PreemptionNotice of region {notice.region!r} sent to scope "
                                f"{self.scope!r}")
        self._inventory.preempt(notice)
        observed = self._observed
        if not notice.replicas and notice.pool_id in observed.powerful_capacity:
            capacity = dict(observed.powerful_capacity)
            del capacity[notice.pool_id]
            observed = msgspec.structs.replace(observed, powerful_capacity=capacity)
            self._observed = observed
        rma_rate, sbm_rate = rates = self._rates()
        allocation = self._allocate(now_ms, rates)
        cfg = self.config
        rma = self._rma.clamp(rma_budget(allocation, cfg.rma, rma_rate)
                              + observed.provisioned_units_per_s, observed.ranking_rps)
        measured = sum(observed.powerful_capacity[k] for k in sorted(observed.powerful_capacity))
        serviceable = planned_rps(measured, allocation.sbm_accel_units, sbm_rate)
        coverage = self._sbm.clamp(serviceable, observed.total_rps)
        last = self._last_targets
        if last is None:  # nothing issued yet: the fast path never raises optional work
            rma, coverage = RmaTarget(extra_candidates=0, budget_units_per_s=0.0), 0.0
            segments = {}
        else:
            rma = RmaTarget(extra_candidates=min(rma.extra_candidates,
                                                 last.rma.extra_candidates),
                            budget_units_per_s=min(rma.budget_units_per_s,
                                                   last.rma.budget_units_per_s))
            coverage = min(coverage, last.sbm.coverage)
            segments = last.sbm.segments
        rma = msgspec.structs.replace(rma, limited_by="preemption")
        sbm = sbm_target(coverage, segments, "preemption",
                         None if last is None else last.sbm.extra_candidates)
        if last is not None and last.reason == "preemption" and (last.rma, last.sbm) == (rma, sbm):
            # A repeat (a scheduler re-announcing its reclaim until the deadline) changes
            # nothing the last targets did not already say: re-sending them would only load the
            # broker and every worker at the moment the notices themselves must be fast.
            return None
        return self._emit(now_ms, rma, sbm, "preemption")

    # -- the control period ----------------------------------------------------------------

    def tick(self, now_ms: int) -> ControlTargets:
        """Close the period's windows and emit this period's targets."""
        cfg = self.config
        stats = self._windows.close(now_ms)
        self._last_windows = stats
        dt_s = self._dt_s(now_ms)
        self._last_tick_ms = now_ms
        self._inventory.expire(now_ms)
        self._join.expire(now_ms)
        self._observed = self._observe(stats)
        self._cost.observe(stats, dt_s)
        rma_rate, sbm_rate = rates = self._rates()
        if cfg.allocator.learn_curves:
            self._learned_curves = learned_curves(
                self._estimates, rma_units_per_accel_s=rma_rate, sbm_rps_per_accel=sbm_rate,
                request_rps=self._observed.total_rps,
                prior_rma=cfg.allocator.rma_value_segments)
        allocation = self._allocate(now_ms, rates)
        ceiling = self._restart_ceiling
        self._restart_ceiling = None
        last = self._last_targets
        resumed = ceiling is None and last is not None and last.reason == "operator"
        if resumed and last is not None and not operator.active(self._override, now_ms):
            # The override lapsed or was cleared: this period is held to what it allowed, as
            # the first after a restart (its window was measured under the override); from the
            # next the usual rules apply, the held point of a lever it cut included.
            ceiling = (float(last.rma.extra_candidates), last.sbm.coverage,
                       last.rma.budget_units_per_s)
        budget = (rma_budget(allocation, cfg.rma, rma_rate)
                  + self._observed.provisioned_units_per_s)
        if ceiling is not None:
            budget = min(budget, ceiling[2])
        rma = self._rma.step(stats, budget, dt_s, ceiling=None if ceiling is None else ceiling[0],
                             supply=self._supply.most, starved=ranking_starved(stats))
        self._supply.close_period()
        if allocation.rma_accel_units <= 0 and rma.extra_candidates == 0:
            rma = msgspec.structs.replace(rma, limited_by="capacity")
        elif self._observed.ranking_rps <= 0 and rma.limited_by == "hold":
            rma = msgspec.structs.replace(rma, limited_by="demand")
        # SBM's share too small for a judgeable window while the traffic itself is judged
        starved = (any(w.enough_samples for w in stats if w.model == "baseline")
                   and self._sbm.coverage * self._observed.total_rps * dt_s < cfg.min_samples)
        self._sbm.step(stats, allocation.sbm_accel_units, self._observed.total_rps, sbm_rate,
                       ceiling=None if ceiling is None else ceiling[1], starved=starved,
                       allocation_limit=allocation.sbm_limit, rma_extra=rma.extra_candidates)
        sbm = sbm_target(self._sbm.coverage, self._estimates.priorities(),
                         self._sbm.limited_by, self._sbm.extra_cap)
        reason: Reason = "period" if ceiling is None or resumed else "restart"
        overridden = operator.apply(self._override, now_ms, rma, sbm, last)
        if overridden is not None:
            (rma, sbm), reason = overridden, "operator"
        return self._emit(now_ms, rma, sbm, reason)

    def _dt_s(self, now_ms: int) -> float:
        """Seconds since the last tick, kept within [0.1, max_dt_periods] periods."""
        period = self.config.period_s
        if self._last_tick_ms is None:
            return period
        dt = (now_ms - self._last_tick_ms) / 1000.0
        return min(max(dt, 0.1 * period), self.config.max_dt_periods * period)

    def _observe(self, stats: list[WindowStats]) -> Observed:
        ranking = ranking_request_rate(stats)
        powerful = [w for w in stats if w.model == "powerful"]
        total = ranking + sum(w.request_rate for w in powerful)
        capacity = {w.pool_id: w.capacity_rps for w in powerful
                    if w.tier == "opportunistic" and w.capacity_rps > 0}
        return Observed(ranking_rps=ranking, total_rps=total, powerful_capacity=capacity,
                        provisioned_units_per_s=provisioned_headroom(
                            stats, self.config.cost.provisioned_utilisation),
                        serving=self._inventory.serving(stats, self._observed.serving))

    def _rates(self) -> tuple[float, float]:
        """What one accelerator unit may plan to do, at the measured cost: extra candidates/s
        (to the target utilisation) and powerful-model requests/s (SBM's headroom applies)."""
        cost, cfg = self._cost, self.config
        rma = cfg.cost.target_utilisation / cost.seconds_per_unit(
            "baseline", cfg.rma.candidates_per_accel_unit_s)
        sbm = 1.0 / cost.seconds_per_unit("powerful", cfg.sbm.powerful_rps_per_accel_unit,
                                          per="requests")
        return rma, sbm

    def _allocate(self, now_ms: int, rates: tuple[float, float]) -> Allocation:
        """Allocation of the scope's live capacity (solved only for inputs not seen before)."""
        capacity = self._inventory.available(self.scope, now_ms, self._observed.serving)
        rma_max, sbm_max = self._demand_units(*rates)
        config = self.config.allocator
        curves = None
        if config.learn_curves and self._learned_curves is not None:
            curves = self._learned_curves
        allocation = self._memo.solve(capacity, config, rma_max, sbm_max, curves)
        self._allocation = allocation
        return allocation

    def _demand_units(self, rma_rate: float, sbm_rate: float) -> tuple[float, float]:
        """Accelerator units each lever could use at the last measured traffic.

        RMA: enough to pay for ``max_extra_candidates`` on every ranking request at the settled
        rate (``RmaPolicy.settled_rate``, the median of recent periods). The cap spreads the
        budget over the last period's rate where that is lower (``RmaPolicy.cap``); demand keeps
        the median, so a one-period dip does not shrink RMA's share of the capacity. SBM: enough
        to serve ``max_coverage`` of all requests within the headroom. Capacity past these is
        worth nothing now, so the allocator does not hand it to a lever that cannot use it.
        Demand is rounded *up* to a geometric grid (steps of 1/16 octave, about 4.4%): traffic
        jitters every period, and re-solving the LP for a 1% change in demand cost a millisecond
        per tick (a third of the offline replay's time) without changing the split materially.
        """
        rma, sbm, seen = self.config.rma, self.config.sbm, self._observed
        per_unit = min(self.config.allocator.cpu_per_accel_for_rma * rma.candidates_per_cpu_unit_s,
                       rma_rate)
        rma_units = (self._rma.most(self._supply.most) * self._rma.settled_rate(seen.ranking_rps)
                     / per_unit)
        sbm_units = sbm.max_coverage * seen.total_rps / (sbm.headroom * sbm_rate)
        return _grid_up(rma_units), _grid_up(sbm_units)

    def _emit(self, now_ms: int, rma: RmaTarget, sbm: SbmTarget, reason: Reason) -> ControlTargets:
        self._epoch += 1
        targets = ControlTargets(v=_version(reason, sbm),
                                 scope=self.scope, epoch=self._epoch, issued_at_ms=now_ms,
                                 ttl_ms=self.config.ttl_ms, rma=rma, sbm=sbm,
                                 reason=reason)
        self._last_targets = targets
        return targets

    # -- state and telemetry -----------------------------------------------------------------

    def snapshot(self) -> ControllerState:
        return ControllerState(scope=self.scope, epoch=self._epoch,
                               last_tick_ms=self._last_tick_ms, last_targets=self._last_targets,
                               rma=self._rma.state, sbm=self._sbm.state,
                               inventory=self._inventory.state,
                               estimates=self._estimates.state, observed=self._observed,
                               cost=self._cost.state,
                               override=self._override)

    @property
    def join(self) -> AttributionJoin:
        """Decisions waiting for labels, and the join's counts by reason."""
        return self._join

    @property
    def estimates(self) -> GainEstimator:
        """Per-segment gains and measured lift from joined decisions."""
        return self._estimates

    @property
    def override(self) -> OperatorOverride | None:
        """The scope's latest operator override (it may have lapsed or be a clear)."""
        return self._override

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def last_windows(self) -> list[WindowStats]:
        """Windows closed by the last tick (sorted by pool id)."""
        return self._last_windows

    @property
    def last_targets(self) -> ControlTargets | None:
        return self._last_targets

    @property
    def capacity(self) -> CapacityVector:
        """Live capacity as of the last tick or event time seen (for telemetry)."""
        return self._inventory.available(self.scope, self._last_tick_ms or 0,
                                         self._observed.serving)

    def lift_report(self, now_ms: int) -> LiftReport:
        """The measured lift and the join's counts, for the estimates topic and the log."""
        return lift_report(self.scope, now_ms, self._epoch, self._estimates, self._join.counts,
                           self.curves_learned)

    @property
    def curves_learned(self) -> bool:
        """Whether the last allocation used measured value curves (else the configured)."""
        return self._learned_curves is not None and self.config.allocator.learn_curves

    @property
    def allocation(self) -> Allocation:
        """The allocation behind the last emitted targets (for telemetry)."""
        return self._allocation

    @property
    def cost(self) -> CostModel:
        return self._cost

    @property
    def rma_policy(self) -> RmaPolicy:
        return self._rma

    @property
    def sbm_policy(self) -> SbmPolicy:
        return self._sbm
