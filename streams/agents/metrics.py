"""The control plane's Prometheus series: inputs, dead letters, targets, controller internals.

Each app has its own registry, so tests and benchmarks can run several in one process.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from schemas.build import register_standard_collectors
from schemas.contract import LIMIT_REASONS, ControlTargets, OperatorOverride, PrecomputeTarget
from streams.control.controller import ScopeController


class Metrics:
    """The control plane's Prometheus series (own registry: several apps may share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.events = Counter("surplus_control_events_total", "Input events handled",
                              ["topic"], registry=self.registry)
        self.reports = Counter("surplus_control_reports_total",
                               "WindowReports merged (a telemetry message may carry a batch)",
                               registry=self.registry)
        self.decisions = Counter("surplus_control_decisions_total",
                                 "Decision records taken (an outcomes message may carry a batch)",
                                 registry=self.registry)
        self.labels_received = Counter("surplus_control_labels_received_total",
                                       "Labels taken into the join (a labels message may carry "
                                       "a batch of one scope)", registry=self.registry)
        self.labels_joined = Counter("surplus_control_labels_total",
                                     "Labels and decisions of the attribution join, by outcome "
                                     "(joined, inline, late, orphan, duplicate, "
                                     "duplicate_decision, unlabelled, evicted)",
                                     ["scope", "outcome"], registry=self.registry)
        self._join_seen: dict[tuple[str, str], int] = {}
        self.labels_pending = Gauge("surplus_control_labels_pending",
                                    "Decisions held waiting for their label",
                                    ["scope"], registry=self.registry)
        self.lift = Gauge("surplus_control_lift",
                          "Measured lift per treated request against the holdout (value "
                          "units): lever all, sbm, rma, rma_per_extra, and where answers were "
                          "used precompute, precompute_per_hit (against the answer holdout); "
                          "stat measured, ci_low, ci_high", ["scope", "lever", "stat"],
                          registry=self.registry)
        self.segment_gain = Gauge("surplus_control_segment_gain",
                                  "Per-segment SBM gain (SNIPS over joined decisions): stat "
                                  "measured, ci_low, ci_high, and posterior (what the targets "
                                  "carry)", ["scope", "segment", "stat"],
                                  registry=self.registry)
        self.curves_learned = Gauge("surplus_control_value_curves_learned",
                                    "1 while the allocator uses value curves measured from "
                                    "labels, 0 while it uses the configured ones (the prior)",
                                    ["scope"], registry=self.registry)
        self.rejected = Counter("surplus_control_rejected_total",
                                "Input events sent to the dead-letter topic", ["topic", "reason"],
                                registry=self.registry)
        self.targets = Counter("surplus_control_targets_total", "ControlTargets published",
                               ["scope", "reason"], registry=self.registry)
        self.delivered = Counter("surplus_control_targets_delivered_total",
                                 "ControlTargets the cluster acknowledged (acked) or that could "
                                 "not be written (failed)", ["scope", "outcome"],
                                 registry=self.registry)
        self.acked_epoch = Gauge("surplus_control_targets_acked_epoch",
                                 "Highest epoch of the ControlTargets the cluster acknowledged",
                                 ["scope"], registry=self.registry)
        self._acked: dict[str, int] = {}
        self.extra = Gauge("surplus_control_extra_candidates", "RMA extra-candidate target",
                           ["scope"], registry=self.registry)
        self.coverage = Gauge("surplus_control_sbm_coverage", "SBM coverage target",
                              ["scope"], registry=self.registry)
        self.powerful_extra = Gauge("surplus_control_sbm_extra_candidates",
                                    "Extra candidates a request the powerful model serves may "
                                    "carry: RMA's target unless SBM caps it lower",
                                    ["scope"], registry=self.registry)
        self.limited_by = Gauge("surplus_control_limited_by",
                                "1 for what limits each lever's last target (sla, budget, "
                                "capacity, max, demand, preemption, hold, operator), else 0",
                                ["scope", "lever", "reason"], registry=self.registry)
        self.limited_targets = Counter("surplus_control_limited_targets_total",
                                       "Targets published, by lever and what limited it",
                                       ["scope", "lever", "reason"], registry=self.registry)
        self.precompute_share = Gauge(
            "surplus_control_precompute_share",
            "The precompute lever's share of a lent replica in the last target (set where "
            "lent replicas run the lever)", ["scope"], registry=self.registry)
        self.budget = Gauge("surplus_control_rma_budget_units_per_second",
                            "RMA extra-work budget of the last target (units/s)", ["scope"],
                            registry=self.registry)
        self.spread_rate = Gauge("surplus_control_rma_spread_request_rate",
                                 "Ranking requests/s the RMA budget was spread over in the last "
                                 "period (the settled rate, or the last one where lower)",
                                 ["scope"], registry=self.registry)
        self.unit_cost = Gauge("surplus_control_unit_cost_seconds",
                               "Measured replica-seconds one candidate (ranking model) or one "
                               "request (powerful model) costs", ["scope", "model", "per"],
                               registry=self.registry)
        self.unit_speed = Gauge("surplus_control_accelerator_unit_speed",
                                "Work one lent unit of an accelerator type does for a lever, "
                                "against its model's average unit (measured per model and "
                                "type; 1: the average)", ["scope", "lever", "accelerator"],
                                registry=self.registry)
        self.overrides = Counter("surplus_control_overrides_total",
                                 "Operator overrides taken (refused ones count in "
                                 "surplus_control_rejected_total{topic=\"overrides\"})",
                                 ["scope", "kind"], registry=self.registry)
        self.override_active = Gauge("surplus_control_override_active",
                                     "1 while the scope's last targets were shaped by an operator "
                                     "override (reason operator), else 0",
                                     ["scope"], registry=self.registry)
        self.restore_skipped = Counter("surplus_control_restore_skipped_total",
                                       "Stored scope states that could not be restored",
                                       registry=self.registry)
        self.restore_retries = Counter("surplus_control_restore_retries_total",
                                       "Reads of stored state (scope states, pending "
                                       "decisions) that failed and were tried again (the "
                                       "partitions stay unready meanwhile)",
                                       registry=self.registry)
        self.ticks_skipped = Counter("surplus_control_ticks_skipped_total",
                                     "Ticks not acted on, by reason", ["reason"],
                                     registry=self.registry)
        self.tick_seconds = Histogram("surplus_control_tick_seconds",
                                      "Time to run the controllers of one scope",
                                      registry=self.registry)

        self.pid = Gauge("surplus_control_rma_pid_component",
                         "RMA PID terms of the last period (p, i, d)", ["scope", "term"],
                         registry=self.registry)
        self.p99 = Gauge("surplus_control_window_p99_seconds",
                         "p99 latency of the last closed window", ["scope", "pool"],
                         registry=self.registry)
        self.p50 = Gauge("surplus_control_window_p50_seconds",
                         "p50 latency of the last closed window", ["scope", "pool"],
                         registry=self.registry)
        self.window_rps = Gauge("surplus_control_window_request_rate",
                                "Requests/s in the last closed window", ["scope", "pool"],
                                registry=self.registry)
        self.window_reports = Gauge("surplus_control_window_reports",
                                    "Worker reports merged into the last closed window (one "
                                    "a replica a report interval when none is late)",
                                    ["scope", "pool"], registry=self.registry)
        self.capacity = Gauge("surplus_control_opportunistic_units",
                              "Opportunistic capacity on the books: resource cpu_units (CPU "
                              "units) or an accelerator type (its units)", ["scope", "resource"],
                              registry=self.registry)
        self._accelerators: dict[str, set[str]] = {}
        """Accelerator types each scope's books have held (a type gone reads 0, not stale)."""
        self.lag = Gauge("surplus_control_consumer_lag",
                         "Messages behind the end of each input partition",
                         ["topic", "partition"], registry=self.registry)
        #: Two stages (``ControlPlaneSettings.stages``): parts sent and read, periods closed.
        self.parts_sent = Counter("surplus_control_stage_parts_sent_total",
                                  "First stage: per-scope period parts sent", ["shard"],
                                  registry=self.registry)
        self.parts_late = Counter("surplus_control_stage_parts_late_total",
                                  "Second stage: parts that came after their period closed "
                                  "(they join the open one)", ["scope"], registry=self.registry)
        self.periods_closed = Counter("surplus_control_stage_periods_total",
                                      "Second stage: periods closed, `complete` when every "
                                      "expected shard had spoken, else `grace`",
                                      ["scope", "how"], registry=self.registry)
        self.shards_missing = Counter("surplus_control_stage_shards_missing_total",
                                      "Second stage: expected shards missing when a period's "
                                      "grace ran out", ["scope"], registry=self.registry)
        register_standard_collectors(self.registry)

    def observe_targets(self, targets: ControlTargets) -> None:
        """A published target: its values, and per lever what keeps it from going higher."""
        scope = targets.scope
        self.targets.labels(scope, targets.reason).inc()
        self.extra.labels(scope).set(targets.rma.extra_candidates)
        self.coverage.labels(scope).set(targets.sbm.coverage)
        self.powerful_extra.labels(scope).set(targets.powerful_extra_candidates)
        self.budget.labels(scope).set(targets.rma.budget_units_per_s)
        self.override_active.labels(scope).set(1.0 if targets.reason == "operator" else 0.0)
        if isinstance(targets.precompute, PrecomputeTarget):
            self.precompute_share.labels(scope).set(targets.precompute.share)
        for lever, why in targets.limits:
            if why is None:
                continue
            self.limited_targets.labels(scope, lever, why).inc()
            for reason in LIMIT_REASONS:
                self.limited_by.labels(scope, lever, reason).set(1.0 if reason == why else 0.0)

    def observe_override(self, override: OperatorOverride) -> None:
        """An override taken: counted by what it does (a set may do several)."""
        kinds = ([k for k in ("kill", "freeze", "max_extra", "max_coverage")
                  if getattr(override, k) not in (None, False)]
                 if override.action == "set" else ["clear"])
        for kind in kinds:
            self.overrides.labels(override.scope, kind).inc()

    def observe_delivery(self, targets: ControlTargets, failed: bool) -> None:
        """The cluster's answer to one published target: what a reader of the targets topic
        can rely on finding there (acked), and what it cannot (failed, logged by Faust)."""
        scope = targets.scope
        if failed:
            self.delivered.labels(scope, "failed").inc()
            return
        # The epoch first: a scrape between the two never shows an acked count that the
        # epoch does not cover.
        self._acked[scope] = max(self._acked.get(scope, 0), targets.epoch)
        self.acked_epoch.labels(scope).set(self._acked[scope])
        self.delivered.labels(scope, "acked").inc()

    def observe_controller(self, scope: str, controller: ScopeController) -> None:
        """Controller internals after a tick: PID terms, windows, inventory."""
        for term, value in zip("pid", controller.rma_policy.pid.components, strict=True):
            self.pid.labels(scope, term).set(value)
        self.spread_rate.labels(scope).set(controller.rma_policy.spread_rate)
        for window in controller.last_windows:
            self.p99.labels(scope, window.pool_id).set(window.p99_ms / 1000.0)
            self.p50.labels(scope, window.pool_id).set(window.p50_ms / 1000.0)
            self.window_rps.labels(scope, window.pool_id).set(window.request_rate)
            self.window_reports.labels(scope, window.pool_id).set(window.reports)
        cost, cfg = controller.cost, controller.config
        if cost.evidence_s("baseline") > 0:
            self.unit_cost.labels(scope, "baseline", "candidate").set(
                cost.seconds_per_unit("baseline", cfg.rma.candidates_per_accel_unit_s))
        if cost.evidence_s("powerful") > 0:
            self.unit_cost.labels(scope, "powerful", "request").set(cost.seconds_per_unit(
                "powerful", cfg.sbm.powerful_rps_per_accel_unit, per="requests"))
        allocation = controller.allocation
        for lever, held, speeds in (("rma", allocation.rma_accel, allocation.speeds.rma),
                                    ("sbm", allocation.sbm_accel, allocation.speeds.sbm)):
            for kind in sorted(held):
                self.unit_speed.labels(scope, lever, kind).set(speeds.get(kind, 1.0))
        join = controller.join
        for outcome, n in join.counts.items():
            seen = self._join_seen.get((scope, outcome), 0)
            if n > seen:  # the controller's counts only grow (a new controller: from 0)
                self.labels_joined.labels(scope, outcome).inc(n - seen)
            self._join_seen[scope, outcome] = n
        self.labels_pending.labels(scope).set(len(join))
        estimates = controller.estimates
        for lever, est in estimates.lift().items():
            for stat in ("measured", "ci_low", "ci_high"):
                value = getattr(est, stat)
                if value is not None:
                    self.lift.labels(scope, lever, stat).set(value)
        for segment, est in estimates.gains().items():
            for stat in ("measured", "ci_low", "ci_high"):
                value = getattr(est, stat)
                if value is not None:
                    self.segment_gain.labels(scope, segment, stat).set(value)
        self.curves_learned.labels(scope).set(1.0 if controller.curves_learned else 0.0)
        targets = controller.last_targets
        if targets is not None:
            for segment, priority in targets.sbm.segments.items():
                self.segment_gain.labels(scope, segment, "posterior").set(priority.gain_mean)
        capacity = controller.capacity
        # CPU units under their own name: "cpu" is also an accelerator type (a CPU replica)
        self.capacity.labels(scope, "cpu_units").set(capacity.cpu_units)
        types = self._accelerators.setdefault(scope, set())
        types.update(capacity.accel)
        for accelerator in sorted(types):
            self.capacity.labels(scope, accelerator).set(capacity.accel.get(accelerator, 0.0))

    def observe_lag(self, monitor: Any) -> None:
        """Lag per input partition from Faust's monitor (end offset minus read offset)."""
        ends = dict(monitor.tp_end_offsets or {})
        for tp, read in dict(monitor.tp_read_offsets or {}).items():
            end = ends.get(tp)
            if end is not None:
                self.lag.labels(tp.topic, str(tp.partition)).set(max(0, end - read - 1))
