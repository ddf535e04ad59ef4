"""What one replica saw in one reporting interval, turned into a `WindowReport`: the report
rule the live worker and the simulated worker share.

Request handlers record each request's latency and work; the telemetry publisher closes the
window once per interval. Shed counts, queue state and busy time are cumulative totals kept by
the batcher and admission; a window reports their growth since the previous window.

`busy_s` and `units_done` are what the replica's work cost and bought in the window: the control
plane learns the cost of one unit from them (``streams.control.cost``).

`capacity_rps` is the worker's own estimate of how many requests per second it could serve if
it were busy all the time: rows scored per busy second (measured, so it reflects the real
model and batch sizes) divided by the rows an average request it served cost in the window.
On a replica that serves whole requests (the powerful model) a request's cost is its base
rows: its extras are fitted into what is idle and give way when it is busy (the admission
bound), so counting them would shrink the capacity by work that never displaces a request,
and SBM's coverage with it (`azure_steady_tight`: coverage held near 0.5 by extras the
replica would have dropped for the next request's base). A
request it refused (a powerful replica's 503) cost nothing and does not count: an overloaded
replica that counted them would look smaller the more it refused, and SBM's coverage would
fall by more than the work refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgspec import UNSET, UnsetType

from schemas.contract import (
    PRECOMPUTE_SHARE_VERSION,
    ROOM_VERSION,
    SCHEMA_VERSION,
    ModelKind,
    Tier,
    WindowReport,
)
from schemas.sketch import new_sketch, to_wire
from workers.policy.admission import AdmissionState


@dataclass(frozen=True, slots=True)
class LoadTotals:
    """Cumulative counters read from the batcher and admission when a window closes."""

    rows_done: int
    busy_s: float
    shed_units: dict[str, int]
    queue_items: int
    queue_delay_ms: float
    ms_per_unit: float
    replicas: int = 1
    """Replicas serving in parallel behind this report (the simulator's replica sets): busy
    time is reported in replica-seconds, the unit a cost per candidate is measured in."""
    extras_room: int | None = None
    """Not a total: the most extras one request could have kept over the window
    (``Admission.take_room``), None when no request carried any."""
    precompute_busy_s: float | None = None
    """Seconds of its CPU quota the replica spent scoring precompute jobs since start (their
    time over the quota's cores; one core without a quota); None where it does not run the
    lever."""

    @classmethod
    def of(cls, state: AdmissionState, rows_done: int, busy_s: float,
           replicas: int = 1, extras_room: int | None = None,
           precompute_busy_s: float | None = None) -> LoadTotals:
        """The totals of a replica whose admission is in ``state``, with the rows it scored
        and the seconds it was busy since it started."""
        return cls(rows_done=rows_done, busy_s=busy_s, shed_units=dict(state.shed_units),
                   queue_items=state.baseline_items + state.optional_items,
                   queue_delay_ms=state.queue_delay_ms, ms_per_unit=state.ms_per_unit,
                   replicas=replicas, extras_room=extras_room,
                   precompute_busy_s=precompute_busy_s)


@dataclass(frozen=True, slots=True)
class Identity:
    pool_id: str
    worker_id: str
    region: str
    service: str
    model: ModelKind
    tier: Tier
    accelerator: str


class ReportWindow:
    """Accumulator of one reporting interval; ``close`` starts the next one. Not thread-safe
    (the live worker wraps it in a lock, ``workers.runtime.telemetry``)."""

    def __init__(self, identity: Identity, start_ms: int) -> None:
        self.identity = identity
        self._start_ms = start_ms
        self._last: LoadTotals | None = None
        self._rows_per_request = 0.0
        self._reset()

    def _reset(self) -> None:
        self._sketch = new_sketch()
        self._requests = 0
        self._baseline_requests = 0
        self._optional_done = 0
        self._rows = 0
        self._served = 0
        self._optional_requests = 0
        self._baseline_rejected = 0

    def record(self, latency_ms: float, baseline: bool, rows: int,
               optional_units_done: int, *, capacity_rows: int | None = None) -> None:
        """One answered request: its latency, whether it had baseline work, the rows sent.
        ``capacity_rows``: the rows that bound how many such requests fit (``rows`` when not
        given; see ``record_whole``)."""
        self._sketch.add(max(0.0, latency_ms))
        self._requests += 1
        self._baseline_requests += int(baseline)
        self._optional_done += optional_units_done
        self._optional_requests += optional_units_done > 0
        if baseline or optional_units_done > 0:  # work done: a refusal costs no rows
            self._rows += rows if capacity_rows is None else capacity_rows
            self._served += 1

    def record_whole(self, latency_ms: float, base_rows: int, kept_rows: int) -> None:
        """A whole request a powerful replica served: all ``kept_rows`` it scored are optional
        work, and only its ``base_rows`` bound how many such requests fit (the module
        docstring says why). The live worker and the simulated one both record it here."""
        self.record(latency_ms, False, kept_rows, kept_rows, capacity_rows=base_rows)

    def record_rejected(self, baseline: bool) -> None:
        """A request the worker could not serve (model failure, shutting down): never for
        load reasons, but still counted so that it cannot go unnoticed."""
        self._requests += 1
        self._baseline_rejected += int(baseline)

    def close(self, now_ms: int, totals: LoadTotals) -> WindowReport:
        """The report of the interval ending at ``now_ms``; the next interval starts now."""
        start, last = self._start_ms, self._last
        sketch, requests, baseline = self._sketch, self._requests, self._baseline_requests
        optional_done, rows, served = self._optional_done, self._rows, self._served
        rejected, optional_requests = self._baseline_rejected, self._optional_requests
        self._reset()
        self._start_ms, self._last = now_ms, totals
        span_s = max(now_ms - start, 1) / 1000.0
        busy = totals.busy_s - (last.busy_s if last else 0.0)
        done = totals.rows_done - (last.rows_done if last else 0)
        shed = {reason: units - (last.shed_units.get(reason, 0) if last else 0)
                for reason, units in totals.shed_units.items()}
        if served:
            self._rows_per_request = rows / served
        ident = self.identity
        room: int | UnsetType = UNSET if totals.extras_room is None else totals.extras_room
        pre: float | UnsetType = UNSET
        if totals.precompute_busy_s is not None:
            grown = totals.precompute_busy_s - ((last.precompute_busy_s or 0.0) if last else 0.0)
            pre = min(10.0, max(0.0, grown / span_s))
        v = (PRECOMPUTE_SHARE_VERSION if pre is not UNSET
             else ROOM_VERSION if room is not UNSET else SCHEMA_VERSION)
        return WindowReport(
            v=v, pool_id=ident.pool_id, worker_id=ident.worker_id, region=ident.region,
            service=ident.service, model=ident.model, tier=ident.tier,
            accelerator=ident.accelerator, window_start_ms=start, window_end_ms=max(now_ms, start),
            requests=requests, baseline_requests=baseline, baseline_rejected=rejected,
            optional_units_done=optional_done,
            optional_units_shed={r: n for r, n in sorted(shed.items()) if n > 0},
            latency_ms=to_wire(sketch), queue_depth=totals.queue_items,
            queue_delay_ms=max(0.0, totals.queue_delay_ms),
            utilisation=min(10.0, max(0.0, busy / span_s)),
            capacity_rps=self._capacity_rps(done, busy, totals.ms_per_unit),
            busy_s=min(86_400.0, max(0.0, busy * totals.replicas)), units_done=max(0, done),
            optional_requests_done=optional_requests, extras_room=room,
            precompute_utilisation=pre)

    def _capacity_rps(self, rows_done: int, busy_s: float, ms_per_unit: float) -> float:
        """Rows per busy second, as requests per second of this window's request size."""
        if rows_done > 0 and busy_s > 0:
            rows_per_s = rows_done / busy_s
        elif ms_per_unit > 0:
            rows_per_s = 1000.0 / ms_per_unit  # idle window: the last measured service time
        else:
            return 0.0
        return rows_per_s / max(self._rows_per_request, 1.0)
