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

The requests are drawn by ``draws.RequestDraws``, the labels sent by ``labels.Labels``, and
the books (the totals, each second's line, the rows, the true lift) kept by ``books.Books``;
the generator paces the arrivals and assembles what each request's answer means.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import numpy as np
from prometheus_client import start_http_server

from schemas.clock import wall_ms
from schemas.contract import ModelKind
from schemas.heap import freeze_startup_heap
from schemas.kafka_config import KafkaSettings
from schemas.signing import KeySource
from sim.scenario import RegionConfig, Scenario, SegmentConfig
from sim.traces import arrival_counts
from surplus.live.books import LATENCY_BUCKETS_S, REQUEST_COLUMNS, Books, LoadMetrics, Second
from surplus.live.draws import RequestDraws
from surplus.live.labels import Labels
from workers.client.client import RankingClient, RankingError
from workers.client.config import ClientConfig
from workers.client.decision import logged_propensity
from workers.policy.precomputed import JobPlanner

#: How often the load generator asks for the precompute jobs due.
JOB_EVERY_S = 0.25

# The names other modules import from here (``surplus loadgen``, the tests, the metrics
# conventions' check).
__all__ = ["LATENCY_BUCKETS_S", "REQUEST_COLUMNS", "LoadGenerator", "LoadMetrics", "Second",
           "arrival_offsets_ms", "client_config", "model_shape", "rma_value", "run_loadgen"]

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


class LoadGenerator:
    """Sends the run's requests through one RankingClient and keeps the books."""

    def __init__(self, scenario: Scenario, region: RegionConfig, client: RankingClient,
                 offsets_ms: np.ndarray, out: Path, *, num_dense: int, num_sparse: int,
                 max_in_flight: int = 512, metrics_port: int = 0,
                 metrics_host: str = "127.0.0.1",
                 say: Callable[[str], None] = print) -> None:
        """
        :param scenario: the run's scenario (its seed, its labels).
        :param region: the region loaded: its segments, candidates, deadlines and value model.
        :param client: the client every request goes through (started by the caller).
        :param offsets_ms: each request's arrival, ms from the start, sorted.
        :param out: the folder for ``requests.csv``, ``loadgen.jsonl`` and ``loadgen.json``.
        :param num_dense: the dense features the ranking model takes.
        :param num_sparse: the sparse features of each candidate.
        :param max_in_flight: requests unanswered past which an arrival fails at once
            (``loadgen_overloaded``) rather than queue in the generator.
        :param metrics_port: the port of the load's /metrics (0: none).
        :param metrics_host: the address /metrics listens on.
        :param say: where the generator's lines are printed.
        """
        self.scenario = scenario
        self.region = region
        self.client = client
        self.offsets = offsets_ms
        self.out = out
        self.max_in_flight = max_in_flight
        self.say = say
        self.segments = {s.name: s for s in region.segments}
        self.draws = RequestDraws(region, scenario.seed + 1, num_dense=num_dense,
                                  num_sparse=num_sparse, precompute=scenario.precompute)
        plant = scenario.precompute
        #: Per model, which users to ask precompute jobs for (the lever on, and a client
        #: that follows the answers; none otherwise).
        self.planners: dict[ModelKind, JobPlanner] = (
            {m: JobPlanner(int(plant.recent_s * 1000), int(plant.refresh_s * 1000),
                           plant.max_jobs_per_s) for m in plant.models}
            if plant.enabled and client.precompute is not None else {})
        self._noise = np.random.default_rng(scenario.seed + 2)
        self.labels = Labels(scenario.labels, scenario.seed + 3, client)
        self.metrics = LoadMetrics()
        if metrics_port:
            start_http_server(metrics_port, addr=metrics_host, registry=self.metrics.registry)
        self.books = Books(out, client, self.metrics)
        self._in_flight: set[asyncio.Task[None]] = set()
        self.start_ms = 0

    @property
    def rows(self) -> list[tuple[Any, ...]]:
        """The rows of the requests done and not yet written (``Books.rows``)."""
        return self.books.rows

    # -- the run ---------------------------------------------------------------------------

    async def run(self, start_ms: int, stop: asyncio.Event) -> dict[str, Any]:
        """Send every arrival at its time until the schedule ends or ``stop`` is set."""
        self.start_ms = start_ms
        self.out.mkdir(parents=True, exist_ok=True)
        with (self.out / "requests.csv").open("w", newline="") as fh:
            csv.writer(fh).writerow(REQUEST_COLUMNS)
        tasks = [asyncio.create_task(self._every_second(stop))]
        if self.planners:
            tasks.append(asyncio.create_task(self._ask_jobs(stop)))
        try:
            await self._send_all(stop)
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
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

    async def _ask_jobs(self, stop: asyncio.Event) -> None:
        """Every ``JOB_EVERY_S``, ask each model for jobs for the users due (`JobPlanner`),
        as many as its replicas measurably answer (`PrecomputeSide.room`). A job is keyed
        ``user/model``: one answer per user and model."""
        side, plant = self.client.precompute, self.scenario.precompute
        assert side is not None
        while not stop.is_set():
            await asyncio.sleep(JOB_EVERY_S)
            for model, planner in self.planners.items():
                for user in planner.due(wall_ms(), side.room(model)):
                    seg, dense, candidates = self.draws.job(user)
                    side.ask(f"{user}/{model}", segment=seg.name, model=model,
                             candidates=candidates, dense=dense,
                             ttl_ms=int(plant.ttl_s * 1000), top=self.region.base_candidates)
            self.client.flush_decisions()

    def _precomputed(self, user: str | None, request_id: str,
                     seg: SegmentConfig) -> float | None:
        """What the best precompute answer for ``user`` is worth (None: none to use now, or
        a holdout request, which gets no optional work of any kind); the user counts as
        seen. A baseline answer is the ranking over the job's extras, a powerful one that
        and the better model's gain (the value model's terms for the same work done live)."""
        side = self.client.precompute
        if user is None or side is None or not self.planners:
            return None
        now = wall_ms()
        for planner in self.planners.values():
            planner.seen(user, now)
        best: float | None = None
        for model in self.planners:
            answer = side.answer(f"{user}/{model}", request_id)
            if answer is None:
                continue
            worth = self.scenario.precompute.answer_worth(self.region, model, seg.gain)
            best = worth if best is None else max(best, worth)
        return best

    async def _one(self, i: int, offset: float) -> None:
        seg, value, dense, candidates = self.draws.next()
        precomputed = self._precomputed(self.draws.user, f"r{i}", seg)
        if precomputed is not None:  # ranked ahead, over more candidates: send the base only
            candidates = candidates[:self.region.base_candidates]
        # What the targets allow right now: client.rank() decides before its first await, so
        # this is the state its decision sees.
        eff = self.client.decider.targets.current(wall_ms())
        offered = len(candidates) - self.region.base_candidates
        targeted = 0 if eff.baseline_only else min(eff.extra_candidates, offered)
        saved = (None if precomputed is None else 0 if eff.baseline_only
                 else min(eff.extra_candidates, self.region.max_extra_candidates))
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
        gain_pre = (0.0 if precomputed is None
                    else max(0.0, precomputed - gain_rma - gain_sbm))
        fate = {"done": extra_scored, f"untargeted/{untargeted[0]}": untargeted[1]}
        lost = result.decision.extra - extra_scored
        if resp.optional_shed:
            fate[f"worker/{resp.shed_reason or 'unspecified'}"] = min(lost, resp.optional_shed)
        if lost > resp.optional_shed:
            fate["fallback" if result.fell_back else "lost"] = lost - resp.optional_shed
        observed = self.outcome_value(resp.request_id, seg.name, resp.model, extra_scored,
                                      gain_pre)
        self.labels.later(resp.request_id, observed)
        if result.decision.holdout:
            self.books.holdout_requests += 1
        else:
            d = result.decision
            p = logged_propensity(d.model, d.propensity, resp.model)
            self.books.truth(seg.name, resp.model == "powerful",
                             gain_sbm + gain_rma + gain_pre, 1.0 / p, result.answer)
        self.books.served(offset, result.latency_ms, resp, result.decision.extra, extra_scored,
                          result.fell_back, seg.name, observed, gain_rma, gain_sbm, fate,
                          gain_precompute=gain_pre, precompute_saved=saved)

    def outcome_value(self, request_id: str, segment: str, model: str, scored: int,
                      precomputed: float = 0.0) -> float:
        """What the ranking service observes for a served request (noisy ground truth);
        ``precomputed``: what a precompute answer added over the request's own extras."""
        seg = self.segments.get(segment)
        if seg is None:
            return 0.0
        true = (seg.value + (seg.gain if model == "powerful" else 0.0)
                + rma_value(self.region, scored) + precomputed)
        return true + float(self._noise.normal(0.0, seg.outcome_noise))

    # -- the books -------------------------------------------------------------------------

    def _record_failure(self, offset: float, reason: str, segment: str = "") -> None:
        self.books.failed(offset, reason, segment)

    async def _every_second(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(1.0)
            self._flush_second()

    def _flush_second(self) -> None:
        self.books.flush_second(round((wall_ms() - self.start_ms) / 1000.0, 3),
                                len(self._in_flight))

    def _finish(self) -> dict[str, Any]:
        t = self.books.close()
        summary = {
            "requests": t.requests, "failed": t.failed,
            "errors": dict(sorted(self.books.errors.items())),
            "served_powerful": t.powerful, "fell_back": t.fell_back,
            "extra_sent": t.extra_sent, "extra_scored": t.extra_scored,
            "server_shed": t.server_shed, "incremental_value": round(t.gain, 6),
            "incremental_value_by_lever": {"rma": round(t.gain_rma, 6),
                                           "sbm": round(t.gain_sbm, 6),
                                           "precompute": round(t.gain_precompute, 6)},
            "precompute": {"hits": t.precompute_hits,
                           "extra_saved": t.precompute_extra_saved,
                           "candidates": self.scenario.precompute.candidates,
                           "models": list(self.planners)}
            if self.planners else None,
            "holdout_requests": self.books.holdout_requests,
            "treated_requests": t.requests - self.books.holdout_requests,
            "lift_true": self.books.lift_true(),
            "labels_sent": self.labels.sent, "labels_lost": self.labels.lost,
            "labels_not_yet_due": self.labels.due,
            "planned_requests": len(self.offsets), "client_cuts": self.books.client_cuts(),
            "extra_offered": t.requests * self.region.max_extra_candidates
            - t.precompute_hits * self.region.max_extra_candidates,
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
        holdout_fraction=part.holdout_fraction, precompute=scenario.precompute.enabled,
        answer_holdout_fraction=part.answer_holdout_fraction)


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
