"""Latency windows: every WindowReport of one control period, merged per pool.

Workers report every second or so; the control loop acts every ``period_s``. A window sums what
the reports say about one pool over one period and, at ``close``, answers with ``WindowStats``:
the merged latency quantiles and the pool's rates. ``add`` runs once per report on the hot path
(hundreds of thousands per second in offline replay), so it does only a sketch merge and a few
additions; everything derived is computed once, at ``close``.

A window whose merged sketch holds fewer than ``min_samples`` latencies says so
(``enough_samples=False``). Controllers hold their output on such a window: a p99 of a handful
of requests is noise, and acting on noise is how control loops oscillate.
"""

from __future__ import annotations

import math

import msgspec
from msgspec import UNSET

from schemas.contract import LatencySketch, PoolPartial, WindowReport
from schemas.sketch import DEFAULT_RELATIVE_ACCURACY, SketchMerger

#: Utilisation under which a pool's throughput (units over busy share) is not extrapolated
#: from its window: too noisy. RMA's provisioned headroom and SBM's room both read it.
MIN_UTILISATION = 0.02

#: Sketches a window holds before merging them (``LatencyWindow.add``): a period's worth for a
#: pool of hundreds of replicas, and a bound on what a window keeps alive (about 1 MB).
HELD_SKETCHES = 2048


