"""The control plane's Prometheus series: inputs, dead letters, targets, controller internals.

Each app has its own registry, so tests and benchmarks can run several in one process.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.rejected = Counter("surplus_control_rejected_total",
                                "Input events sent to the dead-letter topic", ["topic", "reason"],
                                registry=self.registry)
        self.targets = Counter("surplus_control_targets_total", "ControlTargets published",
                               ["scope", "reason"], registry=self.registry)
        self.extra = Gauge("surplus_control_extra_candidates", "RMA extra-candidate target",
                           ["scope"], registry=self.registry)
        self.coverage = Gauge("surplus_control_sbm_coverage", "SBM coverage target",
                              ["scope"], registry=self.registry)
        self.restore_skipped = Counter("surplus_control_restore_skipped_total",
                                       "Stored scope states that could not be restored",
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
        self.p99 = Gauge("surplus_control_window_p99_ms", "p99 latency of the last closed window",
                         ["scope", "pool"], registry=self.registry)
        self.p50 = Gauge("surplus_control_window_p50_ms", "p50 latency of the last closed window",
                         ["scope", "pool"], registry=self.registry)
        self.window_rps = Gauge("surplus_control_window_request_rate",
                                "Requests/s in the last closed window", ["scope", "pool"],
                                registry=self.registry)
        self.capacity = Gauge("surplus_control_opportunistic_units",
                              "Opportunistic capacity on the books", ["scope", "resource"],
                              registry=self.registry)
        self.lag = Gauge("surplus_control_consumer_lag",
                         "Messages behind the end of each input partition",
                         ["topic", "partition"], registry=self.registry)

    def observe_controller(self, scope: str, controller: ScopeController) -> None:
        """Controller internals after a tick: PID terms, windows, inventory."""
        for term, value in zip("pid", controller.rma_policy.pid.components, strict=True):
            self.pid.labels(scope, term).set(value)
        for window in controller.last_windows:
            self.p99.labels(scope, window.pool_id).set(window.p99_ms)
            self.p50.labels(scope, window.pool_id).set(window.p50_ms)
            self.window_rps.labels(scope, window.pool_id).set(window.request_rate)
        capacity = controller.capacity
        self.capacity.labels(scope, "cpu").set(capacity.cpu_units)
        for accelerator, units in capacity.accel.items():
            self.capacity.labels(scope, accelerator).set(units)

    def observe_lag(self, monitor: Any) -> None:
        """Lag per input partition from Faust's monitor (end offset minus read offset)."""
        ends = dict(monitor.tp_end_offsets or {})
        for tp, read in dict(monitor.tp_read_offsets or {}).items():
            end = ends.get(tp)
            if end is not None:
                self.lag.labels(tp.topic, str(tp.partition)).set(max(0, end - read - 1))
