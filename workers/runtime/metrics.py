"""Prometheus metrics of one worker, in a registry of its own (several workers per test process).

Event metrics (latencies, batch sizes, preemption reaction) are observed as they happen.
State that already lives elsewhere — shed counts in admission, target verdicts in the target
state, the current targets, the queue — is read at scrape time by a collector, so there is one
source of truth and nothing to keep in sync.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from schemas.build import register_standard_collectors
from workers.policy.admission import AdmissionState
from workers.policy.targets import EffectiveTargets

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
#: Fine around the 5 ms target: a run sees few notices, and its p99 is read within a bucket.
REACTION_BUCKETS_S = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.006, 0.0075, 0.01,
                      0.015, 0.02, 0.05, 0.1, 0.5, 1.0)
#: Up to a CUDA worker's default cap (`DEFAULT_BATCH_ROWS`).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """State read at scrape time."""

    admission: AdmissionState
    targets: EffectiveTargets
    target_verdicts: dict[str, int]
    in_flight: int
    #: Age of the held targets on the control plane's clock; None when none was accepted.
    targets_age_ms: int | None = None


class _StateCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        shed = CounterMetricFamily("surplus_worker_optional_shed_units",
                                   "Optional work units (rows) shed, by reason", labels=["reason"])
        for reason, units in sorted(snap.admission.shed_units.items()):
            shed.add_metric([reason], units)
        yield shed
        verdicts = CounterMetricFamily("surplus_worker_target_verdicts",
                                       "Targets offered to this worker, by verdict",
                                       labels=["verdict"])
        for verdict, n in sorted(snap.target_verdicts.items()):
            verdicts.add_metric([verdict], n)
        yield verdicts
        t = snap.targets
        for name, value, doc in (
                ("extra_candidates", t.extra_candidates, "RMA extra candidates allowed now"),
                ("coverage", t.coverage, "SBM coverage in force now"),
                ("budget_units_per_second", t.budget_units_per_s,
                 "Optional-work budget in force (units/s)"),
                ("epoch", t.epoch, "Epoch of the targets held (-1: none)"),
                ("baseline_only", int(t.baseline_only), "1 when only baseline work is done")):
            yield GaugeMetricFamily(f"surplus_worker_targets_{name}", doc, value=float(value))
        age = snap.targets_age_ms
        yield GaugeMetricFamily("surplus_worker_targets_age_seconds",
                                "Age of the targets held, on the control plane's clock "
                                "(-1: none yet)", value=-1.0 if age is None else age / 1000.0)
        a = snap.admission
        for name, value, doc in (
                ("queue_delay_seconds", a.queue_delay_ms / 1000.0, "Predicted queue delay"),
                ("shedding_level", a.shedding_level, "Shedding level told to clients (0-3)"),
                ("preempted", int(a.preempted), "1 while optional work is stopped by preemption"),
                ("queued_baseline_units", a.baseline_units, "Baseline rows queued"),
                ("queued_optional_units", a.optional_units, "Optional rows queued"),
                ("in_flight_requests", snap.in_flight, "Requests being served")):
            yield GaugeMetricFamily(f"surplus_worker_{name}", doc, value=float(value))


class WorkerMetrics:
    """All metrics of one worker; ``registry`` is what /metrics renders."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self.latency = Histogram("surplus_worker_latency_seconds",
                                 "Time from request arrival to its scores, by work class",
                                 ["work_class"], buckets=LATENCY_BUCKETS_S, registry=reg)
        self.queue_wait = Histogram("surplus_worker_queue_wait_seconds",
                                    "Time work waited for a forward pass, by work class",
                                    ["work_class"], buckets=LATENCY_BUCKETS_S, registry=reg)
        self.batch_rows = Histogram("surplus_worker_batch_rows", "Rows per forward pass",
                                    buckets=BATCH_BUCKETS, registry=reg)
        self.forward = Histogram("surplus_worker_forward_seconds", "Forward pass duration",
                                 buckets=LATENCY_BUCKETS_S, registry=reg)
        self.requests = Counter("surplus_worker_requests", "Rank requests by outcome",
                                ["outcome"], registry=reg)
        self.preemption_reaction = Histogram(
            "surplus_worker_preemption_reaction_seconds",
            "PreemptionNotice ts_ms to optional work stopped on this worker",
            buckets=REACTION_BUCKETS_S, registry=reg)
        self.preemption_delivery = Histogram(
            "surplus_worker_preemption_delivery_seconds",
            "PreemptionNotice ts_ms to read by this worker, for the notices acted on: the part "
            "of the reaction that is Kafka's and the scheduler's", buckets=REACTION_BUCKETS_S,
            registry=reg)
        self.preemptions = Counter("surplus_worker_preemptions", "Preemption notices acted on",
                                   registry=reg)
        self.notices = Counter("surplus_worker_preemption_notices",
                               "Preemption notices read, by the path they came by (kafka, "
                               "http) and what they did (applied, duplicate: the other path "
                               "was first, not_mine, stale; refused for their signature: "
                               "unsigned, unknown_key, bad_signature, stale_request)",
                               ["path", "outcome"], registry=reg)
        self.kafka_outages = Counter("surplus_worker_kafka_outages",
                                     "Times the worker lost its Kafka brokers", registry=reg)
        self.kafka_up = Gauge("surplus_worker_kafka_up", "1 while Kafka answers", registry=reg)
        self.kafka_messages = Counter("surplus_worker_kafka_messages",
                                      "Kafka messages handled, by topic and outcome",
                                      ["topic", "outcome"], registry=reg)
        self.kafka_lag = Gauge("surplus_worker_kafka_lag_messages",
                               "Messages behind the end of the topic, by consumer",
                               ["topic"], registry=reg)
        self.deadletters = Counter("surplus_worker_deadletters",
                                   "Messages sent to the dead-letter topic, by source topic",
                                   ["source"], registry=reg)
        self.reports = Counter("surplus_worker_window_reports",
                               "WindowReports published, by outcome", ["outcome"], registry=reg)
        self.announcements = Counter("surplus_worker_membership_announcements",
                                     "Membership announcements sent (replicas topic), by state "
                                     "(serving, draining, tombstone)", ["state"], registry=reg)
        self.precompute_jobs = Counter("surplus_worker_precompute_jobs",
                                       "Precompute jobs by outcome (answered, expired, "
                                       "not_ours, refused, undelivered, model_failure)",
                                       ["outcome"], registry=reg)
        self.precompute_rows = Counter("surplus_worker_precompute_rows",
                                       "Candidate rows scored for precompute jobs", registry=reg)
        self.precompute_stop = Histogram(
            "surplus_worker_precompute_stop_seconds",
            "PreemptionNotice ts_ms to precompute stopped on this worker: at the notice, or "
            "at the end of the slice in service when it came", buckets=REACTION_BUCKETS_S,
            registry=reg)
        self.precompute_busy = Counter("surplus_worker_precompute_busy_seconds",
                                       "Seconds the model spent on precompute slices (idle "
                                       "time it filled)", registry=reg)
        reg.register(_StateCollector(snapshot))
        register_standard_collectors(reg)
