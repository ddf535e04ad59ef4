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

import msgspec

from schemas.contract import (
    OPERATOR_VERSION,
    POWERFUL_EXTRA_VERSION,
    PRECOMPUTE_SHARE_VERSION,
    SCHEMA_VERSION,
    CapacityEvent,
    ControlTargets,
    LiftReport,
    OperatorOverride,
    OutcomeLabel,
    PrecomputeTarget,
    PreemptionNotice,
    RmaTarget,
    RoutingOutcome,
    SbmTarget,
    WindowPartial,
    WindowReport,
)
from streams.control import override as operator
from streams.control.allocator import Allocation
from streams.control.ceiling import Ceiling, Reason, period_ceiling, preemption_targets
from streams.control.config import ControlConfig
from streams.control.cost import CostModel, PoolCost
from streams.control.evidence import ValueEvidence
from streams.control.inventory import CapacityVector, InventoryState, PoolInventory
from streams.control.labels import AttributionJoin
from streams.control.observed import Observed, observe
from streams.control.offpolicy import EstimatesState, GainEstimator
from streams.control.pending import PendingStore
from streams.control.planner import Planner, UnitRates, demand_units, speeds, unit_rates
from streams.control.precompute_share import PrecomputeSharePolicy, PrecomputeShareState
from streams.control.rma import CandidateSupply, RmaPolicy, RmaState, ranking_starved, rma_budget
from streams.control.sbm import SbmPolicy, SbmState, SegmentState, planned_rps, sbm_target
from streams.control.windows import WindowSet, WindowStats

__all__ = ["STATE_VERSION", "ControllerState", "Observed", "Reason", "ScopeController",
           "ScopeMismatch", "decode_state", "encode_state"]

STATE_VERSION = 1


class ScopeMismatch(ValueError):
    """An event for another scope reached this controller (a routing bug upstream)."""


def _own(scope: str, kind: str, named: str, field: str) -> None:
    """Refuse an event of ``kind`` whose ``field`` names another scope than ``scope``."""
    if named != scope:
        raise ScopeMismatch(f"{kind} of {field} {named!r} sent to scope {scope!r}")


class ControllerState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """All state of a ScopeController that must survive a restart (JSON-encodable)."""

    version: int = STATE_VERSION
    scope: str
    epoch: int = 0
    last_tick_ms: int | None = None
    last_targets: ControlTargets | None = None
    rma: RmaState = msgspec.field(default_factory=RmaState)
    sbm: SbmState = msgspec.field(default_factory=SbmState)
    precompute: PrecomputeShareState = msgspec.field(default_factory=PrecomputeShareState)
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


