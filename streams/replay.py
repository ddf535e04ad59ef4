"""Offline replay: the live control loop, run over an event log on a virtual clock, no Kafka.

``ControlDriver`` turns a time-ordered stream of logged events into calls on
``streams.control.ScopeController`` — one controller per scope, created on the scope's first
event, each event handed over by the same rulebook the live agents use
(``streams.control.dispatch``) — and ticks them on a fixed grid of event time: every multiple of
``period_s`` since the epoch. Events stamped at or before a tick belong to the period that tick
closes. Each controller runs with its scope's config (``ControlConfig.for_scope``, as live), so a
scope with a ``[scopes.<region>]`` period of its own ticks on the multiples of that period.
The fleet simulator drives its control plane through the same driver, in the same order it
writes its log, so replaying a simulation's log reproduces the simulation's targets exactly.

``replay_offline`` writes, into one directory, ``targets.csv`` and ``windows.csv``
(``streams.replay_output.ReplayOutput``), ``estimates.json`` (per scope: the decision/label
join's counts, the measured lift per lever and each segment's gain and posterior, as
``estimates_of`` gives them) and ``summary.json``: what was read, what was rejected
and why, and per scope what the targets did and how often the ranking pools were over their SLA.
Nothing in them depends on the wall clock, the machine or the directory: the same log and the
same settings give byte-identical files. ``compare_offline`` runs several settings over one log
and adds a side-by-side ``summary.json`` and an HTML page with plots (``streams.replay_report``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec

from schemas.contract import ControlTargets, WindowReport
from schemas.topics import scope_partition
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController
from streams.control.dispatch import RULES, Rejected, Rule, dispatch, rule_for
from streams.control.shards import ShardWindows
from streams.eventlog import EVENT_CLASSES, AnyEvent, LogEvent, TargetsEvent, read_events
from streams.replay_output import (
    Progress,
    ReplayOutput,
    comparison_table,
    config_digest,
    dump_json,
)

TargetsHook = Callable[[ControlTargets, ScopeController], None]
TickHook = Callable[[int, ScopeController], None]
RecordedHook = Callable[[TargetsEvent], None]

_RULES: dict[type[LogEvent], Rule | None] = {cls: rule_for(topic)
                                             for topic, cls in EVENT_CLASSES.items()}
"""The rule of each kind of log event (None: recorded targets, never fed to a controller)."""
_TELEMETRY = RULES["telemetry"]


class _Controllers(dict[str, ScopeController]):
    """Controllers by scope; looking up a scope that has none creates its controller."""

    def __init__(self, config: ControlConfig) -> None:
        super().__init__()
        self.config = config

    def __missing__(self, scope: str) -> ScopeController:
        controller = self[scope] = ScopeController(scope, self.config.for_scope(scope))
        return controller


class ControlDriver:
    """Feeds logged events to per-scope ``ScopeController``s and ticks them on a virtual clock.

    ``feed`` takes events in time order; an event older than the last tick (a late message of
    a tapped stream) is applied at the last tick's time and counted in ``late``. Events whose
    key is not their scope, or that a controller refuses (unlike sketches, too many pools), are
    counted in ``rejected`` by reason (``streams.control.dispatch``), as the live agent
    dead-letters them; ``by_topic`` counts the events fed. Hooks see every emitted target
    (``on_targets``), every tick (``on_tick``) and recorded targets in the log (``on_recorded``,
    never fed to a controller).
    """

    def __init__(self, config: ControlConfig, *, on_targets: TargetsHook | None = None,
                 on_tick: TickHook | None = None,
                 on_recorded: RecordedHook | None = None, shards: int = 0) -> None:
        """:param shards: 0: every scope's reports reach its controller (one reader a scope);
            K > 0: they pass through K first-stage shards, a replica's to the shard its key
            would land on among K partitions, and reach the controller as the shards' parts
            at each tick (``streams.control.shards``), as a scaled-out plane runs them.
        """
        if shards < 0:
            raise ValueError(f"shards must be >= 0, not {shards}")
        self.config = config
        self.period_ms = config.period_ms
        self._periods = config.periods_ms()
        self._next_by_period = dict.fromkeys(self._periods, -math.inf)
        self._last_by_period: dict[int, float] = dict.fromkeys(self._periods, -math.inf)
        self.controllers: dict[str, ScopeController] = _Controllers(config)
        self._controller_for = self.controllers.__getitem__
        self.on_targets = on_targets
        self.on_tick = on_tick
        self.on_recorded = on_recorded
        self.rejected: dict[str, int] = {}
        self._counts: dict[type[LogEvent], int] = dict.fromkeys(_RULES, 0)
        self.late = 0
        self.ticks = 0
        self.first_ts: int | None = None
        self.last_ts: int | None = None
        self.last_tick_ms: int | None = None
        self._next_tick = -math.inf
        self._floor = -math.inf
        self._late_since = False
        self._shards = [ShardWindows(f"shard-{i}", lambda scope: config.for_scope(scope).period_ms,
                                     min_samples=config.min_samples,
                                     relative_accuracy=config.relative_accuracy,
                                     max_pools=config.max_pools) for i in range(shards)]

    # -- the clock ---------------------------------------------------------------------------

    def advance(self, now_ms: int) -> None:
        """Run every tick due at or before ``now_ms`` (all events up to it have been fed)."""
        if self.first_ts is None:
            return
        while self._next_tick <= now_ms:
            self._tick(int(self._next_tick))

    def finish(self) -> None:
        """Close the last, partial period of every control period that saw events after its
        last tick (one tick when every scope shares one period)."""
        if self.first_ts is None or self.last_ts is None:
            return
        last_ts, late = self.last_ts, self._late_since
        open_ = [self._next_by_period[p] for p in self._periods
                 if late or last_ts > self._last_by_period[p]]
        if open_:
            stop = max(open_)
            while self._next_tick <= stop:
                self._tick(int(self._next_tick))

    def _tick(self, tick_ms: int) -> None:
        """One tick of the grid: every controller whose period has a multiple here."""
        self.ticks += 1
        self.last_tick_ms = tick_ms
        self._floor = tick_ms
        self._late_since = False
        due = set()
        for period, at in self._next_by_period.items():
            if at <= tick_ms:
                due.add(period)
                self._last_by_period[period] = tick_ms
                self._next_by_period[period] = tick_ms + period
        self._next_tick = min(self._next_by_period.values())
        for shard in self._shards:
            for part in shard.due(tick_ms):
                self.controllers[part.region].on_partial(part, tick_ms)
        every = len(due) == len(self._periods)
        for scope in sorted(self.controllers):
            controller = self.controllers[scope]
            if not every and controller.config.period_ms not in due:
                continue
            targets = controller.tick(tick_ms)
            if self.on_tick is not None:
                self.on_tick(tick_ms, controller)
            if self.on_targets is not None:
                self.on_targets(targets, controller)

    def _start(self, ts: int) -> None:
        self.first_ts = ts
        for period in self._periods:
            self._next_by_period[period] = (ts // period + 1) * period
        self._next_tick = min(self._next_by_period.values())

    # -- events ------------------------------------------------------------------------------

    def feed(self, event: AnyEvent) -> None:
        """Apply one event at its timestamp (ticks that fall before it run first).

        The common case (a WindowReport inside the open period) is kept to a few attribute
        reads and one ``dispatch``: offline replay runs it 200,000+ times a second.
        """
        ts = event.ts
        if ts > self._next_tick or ts < self._floor:
            ts = self._clock_slow(ts)
        self.last_ts = ts
        cls = type(event)
        self._counts[cls] += 1
        rule = _RULES[cls]
        if rule is None:
            if self.on_recorded is not None and cls is TargetsEvent:
                self.on_recorded(event)  # type: ignore[arg-type]
            return
        if rule is _TELEMETRY and self._shards:
            self._to_shard(event.key, event.value, ts)  # type: ignore[arg-type]
            return
        try:
            targets = dispatch(rule, event.key, event.value, self._controller_for, ts)
        except Rejected as exc:
            self.rejected[exc.reason] = self.rejected.get(exc.reason, 0) + 1
            return
        if targets is not None and self.on_targets is not None:
            self.on_targets(targets, self.controllers[targets.scope])

    def _to_shard(self, key: str | None, report: WindowReport, ts: int) -> None:
        """A report through the first stage: the shard its replica's key lands on."""
        shard = self._shards[scope_partition(report.worker_id, len(self._shards))]
        try:
            shard.take(key, (report,), ts)
        except Rejected as exc:
            self.rejected[exc.reason] = self.rejected.get(exc.reason, 0) + 1

    def _clock_slow(self, ts: int) -> int:
        """The first event, an event past the next tick, or a late one: the time to apply at."""
        if self.first_ts is None:
            self._start(ts)
        if ts > self._next_tick:
            self.advance(ts - 1)
        if ts < self._floor:
            self.late += 1
            self._late_since = True
            return int(self._floor)
        return ts

    @property
    def by_topic(self) -> dict[str, int]:
        """Events fed, by logical topic (topics with none are left out)."""
        return {cls.topic: n for cls, n in self._counts.items() if n}

    def run(self, events: Iterable[AnyEvent]) -> None:
        feed = self.feed
        for event in events:
            feed(event)
        self.finish()


