"""The load generator: a ranking service's traffic, sent through the real `RankingClient`.

Arrivals follow the scenario's arrival process (for the demo, the Azure LLM inference trace,
*Azure LLM inference trace 2023, Microsoft Azure Public Dataset, CC BY 4.0*, scaled to a rate
two cores can carry), drawn once before the run: open loop, so a slow worker does not slow the
traffic down. Each request belongs to a segment of the scenario; the segment says what the
request is worth and how much it truly gains from the powerful model. Those true gains are
the ground truth the client and the control plane must discover from noisy outcomes.

What it writes (``out``):

- ``requests.csv``: one row per request (arrival offset, latency, model, extra candidates sent
  and scored, outcome, true incremental value), appended every second — the report judges
  latency windows from it;
- ``loadgen.jsonl``: one line per second (rates, failures, cuts, the targets in force);
- ``loadgen.json``: the totals and the client's own counters (``RankingClient.summary()``).

Value model (the simulator's): a request of segment *s* served with *k* extra candidates by
model *m* yields ``value_s + gain_s * [m = powerful] + rma_gain * ln(1 + k / rma_scale)``
plus Normal noise. The *incremental value* of a request is that expression minus its
baseline-only value, without the noise.

The ranking service observes that noisy value late, as a real one observes a click or a
conversion: it is sent as an outcome label (``RankingClient.label``) after a log-normal delay
(the scenario's ``[labels]``; some never, some twice), and the control plane joins it with
the request's decision record. ``loadgen.json`` keeps the true lift per treated request (the
requests outside the holdout), for the report to set beside the measured one.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from schemas.clock import wall_ms
from schemas.heap import freeze_startup_heap
from schemas.kafka_config import KafkaSettings
from schemas.signing import KeySource
from sim.attribution import add_truth, true_lift
from sim.scenario import RegionConfig, Scenario, SegmentConfig
from sim.traces import arrival_counts
from workers.api import Candidate, RankResponse
from workers.client.client import RankingClient, RankingError
from workers.client.config import ClientConfig
from workers.client.decision import logged_propensity

LATENCY_BUCKETS_S = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.5, 1.0, 2.0)
REQUEST_COLUMNS = ("t_ms", "latency_ms", "ok", "model", "segment", "extra_sent", "extra_scored",
                   "fell_back", "error", "value", "gain_rma", "gain_sbm")


def arrival_offsets_ms(region: RegionConfig, scenario: Scenario, base_dir: Path,
                       duration_s: float, rate: float | None = None) -> np.ndarray:
    """Arrival times (ms from the start, sorted) of every request of the run."""
    arrivals = region.arrivals
    if rate is not None:
        arrivals = msgspec.structs.replace(arrivals, mean_rps=rate)
    step = scenario.step_ms
    steps = max(1, int(duration_s * 1000) // step)
    rng = np.random.default_rng(scenario.seed)
    counts = arrival_counts(arrivals, steps, step, base_dir, rng)
    starts = np.repeat(np.arange(steps, dtype=np.float64) * step, counts)
    return np.sort(starts + rng.uniform(0.0, step, size=len(starts)))


def rma_value(region: RegionConfig, extra: int) -> float:
    """Value of ``extra`` extra candidates scored for one request (the simulator's model)."""
    return region.rma_value(extra)


@dataclass
class Second:
    """What happened in one second of the run (one line of loadgen.jsonl)."""

    requests: int = 0
    failed: int = 0
    powerful: int = 0
    fell_back: int = 0
    extra_sent: int = 0
    extra_scored: int = 0
    server_shed: int = 0
    gain: float = 0.0
    gain_rma: float = 0.0
    gain_sbm: float = 0.0
    latencies: list[float] = field(default_factory=list)
    fate: dict[str, int] = field(default_factory=dict)
    """What became of the extra candidates retrieval offered (see ``_one``), by outcome."""


class LoadMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("surplus_loadgen_requests", "Requests by outcome", ["outcome"],
                                registry=self.registry)
        self.latency = Histogram("surplus_loadgen_latency_seconds",
                                 "End-to-end request latency seen by the ranking service",
                                 ["model"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.optional = Counter("surplus_loadgen_optional_units",
                                "Extra candidates: sent, scored", ["kind"],
                                registry=self.registry)
        self.fate = Counter("surplus_loadgen_optional_fate_units",
                            "Extra candidates on offer by what became of them: done, "
                            "worker/<shed reason>, client/<cut reason>, untargeted/<why>",
                            ["fate"], registry=self.registry)
        self.value = Counter("surplus_loadgen_incremental_value",
                             "True incremental value delivered", ["lever"],
                             registry=self.registry)


class LoadGenerator:
    """Sends the run's requests through one RankingClient and keeps the books."""

    def __init__(self, scenario: Scenario, region: RegionConfig, client: RankingClient,
                 offsets_ms: np.ndarray, out: Path, *, num_dense: int, num_sparse: int,
                 max_in_flight: int = 512, metrics_port: int = 0,
                 metrics_host: str = "127.0.0.1",
                 say: Callable[[str], None] = print) -> None:
        self.scenario = scenario
        self.region = region
        self.client = client
        self.offsets = offsets_ms
        self.out = out
        self.num_dense = num_dense
        self.num_sparse = num_sparse
        self.max_in_flight = max_in_flight
        self.say = say
        self.segments = {s.name: s for s in region.segments}
        shares = np.array([s.share for s in region.segments], dtype=np.float64)
        self._cdf = np.cumsum(shares / shares.sum())
        self._rng = np.random.default_rng(scenario.seed + 1)
        self._noise = np.random.default_rng(scenario.seed + 2)
        self._label_rng = np.random.default_rng(scenario.seed + 3)
        self.labels_sent = 0
        self.labels_lost = 0
        self.labels_due = 0
        """Labels scheduled and not yet sent (the run may end before they are due)."""
        self._bank = self._candidate_bank()
        self.metrics = LoadMetrics()
        if metrics_port:
            start_http_server(metrics_port, addr=metrics_host, registry=self.metrics.registry)
        self.rows: list[tuple[Any, ...]] = []
        """One tuple per request done since the rows were last written, in REQUEST_COLUMNS
        order (see ``_write_rows``)."""
        self.errors: dict[str, int] = {}
        self.totals = Second()
        self.holdout_requests = 0
        #: Per segment, treated requests: [baseline n, Σ RMA value, powerful n, Σ gain + RMA].
        self._truth: dict[str, list[float]] = {}
        self._second = Second()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._cuts_seen: dict[str, int] = {}
        self.start_ms = 0

    # -- the run ---------------------------------------------------------------------------

    async def run(self, start_ms: int, stop: asyncio.Event) -> dict[str, Any]:
        """Send every arrival at its time until the schedule ends or ``stop`` is set."""
        self.start_ms = start_ms
        self.out.mkdir(parents=True, exist_ok=True)
        with (self.out / "requests.csv").open("w", newline="") as fh:
            csv.writer(fh).writerow(REQUEST_COLUMNS)
        ticker = asyncio.create_task(self._every_second(stop))
        try:
            await self._send_all(stop)
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            if self._in_flight:
                await asyncio.wait(self._in_flight, timeout=5.0)
            for task in self._in_flight:
                task.cancel()
            self._flush_second()
        return self._finish()

    async def _send_all(self, stop: asyncio.Event) -> None:
        for i, offset in enumerate(self.offsets.tolist()):
            delay = (self.start_ms + offset - wall_ms()) / 1000.0
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return
            if len(self._in_flight) >= self.max_in_flight:
                self._record_failure(offset, "loadgen_overloaded")
                continue
            task = asyncio.create_task(self._one(i, offset))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    def _request(self, i: int) -> tuple[SegmentConfig, float, list[float], list[Candidate]]:
        rng = self._rng
        seg = self.region.segments[int(np.searchsorted(self._cdf, rng.random(), side="right"))
                                   if len(self._cdf) > 1 else 0]
        value = max(0.0, float(rng.normal(seg.value, seg.value_noise)))
        dense = rng.standard_normal(self.num_dense).round(4).tolist()
        n = self.region.base_candidates + self.region.max_extra_candidates
        start = int(rng.integers(0, len(self._bank) - n + 1))
        return seg, value, dense, self._bank[start:start + n]

    def _candidate_bank(self) -> list[Candidate]:
        """Candidates drawn once, which each request takes a random run of: drawing thousands
        of candidates per request in Python would cost the load generator more CPU than the
        extra candidates cost the workers (the candidate ids a retrieval stage would send)."""
        n = 2 * (self.region.base_candidates + self.region.max_extra_candidates)
        sparse = self._rng.integers(0, 2**31 - 1, size=(n, self.num_sparse)).tolist()
        priors = self._rng.random(n).round(4).tolist()
        return [Candidate(id=j, sparse=sparse[j], prior=priors[j]) for j in range(n)]

    async def _one(self, i: int, offset: float) -> None:
        seg, value, dense, candidates = self._request(i)
        # What the targets allow right now: client.rank() decides before its first await, so
        # this is the state its decision sees.
        eff = self.client.decider.targets.current(wall_ms())
        offered = self.region.max_extra_candidates
        targeted = 0 if eff.baseline_only else min(eff.extra_candidates, offered)
        why = (eff.reason if eff.baseline_only
               else "targets_zero" if targeted == 0 else "below_demand")
        untargeted = (why, offered - targeted)
        try:
            result = await self.client.rank(
                segment=seg.name, value=value, candidates=candidates,
                base_count=self.region.base_candidates, dense=dense,
                deadline_ms=self.region.deadline_ms, request_id=f"r{i}")
        except RankingError as exc:
            self._record_failure(offset, exc.reason, seg.name)
            return
        except Exception as exc:
            self._record_failure(offset, type(exc).__name__, seg.name)
            return
        resp = result.response
        extra_scored = resp.optional_scored
        gain_rma = rma_value(self.region, extra_scored)
        gain_sbm = seg.gain if resp.model == "powerful" else 0.0
        fate = {"done": extra_scored, f"untargeted/{untargeted[0]}": untargeted[1]}
        lost = result.decision.extra - extra_scored
        if resp.optional_shed:
            fate[f"worker/{resp.shed_reason or 'unspecified'}"] = min(lost, resp.optional_shed)
        if lost > resp.optional_shed:
            fate["fallback" if result.fell_back else "lost"] = lost - resp.optional_shed
        observed = self.outcome_value(resp.request_id, seg.name, resp.model, extra_scored)
        self._label_later(resp.request_id, observed)
        if result.decision.holdout:
            self.holdout_requests += 1
        else:
            d = result.decision
            p = logged_propensity(d.model, d.propensity, resp.model)
            add_truth(self._truth, seg.name, resp.model == "powerful", gain_sbm + gain_rma,
                      1.0 / p)
        self._account(offset, result.latency_ms, resp, result.decision.extra, extra_scored,
                      result.fell_back, seg.name, observed, gain_rma, gain_sbm, fate)

    def _label_later(self, request_id: str, value: float) -> None:
        """The outcome reaches the service after a log-normal delay; some never, some twice."""
        lost, z, dup = self._label_rng.random(), self._label_rng.standard_normal(), \
            self._label_rng.random()
        fate = self.scenario.labels.fate(lost, float(z), dup)
        if fate is None:
            self.labels_lost += 1
            return
        delay, twice = fate
        loop = asyncio.get_running_loop()
        for at in ((delay, 2 * delay) if twice else (delay,)):
            loop.call_later(at, self._send_label, request_id, value)
            self.labels_due += 1

    def _send_label(self, request_id: str, value: float) -> None:
        self.labels_due -= 1
        self.labels_sent += 1
        self.client.label(request_id, value)

    def outcome_value(self, request_id: str, segment: str, model: str, scored: int) -> float:
        """What the ranking service observes for a served request (noisy ground truth)."""
        seg = self.segments.get(segment)
        if seg is None:
            return 0.0
        true = (seg.value + (seg.gain if model == "powerful" else 0.0)
                + rma_value(self.region, scored))
        return true + float(self._noise.normal(0.0, seg.outcome_noise))

    # -- the books -------------------------------------------------------------------------

    def _account(self, offset: float, latency_ms: float, resp: RankResponse, extra_sent: int,
                 extra_scored: int, fell_back: str | None, segment: str, value: float,
                 gain_rma: float, gain_sbm: float, fate: dict[str, int]) -> None:
        for s in (self._second, self.totals):
            s.requests += 1
            s.powerful += resp.model == "powerful"
            s.fell_back += fell_back is not None
            s.extra_sent += extra_sent
            s.extra_scored += extra_scored
            s.server_shed += resp.optional_shed
            s.gain += gain_rma + gain_sbm
            s.gain_rma += gain_rma
            s.gain_sbm += gain_sbm
            for key, n in fate.items():
                if n:
                    s.fate[key] = s.fate.get(key, 0) + n
        for key, n in fate.items():
            if n:
                self.metrics.fate.labels(key).inc(n)
        self._second.latencies.append(latency_ms)
        m = self.metrics
        m.requests.labels("ok").inc()
        m.latency.labels(resp.model).observe(latency_ms / 1000.0)
        m.optional.labels("sent").inc(extra_sent)
        m.optional.labels("scored").inc(extra_scored)
        m.value.labels("rma").inc(gain_rma)
        m.value.labels("sbm").inc(gain_sbm)
        self.rows.append((round(offset, 1), round(latency_ms, 3), 1, resp.model, segment,
                          extra_sent, extra_scored, fell_back or "", "", round(value, 5),
                          round(gain_rma, 6), round(gain_sbm, 6)))

    def _record_failure(self, offset: float, reason: str, segment: str = "") -> None:
        for s in (self._second, self.totals):
            s.requests += 1
            s.failed += 1
        self.errors[reason] = self.errors.get(reason, 0) + 1
        self.metrics.requests.labels("failed").inc()
        self.rows.append((round(offset, 1), "", 0, "", segment, 0, 0, "", reason, "", 0.0, 0.0))

    async def _every_second(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(1.0)
            self._flush_second()

    def _write_rows(self) -> None:
        """Append the rows of the requests done since the last call to requests.csv (each
        batch in arrival order). Held until the end instead, every request's row made the
        generator grow for as long as it ran: about 0.5 MiB a minute at 30 requests/s, found by
        ``surplus soak``."""
        if not self.rows:
            return
        rows, self.rows = sorted(self.rows, key=lambda row: float(row[0])), []
        with (self.out / "requests.csv").open("a", newline="") as fh:
            csv.writer(fh).writerows(rows)

    def _flush_second(self) -> None:
        self._write_rows()
        s, self._second = self._second, Second()
        cuts = self._client_cuts()
        for key, n in cuts.items():
            if key.startswith("rma_shed/") and key != "rma_shed/fallback":
                delta = n - self._cuts_seen.get(key, 0)
                if delta:
                    s.fate[f"client/{key.removeprefix('rma_shed/')}"] = delta
                    self.metrics.fate.labels(f"client/{key.removeprefix('rma_shed/')}").inc(
                        delta)
        sbm = {k: n - self._cuts_seen.get(k, 0) for k, n in cuts.items()
               if k.startswith("sbm_shed/")}
        self._cuts_seen = cuts
        lat = np.array(s.latencies) if s.latencies else None
        eff = self.client.summary()["effective"]
        line = {
            "t_s": round((wall_ms() - self.start_ms) / 1000.0, 3), "requests": s.requests,
            "failed": s.failed, "powerful": s.powerful, "fell_back": s.fell_back,
            "extra_sent": s.extra_sent, "extra_scored": s.extra_scored,
            "server_shed": s.server_shed, "gain": round(s.gain, 6),
            "p50_ms": None if lat is None else round(float(np.percentile(lat, 50)), 3),
            "p99_ms": None if lat is None else round(float(np.percentile(lat, 99)), 3),
            "in_flight": len(self._in_flight), "targets": eff,
            "optional": dict(sorted(s.fate.items())),
            "sbm_shed": {k: v for k, v in sbm.items() if v}, "client_cuts": cuts}
        with (self.out / "loadgen.jsonl").open("a") as fh:
            fh.write(json.dumps(line) + "\n")

    def _client_cuts(self) -> dict[str, int]:
        """Optional work the client itself did not send, by class and reason."""
        counters = self.client.decider.counters
        cuts: dict[str, int] = {}
        for cls in ("rma_shed", "sbm_shed", "baseline_only"):
            for reason, n in counters.get(cls, {}).items():
                cuts[f"{cls}/{reason}"] = n
        return cuts

    def _finish(self) -> dict[str, Any]:
        self._write_rows()
        t = self.totals
        for key, n in self._client_cuts().items():
            if key.startswith("rma_shed/") and key != "rma_shed/fallback":
                t.fate[f"client/{key.removeprefix('rma_shed/')}"] = n
        summary = {
            "requests": t.requests, "failed": t.failed, "errors": dict(sorted(self.errors.items())),
            "served_powerful": t.powerful, "fell_back": t.fell_back,
            "extra_sent": t.extra_sent, "extra_scored": t.extra_scored,
            "server_shed": t.server_shed, "incremental_value": round(t.gain, 6),
            "incremental_value_by_lever": {"rma": round(t.gain_rma, 6),
                                           "sbm": round(t.gain_sbm, 6)},
            "holdout_requests": self.holdout_requests,
            "treated_requests": t.requests - self.holdout_requests,
            "lift_true": {k: None if v is None else round(v, 6)
                          for k, v in true_lift(self._truth).items()},
            "labels_sent": self.labels_sent, "labels_lost": self.labels_lost,
            "labels_not_yet_due": self.labels_due,
            "planned_requests": len(self.offsets), "client_cuts": self._client_cuts(),
            "extra_offered": t.requests * self.region.max_extra_candidates,
            "optional_fate": dict(sorted(t.fate.items())),
            "client": self.client.summary(),
            "attribution": "arrivals: Azure LLM inference trace 2023, Microsoft Azure Public "
                           "Dataset, CC BY 4.0" if "Azure" in str(self.region.arrivals.path)
            else None}
        (self.out / "loadgen.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary


async def model_shape(url: str, timeout_s: float = 60.0) -> tuple[int, int]:
    """(num_dense, num_sparse) the ranking model takes, from a worker's /healthz."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url.rstrip("/") + "/healthz",
                                       timeout=aiohttp.ClientTimeout(total=2.0)) as resp:
                    body = await resp.json()
                    return int(body["num_dense"]), int(body["num_sparse"])
            except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.5)
    raise RuntimeError(f"no worker answered {url}/healthz within {timeout_s:.0f}s ({last})")


def client_config(scenario: Scenario, region: RegionConfig, baseline_urls: list[str],
                  powerful_urls: list[str], membership: bool = False) -> ClientConfig:
    """The client's settings: the scenario's client policies, the region's deadlines."""
    part = scenario.client
    return ClientConfig(
        scope=region.name, membership=membership, baseline_urls=baseline_urls,
        powerful_urls=powerful_urls,
        default_deadline_ms=region.deadline_ms, baseline_timeout_ms=region.timeout_ms,
        powerful_deadline_share=part.powerful_deadline_share, rma_burst_s=part.rma_burst_s,
        seed=scenario.seed, limits=part.limits, router=part.router, shed=part.shed,
        holdout_fraction=part.holdout_fraction)


async def run_loadgen(scenario: Scenario, region: RegionConfig, base_dir: Path, *,
                      baseline_urls: list[str], powerful_urls: list[str],
                      kafka: KafkaSettings | None, out: Path, start_ms: int,
                      duration_s: float, stop: asyncio.Event, rate: float | None = None,
                      metrics_port: int = 0, metrics_host: str = "127.0.0.1",
                      membership: bool = False, signing_key: KeySource | None = None,
                      say: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the client and the arrivals, run them, return the summary (also in ``out``).

    With ``membership`` the client routes to the replicas announced on the replicas topic
    (the URL lists only while none is live), and the model's shape is asked of the first
    ranking replica announced."""
    offsets = arrival_offsets_ms(region, scenario, base_dir, duration_s, rate)
    config = client_config(scenario, region, baseline_urls, powerful_urls, membership)
    holder: dict[str, LoadGenerator] = {}
    client = RankingClient(config, kafka, signing_key=signing_key)
    await client.start()
    try:
        first = baseline_urls[0] if baseline_urls else await _first_announced(client, 60.0)
        num_dense, num_sparse = await model_shape(first)
        gen = LoadGenerator(scenario, region, client, offsets, out, num_dense=num_dense,
                            num_sparse=num_sparse, metrics_port=metrics_port,
                            metrics_host=metrics_host, say=say)
        holder["g"] = gen
        where = ("the replicas announced on the replicas topic" if membership else
                 f"{len(baseline_urls)} ranking and {len(powerful_urls)} powerful replicas")
        say(f"loadgen: {len(offsets)} requests over {duration_s:.0f}s "
            f"(mean {len(offsets) / duration_s:.1f}/s) to {where}")
        freeze_startup_heap()  # or a full collection stalls the client mid-run (schemas.heap)
        return await gen.run(start_ms, stop)
    finally:
        await client.close()


async def _first_announced(client: RankingClient, timeout_s: float) -> str:
    """The URL of the first ranking replica the client's membership routes to."""
    membership = client.membership
    assert membership is not None, "membership is off"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        live = membership.routable("baseline", wall_ms())
        if live:
            return live[0]
        await asyncio.sleep(0.2)
    raise RuntimeError(f"no ranking replica announced itself on the replicas topic within "
                       f"{timeout_s:.0f}s")