class WindowStats(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One pool over one control period.

    ``start_ms``/``end_ms`` bound the control period. Rates are per second over the span the
    reports themselves cover (earliest report start to latest report end), which stays right
    when a pool starts mid-period or reports arrive late. Quantiles are 0.0 when ``samples``
    is 0 (JSON has no NaN); read ``enough_samples`` before trusting them.
    """

    pool_id: str
    region: str
    model: str
    tier: str
    accelerator: str
    start_ms: int
    end_ms: int
    reports: int
    samples: int
    p50_ms: float
    p99_ms: float
    request_rate: float
    baseline_rate: float
    optional_done_rate: float
    shed_rate: float
    """Optional units shed per second, all reasons together."""
    utilisation: float
    """Mean utilisation over the period's reports."""
    capacity_rps: float
    """Sum over workers of each worker's latest reported capacity."""
    enough_samples: bool
    busy_s: float = 0.0
    """Replica-seconds the pool's models were busy over the period (what the work cost)."""
    units_done: int = 0
    """Units scored over the period, baseline and optional (what ``busy_s`` bought)."""
    optional_requests_done: int = 0
    units_rate: float = 0.0
    """Units scored per second, baseline and optional (``units_done`` over the reports' span)."""
    overload_shed_rate: float = 0.0
    """Optional units shed per second for ``overload``: extras trimmed to what fits under the
    queue bound at admission, and queued optional work shed as the queue grew. What the
    targets sent and the replicas could not serve."""
    extras_room: int | None = None
    """The most extra candidates one request could have kept on any of the pool's replicas
    over the period (``WindowReport.extras_room``); None when no report says."""
    precompute_utilisation: float = 0.0
    """Mean share of the period's reports spent on precompute slices (``utilisation`` leaves
    them out); 0.0 where the pool does not run the lever."""


#: Share of the extras a target sends that replicas may shed for overload (trimmed to what fits
#: under their queue bound) before RMA's target, or SBM's cap on the extras of powerful
#: requests, is held to what they served. Trimming a few is the admission's job (room varies
#: from request to request); trimming most means the target runs past the capacity.
TRIM_TOLERANCE = 0.25


def overload_per_request(stats: list[WindowStats], model: str,
                         tier: str | None = None) -> float | None:
    """Optional units the pools of ``model`` (and ``tier``) shed for overload per request they
    served over the period: on average, how far what the targets sent each request ran past
    what the replicas could fit. None when they served no request."""
    pools = [w for w in sorted(stats, key=lambda w: w.pool_id)
             if w.model == model and (tier is None or w.tier == tier)]
    rate = sum(w.request_rate for w in pools)
    if rate <= 0:
        return None
    return sum(w.overload_shed_rate for w in pools) / rate


def extras_room(stats: list[WindowStats], model: str) -> int | None:
    """The most extra candidates one request could have kept on any replica of ``model``'s
    pools this period: a target past it is trimmed on every request it sends. None when no
    pool says (no request carried extras)."""
    rooms = [w.extras_room for w in stats if w.model == model and w.extras_room is not None]
    return max(rooms) if rooms else None


class LatencyWindow:
    """Accumulates one pool's reports; ``close`` returns the stats and starts a new period."""

    __slots__ = ("_accuracy", "_capacity", "_first_start", "_held", "_last_end", "_merger",
                 "_room", "_util", "accelerator",
                 "baseline", "busy", "done", "min_samples", "model", "opened_ms",
                 "optional_requests", "overload", "pool_id", "precompute", "region", "reports",
                 "requests",
                 "shed", "silent_periods", "tier", "units")

    def __init__(self, pool_id: str, region: str, model: str, tier: str, accelerator: str,
                 min_samples: int, relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY, *,
                 opened_ms: int | None = None) -> None:
        self.opened_ms = opened_ms
        """Start of the current period; None: the earliest report start seen in it."""
        self.pool_id = pool_id
        self.region = region
        self.model = model
        self.tier = tier
        self.accelerator = accelerator
        self.min_samples = min_samples
        self._merger = SketchMerger(relative_accuracy)
        self._accuracy = relative_accuracy
        self._held: list[LatencySketch] = []
        self._capacity: dict[str, float] = {}
        self.silent_periods = 0
        self._clear()

    @classmethod
    def for_report(cls, report: WindowReport, min_samples: int,
                   relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY, *,
                   opened_ms: int | None = None) -> LatencyWindow:
        return cls(report.pool_id, report.region, report.model, report.tier, report.accelerator,
                   min_samples, relative_accuracy, opened_ms=opened_ms)

    def _clear(self) -> None:
        self.reports = self.requests = self.baseline = self.done = self.shed = 0
        self.units = self.optional_requests = self.overload = 0
        self._util = self.busy = self.precompute = 0.0
        self._room: int | None = None
        self._first_start = math.inf
        self._last_end = -math.inf
        self._capacity.clear()
        self._held.clear()
        self._merger.reset()

    def add(self, report: WindowReport) -> None:
        """Merge one report. Raises ``SketchMismatch`` (before changing anything) on a sketch
        of another relative accuracy, so the caller can dead-letter it.

        The sketch is held and merged with the period's others at ``close`` (or once
        ``HELD_SKETCHES`` wait): one numpy pass for them all costs half what one a report
        does (``SketchMerger.add_many``), the same sums either way."""
        sketch = report.latency_ms
        if sketch.relative_accuracy != self._accuracy:
            raise self._merger.mismatch(sketch)
        held = self._held
        held.append(sketch)
        if len(held) >= HELD_SKETCHES:
            self._merger.add_many(held)
            held.clear()
        self.reports += 1
        self.requests += report.requests
        self.baseline += report.baseline_requests
        self.done += report.optional_units_done
        if report.optional_units_shed:
            self.shed += sum(report.optional_units_shed.values())
            self.overload += report.optional_units_shed.get("overload", 0)
        self._util += report.utilisation
        self.busy += report.busy_s
        if report.precompute_utilisation is not UNSET:
            self.precompute += report.precompute_utilisation
        self.units += report.units_done
        self.optional_requests += report.optional_requests_done
        self._capacity[report.worker_id] = report.capacity_rps
        room = report.extras_room
        if room is not UNSET and (self._room is None or room > self._room):
            self._room = room
        if report.window_start_ms < self._first_start:
            self._first_start = report.window_start_ms
        if report.window_end_ms > self._last_end:
            self._last_end = report.window_end_ms

    def add_partial(self, pool: PoolPartial, shard: str) -> None:
        """Merge one first-stage shard's sums for this pool (``WindowPartial``): the same
        window as if its reports had come here one by one, up to the order of float sums.
        Raises ``SketchMismatch`` before changing anything, as ``add`` does."""
        sketch = pool.latency_ms
        if sketch.relative_accuracy != self._accuracy:
            raise self._merger.mismatch(sketch)
        self._held.append(sketch)
        self.reports += pool.reports
        self.requests += pool.requests
        self.baseline += pool.baseline_requests
        self.done += pool.optional_units_done
        self.shed += pool.optional_units_shed
        self.overload += pool.overload_shed
        self._util += pool.utilisation_sum
        self.busy += pool.busy_s
        self.precompute += pool.precompute_utilisation_sum
        self.units += pool.units_done
        self.optional_requests += pool.optional_requests_done
        self._capacity[shard] = pool.capacity_rps
        room = pool.extras_room
        if room is not None and (self._room is None or room > self._room):
            self._room = room
        self._first_start = min(self._first_start, pool.first_start_ms)
        self._last_end = max(self._last_end, pool.last_end_ms)

    def partial(self) -> PoolPartial | None:
        """This period's sums so far, for a second stage to merge (None: no report yet).
        A first-stage window is read once, when its period ends, and then dropped."""
        if not self.reports:
            return None
        if self._held:
            self._merger.add_many(self._held)
            self._held.clear()
        capacity = 0.0
        for worker in sorted(self._capacity):
            capacity += self._capacity[worker]
        return PoolPartial(
            pool_id=self.pool_id, model=self.model, tier=self.tier,  # type: ignore[arg-type]
            accelerator=self.accelerator, reports=self.reports, requests=self.requests,
            baseline_requests=self.baseline, optional_units_done=self.done,
            optional_units_shed=self.shed, overload_shed=self.overload,
            utilisation_sum=self._util, capacity_rps=capacity, busy_s=self.busy,
            units_done=self.units, optional_requests_done=self.optional_requests,
            extras_room=self._room, precompute_utilisation_sum=self.precompute,
            first_start_ms=int(self._first_start),
            last_end_ms=int(self._last_end), latency_ms=self._merger.to_wire())

    def close(self, now_ms: int) -> WindowStats:
        """The period's stats; the window is empty again afterwards, its period opened now."""
        start_ms = self.opened_ms
        if start_ms is None:
            start_ms = int(self._first_start) if self.reports else now_ms
        start_ms = min(start_ms, now_ms)
        end_ms = now_ms
        span_ms = self._last_end - self._first_start
        if not span_ms > 0:
            span_ms = max(end_ms - start_ms, 1)
        per_s = 1000.0 / span_ms
        merger = self._merger
        if self._held:
            merger.add_many(self._held)
        samples = merger.count
        p50 = merger.quantile(0.5) if samples else 0.0
        p99 = merger.quantile(0.99) if samples else 0.0
        if not (math.isfinite(p50) and math.isfinite(p99)):  # counts claimed, bins empty
            samples, p50, p99 = 0, 0.0, 0.0
        capacity = 0.0
        for worker in sorted(self._capacity):
            capacity += self._capacity[worker]
        stats = WindowStats(
            pool_id=self.pool_id, region=self.region, model=self.model, tier=self.tier,
            accelerator=self.accelerator, start_ms=start_ms, end_ms=end_ms,
            reports=self.reports, samples=samples, p50_ms=p50, p99_ms=p99,
            request_rate=self.requests * per_s, baseline_rate=self.baseline * per_s,
            optional_done_rate=self.done * per_s, shed_rate=self.shed * per_s,
            utilisation=self._util / self.reports if self.reports else 0.0,
            capacity_rps=capacity, enough_samples=samples >= self.min_samples,
            busy_s=self.busy, units_done=self.units,
            optional_requests_done=self.optional_requests, units_rate=self.units * per_s,
            overload_shed_rate=self.overload * per_s, extras_room=self._room,
            precompute_utilisation=self.precompute / self.reports if self.reports else 0.0)
        self.silent_periods = 0 if self.reports else self.silent_periods + 1
        self.opened_ms = now_ms
        self._clear()
        return stats


class TooManyPools(ValueError):
    """A report names a new pool while the window set is full (hostile or runaway pool ids)."""


class WindowSet:
    """One ``LatencyWindow`` per pool id: routes reports, closes every window at period end."""

    def __init__(self, min_samples: int, relative_accuracy: float = DEFAULT_RELATIVE_ACCURACY,
                 *, max_pools: int = 10_000, forget_after_periods: int = 6,
                 opened_ms: int | None = None) -> None:
        self.min_samples = min_samples
        self.relative_accuracy = relative_accuracy
        self.max_pools = max_pools
        self.forget_after_periods = forget_after_periods
        self.opened_ms = opened_ms
        self._windows: dict[str, LatencyWindow] = {}

    def add(self, report: WindowReport) -> None:
        window = self._windows.get(report.pool_id)
        if window is None:
            window = self._open(report)
        window.add(report)

    def add_partial(self, pool: PoolPartial, region: str, shard: str) -> None:
        """Merge one shard's sums for one pool (the second stage of a scaled-out scope)."""
        window = self._windows.get(pool.pool_id)
        if window is None:
            self._check_room(pool.pool_id)
            if self.opened_ms is None:
                self.opened_ms = pool.first_start_ms
            window = self._windows[pool.pool_id] = LatencyWindow(
                pool.pool_id, region, pool.model, pool.tier, pool.accelerator,
                self.min_samples, self.relative_accuracy, opened_ms=self.opened_ms)
        window.add_partial(pool, shard)

    def _check_room(self, pool_id: str) -> None:
        if len(self._windows) >= self.max_pools:
            raise TooManyPools(f"pool {pool_id!r} would exceed max_pools={self.max_pools}")

    def _open(self, report: WindowReport) -> LatencyWindow:
        self._check_room(report.pool_id)
        if self.opened_ms is None:
            self.opened_ms = report.window_start_ms
        window = LatencyWindow.for_report(report, self.min_samples, self.relative_accuracy,
                                          opened_ms=self.opened_ms)
        self._windows[report.pool_id] = window
        return window

    def partials(self) -> list[PoolPartial]:
        """Each pool's sums so far, sorted by pool id (a first stage's part of a period)."""
        parts = (self._windows[pool].partial() for pool in sorted(self._windows))
        return [part for part in parts if part is not None]

    def close(self, now_ms: int) -> list[WindowStats]:
        """Stats of every known pool (sorted by pool id), then a new period starts at now_ms.

        Pools silent for ``forget_after_periods`` closes are dropped, which bounds memory when
        pools come and go.
        """
        stats = [self._windows[pool].close(now_ms) for pool in sorted(self._windows)]
        for pool in [p for p, w in self._windows.items()
                     if w.silent_periods >= self.forget_after_periods]:
            del self._windows[pool]
        self.opened_ms = now_ms
        return stats

    def __len__(self) -> int:
        return len(self._windows)

    def __contains__(self, pool_id: object) -> bool:
        return pool_id in self._windows
