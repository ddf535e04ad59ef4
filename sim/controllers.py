"""Control planes the simulator can run, selected by name.

- ``surplus``: the real control core (``ScopeController`` per region) driven through
  ``streams.replay.ControlDriver``, the same driver offline replay uses (and the same rulebook,
  ``streams.control.dispatch``, as the live agents), so replaying the simulation's own log
  reproduces its targets exactly;
- ``static``: fixed targets from the scenario, re-issued every period (default: none);
- ``greedy``: always the maximum optional work the control config allows;
- ``naive``: the textbook loop a team writes first: multiply extra candidates by 1.1 when the
  ranking p99 is under 0.9 x SLA and more than 30% of capacity is spare, by 0.9 when p99 is
  over 0.95 x SLA; a fixed coverage target that clients fill with high-value requests. It
  measures p99 with the same latency windows as ``surplus`` but has no capacity model and no
  preemption fast path;
- ``off``: no control plane at all: workers and clients stay at baseline only.

Every control plane sees the events in the order the simulation publishes them and ticks on
the same grid (multiples of ``period_s``), and answers with ``ControlTargets``.
"""

from __future__ import annotations

from collections.abc import Callable

from schemas.contract import ControlTargets, RmaTarget, SbmTarget
from sim.scenario import NaiveConfig, StaticConfig
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController
from streams.control.dispatch import RULES
from streams.control.windows import WindowSet, WindowStats
from streams.eventlog import AnyEvent, TelemetryEvent
from streams.replay import ControlDriver

CONTROLLERS = ("surplus", "static", "greedy", "naive", "off")
ALIASES = {"pid": "surplus"}
GREEDY_BUDGET = 1e9
TELEMETRY = RULES["telemetry"]


class ControlPlane:
    """Interface: events in (publication order), targets out."""

    name = "base"

    def feed(self, event: AnyEvent) -> list[ControlTargets]:
        """One event from the log in publication order; the targets it caused (a notice can
        cut them at once, without waiting for the period)."""
        return []

    def advance(self, now_ms: int) -> list[ControlTargets]:
        """Simulated time reached ``now_ms`` with no event: the periods that closed meanwhile
        still tick, as the live control plane's timer does."""
        return []

    def finish(self) -> list[ControlTargets]:
        """The run ended: whatever the last, partial period publishes."""
        return []


class SurplusPlane(ControlPlane):
    name = "surplus"

    def __init__(self, config: ControlConfig) -> None:
        self._out: list[ControlTargets] = []
        self.driver = ControlDriver(config, on_targets=self._emitted)

    def _emitted(self, targets: ControlTargets, _controller: ScopeController) -> None:
        self._out.append(targets)

    def _drain(self) -> list[ControlTargets]:
        out, self._out = self._out, []
        return out

    def feed(self, event: AnyEvent) -> list[ControlTargets]:
        self.driver.feed(event)
        return self._drain()

    def advance(self, now_ms: int) -> list[ControlTargets]:
        self.driver.advance(now_ms)
        return self._drain()

    def finish(self) -> list[ControlTargets]:
        self.driver.finish()
        return self._drain()