def estimates_of(controllers: dict[str, ScopeController]) -> dict[str, Any]:
    """What the scopes' controllers measured from joined decisions and labels (plain JSON):
    the join's counts and pending decisions, lift per lever, per-segment gain and posterior.
    A function of the events fed only, so a recorded log replays to the same bytes."""
    out: dict[str, Any] = {}
    for scope in sorted(controllers):
        c = controllers[scope]
        est = c.estimates
        out[scope] = {
            "join": dict(sorted(c.join.counts.items())), "pending": len(c.join),
            "counts": est.counts(),
            "lift": {k: msgspec.to_builtins(v) for k, v in sorted(est.lift().items())},
            "gains": {k: msgspec.to_builtins(v) for k, v in est.gains().items()},
            "priorities": {k: msgspec.to_builtins(v) for k, v in est.priorities().items()},
        }
    return out


def replay_offline(log: str | Path, config: ControlConfig, out_dir: str | Path, *,
                   strict: bool = False, progress: bool = False,
                   label: str | None = None, shards: int = 0) -> dict[str, Any]:
    """Run ``config``'s control loop over ``log``; write the outputs; return the summary.
    ``shards``: through that many first-stage shards (``ControlDriver``); 0: one reader."""
    log, out = Path(log), Path(out_dir)
    reader = read_events(log, strict=strict)
    output = ReplayOutput(out, config)
    driver = ControlDriver(config, on_targets=output.on_targets, on_tick=output.on_tick,
                           on_recorded=output.on_recorded, shards=shards)
    meter = Progress(f"replay {label or log.name}", enabled=progress)
    try:
        feed = driver.feed
        if progress:
            for n, event in enumerate(reader, 1):
                feed(event)
                if not n & 0xFFFF:
                    meter.update(f"{n:,} events")
        else:
            for event in reader:
                feed(event)
        driver.finish()
    finally:
        output.close()
    summary = {
        "log": log.name,
        "log_bytes": log.stat().st_size,
        "config_digest": config_digest(config),
        "config": msgspec.to_builtins(config),
        "read": reader.stats(),
        "events_by_topic": dict(sorted(driver.by_topic.items())),
        "rejected": dict(sorted(driver.rejected.items())),
        "late_events": driver.late,
        "first_ts_ms": driver.first_ts,
        "last_ts_ms": driver.last_ts,
        "ticks": driver.ticks,
        "period_s": config.period_s,
        "scopes": output.scope_summaries(),
    }
    if shards:
        summary["shards"] = shards
    (out / "estimates.json").write_text(dump_json(estimates_of(driver.controllers)),
                                        encoding="utf-8")
    (out / "summary.json").write_text(dump_json(summary), encoding="utf-8")
    meter.done(f"{reader.events:,} events, {driver.ticks:,} ticks -> {out}")
    return summary


def compare_offline(log: str | Path, configs: list[tuple[str, ControlConfig]],
                    out_dir: str | Path, *, strict: bool = False,
                    progress: bool = False) -> dict[str, Any]:
    """Replay ``log`` once per (label, config) into ``out_dir/label``; side-by-side report."""
    out = Path(out_dir)
    labels = [label for label, _ in configs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"compare labels must differ, got {labels}")
    runs = {label: replay_offline(log, config, out / label, strict=strict, progress=progress,
                                  label=label)
            for label, config in configs}
    summary = {"log": Path(log).name, "labels": labels, "runs": runs,
               "table": comparison_table(runs)}
    (out / "summary.json").write_text(dump_json(summary), encoding="utf-8")
    from streams.replay_report import write_compare_report

    write_compare_report(out, labels)
    return summary
