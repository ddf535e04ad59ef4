"""External and synthetic inputs of a scenario: request arrivals and opportunistic capacity.

Arrivals become a count of requests per simulation step, drawn once before a run so that
every controller compared on a scenario faces exactly the same requests. Capacity becomes a
number of replicas per step for each opportunistic pool, plus the notice each drop comes with.

The Azure LLM inference trace (Azure LLM inference trace 2023, Microsoft Azure Public Dataset,
CC BY 4.0) is the shipped example of a per-request trace: ``TIMESTAMP`` rows such as
``2023-11-16 18:15:46.6805900`` (seven fractional digits, which ``strptime`` does not take, so
fractions are cut to microseconds here).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from sim.scenario import ArrivalsConfig, CapacityConfig, ScenarioError, StormConfig, resolve_data

AZURE_ATTRIBUTION = "Azure LLM inference trace 2023, Microsoft Azure Public Dataset, CC BY 4.0"


def _cos(x: np.ndarray) -> np.ndarray:
    """Cosine through libm (numpy's SIMD cosine may differ in the last bit between CPUs)."""
    return np.array([math.cos(v) for v in x.tolist()], dtype=np.float64)


# -- CSV reading ----------------------------------------------------------------------------------

def _rows(path: Path) -> tuple[list[str], list[list[str]]]:
    try:
        with path.open(encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            return header, [row for row in reader if row]
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _column(path: Path, header: list[str], name: str) -> int:
    try:
        return header.index(name)
    except ValueError:
        raise ScenarioError(f"{path}: no column {name!r} (columns: {', '.join(header)})") \
            from None


def parse_times_s(values: list[str], fmt: str, path: Path) -> np.ndarray:
    """Seconds (float64, not rebased) of each value: numbers in ``s``/``ms``, or ``strptime``."""
    try:
        if fmt in ("s", "ms"):
            scale = 1.0 if fmt == "s" else 1e-3
            return np.array([float(v) for v in values], dtype=np.float64) * scale
        out = np.empty(len(values), dtype=np.float64)
        for i, value in enumerate(values):
            value = value.strip()
            head, dot, frac = value.partition(".")
            if dot and "%f" in fmt:
                value = f"{head}.{frac[:6]}"
            moment = datetime.strptime(value, fmt)
            if moment.tzinfo is None:  # naive times are UTC: no local zone, no DST jumps
                moment = moment.replace(tzinfo=UTC)
            out[i] = moment.timestamp()
        return out
    except ValueError as exc:
        raise ScenarioError(f"{path}: bad time value ({exc}); time_format is {fmt!r}") from None


# -- arrivals -------------------------------------------------------------------------------------

def arrival_counts(cfg: ArrivalsConfig, steps: int, step_ms: int, base: Path,
                   rng: np.random.Generator) -> np.ndarray:
    """Requests arriving in each of ``steps`` steps (int64)."""
    dt_s = step_ms / 1000.0
    t = np.arange(steps, dtype=np.float64) * dt_s
    if cfg.kind == "constant":
        return rng.poisson(cfg.mean_rps * dt_s, size=steps).astype(np.int64)
    if cfg.kind == "diurnal":
        a = (cfg.peak_to_trough - 1.0) / (cfg.peak_to_trough + 1.0)
        rate = cfg.mean_rps * (1.0 + a * _cos(2 * math.pi * (t - cfg.peak_at_s)
                                              / cfg.period_s))
        return rng.poisson(rate * dt_s).astype(np.int64)
    if cfg.kind == "onoff":
        return rng.poisson(onoff_rate(cfg, steps, step_ms, rng) * dt_s).astype(np.int64)
    if cfg.path is None:
        raise ScenarioError(f"arrivals of kind {cfg.kind!r} need a path")
    path = resolve_data(cfg.path, base)
    if cfg.kind == "trace":
        return _trace_counts(path, cfg, steps, dt_s)
    return _rate_counts(path, cfg, t, dt_s, rng)


def onoff_rate(cfg: ArrivalsConfig, steps: int, step_ms: int,
               rng: np.random.Generator) -> np.ndarray:
    """Requests/s of each step for heavy-tailed on/off bursts (see ``ArrivalsConfig``).

    Off and on lengths are Pareto (``scale * (1 + Lomax(shape))``, bursts cut at ``on_max_s``),
    the first period an off one cut at a uniform point so that a run does not always start
    with a full quiet spell. Bursts run at ``peak_to_mean * mean_rps``; the quiet rate is the
    one that makes the long-run mean ``mean_rps`` given the expected lengths. Lengths come from
    a stream of their own, so a shorter run sees the same first seconds as a longer one.
    """
    a, on_min, on_max, off_min = cfg.pareto_shape, cfg.on_min_s, cfg.on_max_s, cfg.off_min_s
    mean_on = on_min * a / (a - 1.0) - on_min ** a * on_max ** (1.0 - a) / (a - 1.0)
    mean_off = off_min * a / (a - 1.0)
    on_share = mean_on / (mean_on + mean_off)
    peak = cfg.peak_to_mean * cfg.mean_rps
    quiet = (cfg.mean_rps - peak * on_share) / (1.0 - on_share)
    if quiet < 0.0:
        raise ScenarioError(f"arrivals: bursts at {cfg.peak_to_mean:g}x the mean for "
                            f"{on_share:.1%} of the time carry more than the mean; lower "
                            "peak_to_mean or lengthen off_min_s")
    lengths = np.random.default_rng(int(rng.integers(2 ** 63)))
    duration_ms = steps * step_ms
    on = np.zeros(steps, dtype=bool)
    t = -float(lengths.uniform(0.0, 1.0)) * off_min * (1.0 + float(lengths.pareto(a)))
    while True:
        t += off_min * (1.0 + float(lengths.pareto(a)))
        if t * 1000.0 >= duration_ms:
            break
        length = min(on_max, on_min * (1.0 + float(lengths.pareto(a))))
        first = round(t * 1000.0 / step_ms)
        last = max(round((t + length) * 1000.0 / step_ms), first + 1)
        if last > 0:
            on[max(first, 0):last] = True
        t += length
    return np.where(on, peak, quiet)


def _trace_counts(path: Path, cfg: ArrivalsConfig, steps: int, dt_s: float) -> np.ndarray:
    """One row per request -> counts per step, scaled to ``mean_rps`` by cumulative rounding.

    The trace is counted per ``bin_s`` and each bin's requests spread evenly over its steps.
    Scaling repeats every recorded request (the Azure trace's 5 requests/s at 200 is 36
    copies each), and counted per 100 ms step the copies of one request arrived in the same
    step: 61% of `azure_steady_tight`'s steps were empty and the rest held 36 or more, a
    clump no larger population of independent callers makes, and the replicas' surge rule
    (a 100 ms window) refused the extras of 26% of the ranking requests there as a burst. A
    second keeps what the trace says about load (its one-second bursts) without the clumps.
    """
    header, rows = _rows(path)
    col = _column(path, header, cfg.time_column)
    times = np.sort(parse_times_s([row[col] for row in rows], cfg.time_format, path))
    if len(times) < 2:
        raise ScenarioError(f"{path}: a trace needs at least two requests")
    times -= times[0]
    per = max(1, round(cfg.bin_s / dt_s))
    bins = math.ceil((times[-1] + dt_s) / (per * dt_s))
    binned = np.bincount((times // (per * dt_s)).astype(np.int64), minlength=bins)
    native = np.repeat(binned.astype(np.float64) / per, per)
    scale = cfg.mean_rps / (len(times) / (len(native) * dt_s))
    offset = int(cfg.offset_s / dt_s) % len(native)
    reps = math.ceil((offset + steps) / len(native))
    expected = np.tile(native, reps)[offset:offset + steps] * scale
    cumulative = np.floor(np.cumsum(expected) + 0.5)
    return np.diff(cumulative, prepend=0.0).astype(np.int64)


def _rate_counts(path: Path, cfg: ArrivalsConfig, t: np.ndarray, dt_s: float,
                 rng: np.random.Generator) -> np.ndarray:
    """(time, rate) rows held until the next row, scaled to ``mean_rps``, Poisson per step."""
    header, rows = _rows(path)
    tc, rc = _column(path, header, cfg.time_column), _column(path, header, cfg.rate_column)
    times = parse_times_s([row[tc] for row in rows], cfg.time_format, path)
    try:
        rates = np.array([float(row[rc]) for row in rows], dtype=np.float64)
    except ValueError as exc:
        raise ScenarioError(f"{path}: bad rate value ({exc})") from None
    order = np.argsort(times, kind="stable")
    times, rates = times[order] - times[order][0], np.clip(rates[order], 0.0, None)
    if not len(times) or rates.max() <= 0:
        raise ScenarioError(f"{path}: no positive rate")
    period = times[-1] + (times[-1] - times[-2] if len(times) > 1 else 1.0)
    where = np.searchsorted(times, (t + cfg.offset_s) % period, side="right") - 1
    rate = rates[np.clip(where, 0, len(rates) - 1)]
    rate *= cfg.mean_rps / max(rate.mean(), 1e-12)
    return rng.poisson(rate * dt_s).astype(np.int64)


# -- opportunistic capacity -----------------------------------------------------------------------

@dataclass(frozen=True)
class Outage:
    """Part of a pool reclaimed for a while (random reclaim or storm)."""

    start_ms: int
    end_ms: int | None
    share: float
    notice_ms: int


def capacity_shape(cfg: CapacityConfig, steps: int, step_ms: int, base: Path, *,
                   region: str, accelerator: str) -> np.ndarray:
    """Replicas the scheduler would like to lend the pool at each step (before outages)."""
    t = np.arange(steps, dtype=np.float64) * step_ms / 1000.0
    if cfg.kind == "constant":
        return np.full(steps, cfg.replicas, dtype=np.int64)
    if cfg.kind == "steps":
        out = np.full(steps, cfg.replicas, dtype=np.int64)
        for at_s, replicas in sorted(cfg.steps):
            out[t >= at_s] = replicas
        return out
    if cfg.kind == "diurnal":
        span = cfg.max_replicas - cfg.min_replicas
        # hold each level for a minute: a scheduler does not move capacity every step
        minute = np.floor(t / 60.0) * 60.0
        phase = _cos(2 * math.pi * (minute - cfg.peak_at_s) / cfg.period_s)
        return np.rint(cfg.min_replicas + span * (phase + 1.0) / 2.0).astype(np.int64)
    if cfg.path is None:
        raise ScenarioError("capacity of kind 'csv' needs a path")
    return _capacity_csv(resolve_data(cfg.path, base), cfg, t, region, accelerator)


def _capacity_csv(path: Path, cfg: CapacityConfig, t: np.ndarray, region: str,
                  accelerator: str) -> np.ndarray:
    header, rows = _rows(path)
    tc, uc = _column(path, header, cfg.time_column), _column(path, header, cfg.units_column)
    rcol = header.index(cfg.region_column) if cfg.region_column in header else None
    acol = header.index(cfg.accelerator_column) if cfg.accelerator_column in header else None
    kept = [row for row in rows
            if (rcol is None or row[rcol].strip() == region)
            and (acol is None or row[acol].strip() == accelerator)]
    if not kept:
        raise ScenarioError(f"{path}: no rows for region {region!r} and accelerator "
                            f"{accelerator!r}")
    times = parse_times_s([row[tc] for row in kept], "s", path)
    try:
        units = np.array([float(row[uc]) for row in kept], dtype=np.float64)
    except ValueError as exc:
        raise ScenarioError(f"{path}: bad units value ({exc})") from None
    order = np.argsort(times, kind="stable")
    times, units = times[order] - times[order][0], units[order]
    where = np.searchsorted(times, t, side="right") - 1
    return np.floor(np.clip(units[np.clip(where, 0, len(units) - 1)], 0, None)).astype(np.int64)


def outages(cfg: CapacityConfig, storms: list[StormConfig], duration_ms: int, *, region: str,
            model: str, rng: np.random.Generator) -> list[Outage]:
    """Random reclaims of this pool and the storms that hit it, in time order."""
    found: list[Outage] = []
    reclaims = cfg.random_reclaims
    if reclaims is not None and reclaims.rate_per_hour > 0:
        t = 0.0
        while True:
            t += rng.exponential(3600.0 / reclaims.rate_per_hour)
            start = round(t * 1000)
            if start >= duration_ms:
                break
            found.append(Outage(start, start + round(reclaims.return_after_s * 1000),
                                reclaims.share, round(reclaims.notice_s * 1000)))
    for storm in storms:
        if storm.regions and region not in storm.regions:
            continue
        if storm.models and model not in storm.models:
            continue
        start = round(storm.at_s * 1000)
        end = None if storm.return_after_s is None else start + round(storm.return_after_s
                                                                      * 1000)
        found.append(Outage(start, end, storm.share, round(storm.notice_s * 1000)))
    return sorted(found, key=lambda o: (o.start_ms, o.notice_ms))


def lendable(shape: np.ndarray, found: list[Outage], step_ms: int) -> np.ndarray:
    """Replicas lent at each step once outages take their share (never below zero)."""
    keep = np.ones(len(shape), dtype=np.float64)
    for outage in found:
        first = outage.start_ms // step_ms
        last = len(shape) if outage.end_ms is None else min(len(shape),
                                                             outage.end_ms // step_ms)
        keep[first:last] *= 1.0 - outage.share
    return np.floor(shape * keep + 1e-9).astype(np.int64)