def _version(reason: Reason, sbm: SbmTarget, precompute: PrecomputeTarget | None) -> int:
    """The oldest contract version that says all these targets say, so that older readers keep
    reading every target they can (a v4 reader refuses a capped one: baseline only)."""
    if precompute is not None:
        return PRECOMPUTE_SHARE_VERSION
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
        self._precompute = PrecomputeSharePolicy(config.precompute, state.precompute)
        #: The precompute lever's share behind the last targets (None: the lever is off).
        self._share: PrecomputeTarget | None = (
            None if state.last_targets is None or state.last_targets.precompute is msgspec.UNSET
            else state.last_targets.precompute)
        self._evidence = ValueEvidence(config, state.estimates, pending)
        self._cost = CostModel(config.cost, state.cost)
        self._planner = Planner(config)
        #: The first tick after a restart is held to the snapshot's last targets.
        self._restart_ceiling = Ceiling.of(state.last_targets) if restored else None
        self._last_windows: list[WindowStats] = []

    # -- inputs --------------------------------------------------------------------------

    def on_report(self, report: WindowReport, now_ms: int) -> None:
        """Hot path: route into the pool's window (a dict lookup and a sketch merge)."""
        _own(self.scope, "WindowReport", report.region, "region")
        self._windows.add(report)

    def on_partial(self, partial: WindowPartial, now_ms: int) -> None:
        """A first-stage shard's sums for one period (a scaled-out scope's telemetry,
        ``streams.control.shards``): merged into the windows as its reports would have been."""
        _own(self.scope, "WindowPartial", partial.region, "region")
        for pool in partial.pools:
            self._windows.add_partial(pool, partial.region, partial.shard)

    def on_capacity(self, event: CapacityEvent, now_ms: int) -> None:
        _own(self.scope, "CapacityEvent", event.region, "region")
        self._inventory.apply(event)

    def on_outcome(self, outcome: RoutingOutcome, now_ms: int) -> None:
        """A decision record: held for its label, or joined at once if it carries its value."""
        _own(self.scope, "RoutingOutcome", outcome.scope, "scope")
        self._supply.observe(outcome.available)
        self._evidence.on_decision(outcome, now_ms)

    def on_label(self, label: OutcomeLabel, now_ms: int) -> None:
        """An outcome label: joined with its decision within the window, else counted."""
        _own(self.scope, "OutcomeLabel", label.scope, "scope")
        self._evidence.on_label(label, now_ms)

    def on_override(self, override: OperatorOverride, now_ms: int) -> ControlTargets | None:
        """Hold the operator's override; a kill goes out now (the fast path), the rest apply
        at the next tick."""
        _own(self.scope, "OperatorOverride", override.scope, "scope")
        self._override = override
        if not (override.kill and operator.active(override, now_ms)):
            return None
        last = self._last_targets
        rma, sbm = operator.baseline_only(last.sbm if last is not None else SbmTarget(coverage=0))
        self._share = operator.precompute(override, now_ms, self._share, last)
        return self._emit(now_ms, rma, sbm, "operator")

    # -- the fast path -------------------------------------------------------------------

    def on_preemption(self, notice: PreemptionNotice, now_ms: int) -> ControlTargets | None:
        """Drop the reclaimed capacity and emit targets clamped to what remains, now (None
        when the last targets, emitted for an earlier notice, already say exactly that)."""
        _own(self.scope, "PreemptionNotice", notice.region, "region")
        self._inventory.preempt(notice)
        if not notice.replicas:
            self._observed = self._observed.without(notice.pool_id)
        observed, rates = self._observed, unit_rates(self._cost, self.config)
        allocation = self._allocate(now_ms, rates)
        rma = self._rma.clamp(self._rma_budget(allocation, rates), observed.ranking_rps)
        serviceable = planned_rps(observed.powerful_rps, allocation.sbm_accel_units,
                                  rates.sbm_rps_per_accel)
        coverage = self._sbm.clamp(serviceable, observed.total_rps)
        clamped = preemption_targets(self._last_targets, rma, coverage)
        return None if clamped is None else self._emit(now_ms, *clamped, "preemption")

    # -- the control period ----------------------------------------------------------------

    def tick(self, now_ms: int) -> ControlTargets:
        """Close the period's windows and emit this period's targets.

        The steps read what the ones before them left: what the period measured (windows,
        expiries, the measured cost), the plan of the live capacity at that cost, the ceiling
        a restart or an override's end holds this period to, RMA's step (SBM's powerful
        requests carry its extras), SBM's step, the precompute lever's share, then an active
        override over them all.
        """
        stats, dt_s = self._measure(now_ms)
        rates = unit_rates(self._cost, self.config)
        self._planner.learn(self._evidence.estimates, rates, self._observed.total_rps,
                            self._rma.most(self._supply.most))
        allocation = self._allocate(now_ms, rates)
        ceiling, reason = period_ceiling(self._restart_ceiling, self._last_targets,
                                         self._override, now_ms)
        self._restart_ceiling = None
        rma = self._step_rma(stats, allocation, rates, dt_s, ceiling)
        sbm = self._step_sbm(stats, allocation, rates, dt_s, ceiling, rma.extra_candidates)
        share = self._precompute.step(stats, self._evidence.estimates.precompute_per_hit())
        self._share = operator.precompute(self._override, now_ms, share, self._last_targets)
        overridden = operator.apply(self._override, now_ms, rma, sbm, self._last_targets)
        if overridden is not None:
            (rma, sbm), reason = overridden, "operator"
        return self._emit(now_ms, rma, sbm, reason)

    def _measure(self, now_ms: int) -> tuple[list[WindowStats], float]:
        """Close the windows and expire what lapsed; the windows and the seconds they span
        (since the last tick, kept within [0.1, max_dt_periods] periods)."""
        period = self.config.period_s
        last, self._last_tick_ms = self._last_tick_ms, now_ms
        dt_s = period if last is None else min(max((now_ms - last) / 1000.0, 0.1 * period),
                                               self.config.max_dt_periods * period)
        stats = self._last_windows = self._windows.close(now_ms)
        self._inventory.expire(now_ms)
        self._evidence.join.expire(now_ms)
        self._observed = observe(stats, self._inventory, self._observed,
                                 self.config.cost.provisioned_utilisation)
        self._cost.observe(stats, dt_s)
        return stats, dt_s

    def _rma_budget(self, allocation: Allocation, rates: UnitRates) -> float:
        """Extra candidates/s RMA may spend: what its allocation scores at the measured
        cost, and the provisioned ranking replicas' idle room."""
        return (rma_budget(allocation, self.config.rma, rates.rma_units_per_accel_s)
                + self._observed.provisioned_units_per_s)

    def _step_rma(self, stats: list[WindowStats], allocation: Allocation, rates: UnitRates,
                  dt_s: float, ceiling: Ceiling | None) -> RmaTarget:
        """RMA's PID step under the budget (and the ceiling, where one holds this period)."""
        budget = self._rma_budget(allocation, rates)
        if ceiling is not None:
            budget = min(budget, ceiling.budget_units_per_s)
        rma = self._rma.step(stats, budget, dt_s,
                             ceiling=None if ceiling is None else ceiling.extra_candidates,
                             supply=self._supply.most, starved=ranking_starved(stats),
                             unallocated=allocation.rma_accel_units <= 0)
        self._supply.close_period()
        return rma

    def _step_sbm(self, stats: list[WindowStats], allocation: Allocation, rates: UnitRates,
                  dt_s: float, ceiling: Ceiling | None, rma_extra: int) -> SbmTarget:
        """SBM's coverage step, starved where its share of the traffic is too small for a
        judgeable window while the traffic itself is judged (see ``SbmPolicy.step``)."""
        total_rps = self._observed.total_rps
        starved = (any(w.enough_samples for w in stats if w.model == "baseline")
                   and self._sbm.coverage * total_rps * dt_s < self.config.min_samples)
        self._sbm.step(stats, allocation.sbm_accel_units, total_rps, rates.sbm_rps_per_accel,
                       ceiling=None if ceiling is None else ceiling.coverage, starved=starved,
                       allocation_limit=allocation.sbm_limit, rma_extra=rma_extra)
        return sbm_target(self._sbm.coverage, self._evidence.estimates.priorities(),
                          self._sbm.limited_by, self._sbm.extra_cap)

    def _allocate(self, now_ms: int, rates: UnitRates) -> Allocation:
        """Allocation of the scope's live capacity, each lever given what it could use."""
        seen = self._observed
        capacity = self._inventory.available(self.scope, now_ms, seen.serving)
        demand = demand_units(self.config, rates, self._rma.most(self._supply.most),
                              self._rma.settled_rate(seen.ranking_rps), seen.total_rps)
        return self._planner.allocate(capacity, demand, speeds(self._cost, self.config, capacity))

    def _emit(self, now_ms: int, rma: RmaTarget, sbm: SbmTarget, reason: Reason) -> ControlTargets:
        self._epoch += 1
        share = self._share
        targets = ControlTargets(v=_version(reason, sbm, share),
                                 scope=self.scope, epoch=self._epoch, issued_at_ms=now_ms,
                                 ttl_ms=self.config.ttl_ms, rma=rma, sbm=sbm,
                                 reason=reason, precompute=msgspec.UNSET if share is None
                                 else share)
        self._last_targets = targets
        return targets

    # -- state and telemetry -----------------------------------------------------------------

    def snapshot(self) -> ControllerState:
        return ControllerState(scope=self.scope, epoch=self._epoch,
                               last_tick_ms=self._last_tick_ms, last_targets=self._last_targets,
                               rma=self._rma.state, sbm=self._sbm.state,
                               precompute=self._precompute.state,
                               inventory=self._inventory.state,
                               estimates=self._evidence.estimates.state, observed=self._observed,
                               cost=self._cost.state,
                               override=self._override)

    @property
    def join(self) -> AttributionJoin:
        """Decisions waiting for labels, and the join's counts by reason."""
        return self._evidence.join

    @property
    def estimates(self) -> GainEstimator:
        """Per-segment gains and measured lift from joined decisions."""
        return self._evidence.estimates

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
        return self._evidence.report(self.scope, now_ms, self._epoch, self.curves_learned)

    @property
    def curves_learned(self) -> bool:
        """Whether the last allocation used measured value curves (else the configured)."""
        return self._planner.curves_learned

    @property
    def allocation(self) -> Allocation:
        """The allocation behind the last emitted targets (for telemetry)."""
        return self._planner.allocation

    @property
    def cost(self) -> CostModel:
        return self._cost

    @property
    def rma_policy(self) -> RmaPolicy:
        return self._rma

    @property
    def sbm_policy(self) -> SbmPolicy:
        return self._sbm