class GridPlane(ControlPlane):
    """Ticks every region on the period grid and asks ``decide`` for each region's targets."""

    def __init__(self, config: ControlConfig, regions: list[str],
                 decide: Callable[[str, int], tuple[RmaTarget, SbmTarget]]) -> None:
        self.config = config
        self.regions = sorted(regions)
        self.decide = decide
        self.epoch = dict.fromkeys(self.regions, 0)
        self._next: int | None = None

    def feed(self, event: AnyEvent) -> list[ControlTargets]:
        if self._next is None:
            self._next = (event.ts // self.config.period_ms + 1) * self.config.period_ms
        self.observe(event)
        return []

    def observe(self, event: AnyEvent) -> None:
        """What a subclass learns from an event between ticks (nothing, for fixed targets)."""
        return None

    def advance(self, now_ms: int) -> list[ControlTargets]:
        """One set of targets a region for every period boundary up to ``now_ms``, issued at
        the boundary, so that fixed settings age and expire as live ones do."""
        out: list[ControlTargets] = []
        while self._next is not None and self._next <= now_ms:
            tick = self._next
            for region in self.regions:
                rma, sbm = self.decide(region, tick)
                self.epoch[region] += 1
                out.append(ControlTargets(scope=region, epoch=self.epoch[region],
                                          issued_at_ms=tick, ttl_ms=self.config.ttl_ms,
                                          rma=rma, sbm=sbm))
            self._next = tick + self.config.period_ms
        return out


def static_plane(config: ControlConfig, regions: list[str], fixed: StaticConfig) -> GridPlane:
    """The same targets every period: one point of best-static's grid, or a team's setting."""
    rma = RmaTarget(extra_candidates=fixed.extra_candidates,
                    budget_units_per_s=fixed.budget_units_per_s)
    sbm = SbmTarget(coverage=fixed.coverage)
    plane = GridPlane(config, regions, lambda region, tick: (rma, sbm))
    plane.name = "static"
    return plane


def greedy_plane(config: ControlConfig, regions: list[str]) -> GridPlane:
    """Every maximum, every period, with no budget: what the workers' and clients' fast
    layers make of sending everything, the comparison an adaptive loop must beat."""
    rma = RmaTarget(extra_candidates=config.rma.max_extra_candidates,
                    budget_units_per_s=GREEDY_BUDGET)
    sbm = SbmTarget(coverage=config.sbm.max_coverage)
    plane = GridPlane(config, regions, lambda region, tick: (rma, sbm))
    plane.name = "greedy"
    return plane


class NaivePlane(GridPlane):
    """The textbook multiplicative loop (see the module docstring)."""

    name = "naive"

    def __init__(self, config: ControlConfig, regions: list[str], naive: NaiveConfig) -> None:
        super().__init__(config, regions, self._decide)
        self.naive = naive
        self.extra = {r: float(naive.initial_extra) for r in self.regions}
        self.windows = {r: WindowSet(config.min_samples, config.relative_accuracy)
                        for r in self.regions}

    def observe(self, event: AnyEvent) -> None:
        """Reports of its regions, keyed as the rulebook demands (a lying key is passed by)."""
        if type(event) is TelemetryEvent:
            region = TELEMETRY.scope(event.value)
            if event.key == region and region in self.windows:
                self.windows[region].add(event.value)

    def _decide(self, region: str, tick: int) -> tuple[RmaTarget, SbmTarget]:
        stats = [w for w in self.windows[region].close(tick) if w.model == "baseline"]
        cfg, sla = self.naive, self.config.rma.sla_p99_ms
        judged = [w.p99_ms for w in stats if w.enough_samples]
        if judged:
            p99 = max(judged)
            spare = 1.0 - _utilisation(stats)
            extra = self.extra[region]
            if p99 > cfg.cut_above * sla:
                extra *= cfg.down
            elif p99 < cfg.raise_below * sla and spare > cfg.spare_above:
                extra *= cfg.up
            self.extra[region] = min(max(extra, 1.0), float(self.config.rma.max_extra_candidates))
        rma = RmaTarget(extra_candidates=int(self.extra[region]),
                        budget_units_per_s=GREEDY_BUDGET)
        return rma, SbmTarget(coverage=cfg.coverage_target)


def _utilisation(stats: list[WindowStats]) -> float:
    """Capacity-weighted mean utilisation of the ranking pools (plain mean without capacity)."""
    weight = sum(w.capacity_rps for w in stats)
    if weight > 0:
        return sum(w.utilisation * w.capacity_rps for w in stats) / weight
    return sum(w.utilisation for w in stats) / len(stats) if stats else 0.0


def make_plane(name: str, config: ControlConfig, regions: list[str], *,
               static: StaticConfig, naive: NaiveConfig) -> ControlPlane:
    """The control plane called ``name`` (``pid`` is an alias of ``surplus``)."""
    name = ALIASES.get(name, name)
    if name == "surplus":
        return SurplusPlane(config)
    if name == "static":
        return static_plane(config, regions, static)
    if name == "greedy":
        return greedy_plane(config, regions)
    if name == "naive":
        return NaivePlane(config, regions, naive)
    if name == "off":
        plane = ControlPlane()
        plane.name = "off"
        return plane
    raise ValueError(f"unknown controller {name!r}; known: {', '.join(CONTROLLERS)} "
                     f"(alias: pid = surplus)")
