"""The precompute lever in the simulator: the live lever's rules on simulated time.

What is the live lever's here: the client's `JobPlanner` (which users to ask for), `JobWindow`
(jobs in flight held to what the replicas answer) and `Answers` (the latest answer per job
key), and the replica's `may_precompute`, `chunk_rows`, `Pace` and `OffsetLedger`. What stands
in for Kafka: one jobs topic per (region, model), a list with one partition, read by one
replica set at a time (the consumer group's member that holds it), from its committed offset
when it changes hands; answers reach the region's client after the targets' delay. What
stands in for the model: the replica set's fluid server, whose idle time the slices fill
(`FluidServer.take_idle`: they hold its replicas while they run, but neither load the latency
curve, since a live request waits for one slice at most, nor count as the busy time its
reports give the cost model, as on a live worker).

A notice halts the replica set's precompute at once: the job in hand is dropped unanswered
and the partition goes back to its committed offset, so whichever set holds it next reads
again every job not yet committed (one answered but not yet committed is answered twice: the
same key, one answer in `Answers`). ``summary`` checks every job asked against the answers.

Users come from a stream of their own, so the requests' draws, and every scenario without the
lever, are unchanged: Zipf-distributed visits over ``users``. A visit by a user with a fresh
answer sends its base only and is worth its best answer, as in the live demo
(`surplus.live.loadgen`).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from schemas.contract import AnswerUse, ModelKind
from schemas.precompute import PrecomputeResult
from sim.scenario import PrecomputePlant, RegionConfig
from workers.policy.holdout import answer_use, in_holdout
from workers.policy.precompute import OffsetLedger, Pace, PrecomputeConfig, may_precompute
from workers.policy.precomputed import Answers, JobPlanner, JobWindow

if TYPE_CHECKING:
    from sim.worker import SimWorker

#: The topic's one partition (the ledger is per partition).
PARTITION = 0


@dataclass(frozen=True, slots=True)
class SimJob:
    key: str
    model: ModelKind
    issued_ms: int
    expires_ms: int
    units: int
    offset: int


@dataclass(slots=True)
class JobTopic:
    """One model's jobs in one region, and the replica set whose turn it is to read them."""

    jobs: list[SimJob] = field(default_factory=list)
    committed: int = 0
    holder: IdleJobs | None = None


class RegionPrecompute:
    """A region's side of the lever: its users, its client's planners, windows and answers,
    its topics, and the answers on their way (see the module docstring)."""

    def __init__(self, plant: PrecomputePlant, region: RegionConfig, seed: int, *,
                 delay_ms: float, holdout_fraction: float,
                 answer_holdout_fraction: float = 0.0) -> None:
        self.plant = plant
        self.region = region
        self.delay_ms = delay_ms
        self.holdout_fraction = holdout_fraction
        self.answer_holdout_fraction = answer_holdout_fraction
        #: Visits that held a fresh answer and were ranked live without it.
        self.withheld = 0
        self._rng = np.random.default_rng(seed)
        self._cdf = plant.visit_cdf()
        ms = 1000.0
        self.planners = {m: JobPlanner(round(plant.recent_s * ms), round(plant.refresh_s * ms),
                                       plant.max_jobs_per_s) for m in plant.models}
        self.windows = {m: JobWindow() for m in plant.models}
        self.topics = {m: JobTopic() for m in plant.models}
        self.answers = Answers(region.name)
        self._on_way: list[tuple[float, int, SimJob, IdleJobs]] = []
        self._seq = itertools.count()
        #: (job key, issued) -> answers sent for it.
        self.answered: dict[tuple[str, int], int] = {}
        #: Jobs a replica set read after their expiry, and skipped unscored.
        self.skipped: set[tuple[str, int]] = set()

    # -- the client's side ---------------------------------------------------------------

    def visit(self, request_id: str, gain: float,
              now: int) -> tuple[float | None, AnswerUse | None]:
        """A request arrives: its user is drawn and counts as seen. What its best fresh answer
        is worth, and what became of it: ``used``, or ``withheld`` by the answer holdout
        (then no worth: the visit is ranked live), as the live client's `PrecomputeSide.answer`
        decides; ``(None, None)`` without one, or for a holdout request, which gets no optional
        work."""
        self.deliver(now)
        user = int(np.searchsorted(self._cdf, self._rng.random(), side="right"))
        best: float | None = None
        for model, planner in self.planners.items():
            planner.seen(f"u{user}", now)
            if in_holdout(request_id, self.holdout_fraction):
                continue
            if self.answers.fresh(f"u{user}/{model}", now) is None:
                continue
            worth = self.plant.answer_worth(self.region, model, gain)
            best = worth if best is None else max(best, worth)
        if best is None:
            return None, None
        use = answer_use(request_id, self.answer_holdout_fraction)
        if use == "withheld":
            self.withheld += 1
            return None, use
        return best, use

    def ask(self, now: int) -> None:
        """The jobs each model's planner wants now, as many as its window has room for."""
        ttl_ms = round(self.plant.ttl_s * 1000.0)
        units = self.region.base_candidates + self.plant.candidates
        for model, planner in self.planners.items():
            window, topic = self.windows[model], self.topics[model]
            for user in planner.due(now, window.room(now)):
                key = f"{user}/{model}"
                topic.jobs.append(SimJob(key, model, now, now + ttl_ms, units, len(topic.jobs)))
                window.asked(key, now + ttl_ms)

    def deliver(self, now: float) -> None:
        """Answers due by ``now`` reach the client; the replica set that sent one commits."""
        while self._on_way and self._on_way[0][0] <= now:
            at, _, job, idle = heapq.heappop(self._on_way)
            self.answers.add(PrecomputeResult(
                job_key=job.key, scope=self.region.name, segment="any", model=job.model,
                pool_id=idle.worker.pool_id, worker_id=idle.worker.worker_id,
                issued_at_ms=job.issued_ms, computed_at_ms=int(at), expires_at_ms=job.expires_ms,
                candidates=job.units, top_ids=[], top_scores=[]))
            self.windows[job.model].answered(job.key)
            idle.delivered(job)

    # -- the replicas' side --------------------------------------------------------------

    def send(self, job: SimJob, at_ms: float, idle: IdleJobs) -> None:
        """A replica set answered ``job`` at ``at_ms``: on the cache topic after the delay."""
        self.answered[(job.key, job.issued_ms)] = self.answered.get((job.key, job.issued_ms),
                                                                    0) + 1
        heapq.heappush(self._on_way, (at_ms + self.delay_ms, next(self._seq), job, idle))

    def summary(self) -> dict[str, Any]:
        """Every job asked against the answers. The commit passes a job only once it is
        answered or found expired by the set reading it, so a job behind its topic's commit
        that is neither was lost (dropped at a notice and never read again, say); one at or
        past the commit is still open: the next holder reads it."""
        answered = expired = open_ = lost = 0
        for topic in self.topics.values():
            for job in topic.jobs:
                key = (job.key, job.issued_ms)
                if key in self.answered:
                    answered += 1
                elif key in self.skipped:
                    expired += 1
                elif job.offset >= topic.committed:
                    open_ += 1
                else:
                    lost += 1
        lookups = self.answers.counts
        return {"jobs_asked": answered + expired + open_ + lost, "jobs_answered": answered,
                "jobs_expired_unscored": expired, "jobs_open_at_end": open_, "jobs_lost": lost,
                "answers_sent": sum(self.answered.values()),
                "jobs_answered_twice": sum(1 for n in self.answered.values() if n > 1),
                "answers_duplicate": lookups.get("duplicate", 0),
                "visits_hit": lookups.get("hit", 0), "visits_miss": lookups.get("miss", 0),
                "visits_expired": lookups.get("expired", 0), "visits_withheld": self.withheld}


class IdleJobs:
    """One replica set's precompute: slices of the topic's jobs in its idle time, paced to
    ``max_share`` of its replicas (the live `PrecomputeRunner`'s rules)."""

    def __init__(self, worker: SimWorker, topic: JobTopic, region: RegionPrecompute,
                 config: PrecomputeConfig) -> None:
        self.worker = worker
        self.topic = topic
        self.region = region
        self.chunk_ms = config.chunk_ms
        self.pace = Pace(1.0, config.max_share)
        self.ledger = OffsetLedger()
        self._position = 0
        self._job: SimJob | None = None
        self._done = 0.0
        self._busy_ms = 0.0
        #: Milliseconds its slices took since it started (``LoadTotals.precompute_busy_s``,
        #: one core per replica set).
        self.busy_total_ms = 0.0
        self._measured_ms = float(worker.server.clock)

    def fill(self, now: float) -> None:
        """Score slices from the server's clock to ``now`` while nothing is queued (called
        by `SimWorker.advance` between its queue and ``now``)."""
        worker, server = self.worker, self.worker.server
        effective = worker.policy.current(int(server.clock))
        if not may_precompute(worker.pool.tier, effective):
            return
        self.pace.allow(effective.precompute_share)
        if worker.admission.preempted or not worker.ready or not self.claim():
            return
        slice_units = max(1.0, server.rate_per_ms * self.chunk_ms)
        t = server.clock
        while (job := self.next_job(t)) is not None:
            start = max(t, self.pace.ready_at_s * 1000.0, server.free_at())
            if start >= now:
                break
            server.drain_to(start)
            units = min(slice_units, job.units - self._done)
            cost = server.take_idle(units)
            self._busy_ms += cost
            self.busy_total_ms += cost
            self.pace.after(cost / 1000.0, (start + cost) / 1000.0)
            self._done += units
            t = start + cost
            if self._done >= job.units:
                self.finish(job, t)

    def claim(self) -> bool:
        """Whether it holds the partition, taking it if no set does (the group hands it
        over): a new holder reads from the committed offset."""
        if self.topic.holder is None:
            self.topic.holder, self._position = self, self.topic.committed
        return self.topic.holder is self

    def finish(self, job: SimJob, at_ms: float) -> None:
        """The job in hand is scored: its answer goes out."""
        self._job, self._done = None, 0.0
        self.region.send(job, at_ms, self)

    def next_job(self, now: float) -> SimJob | None:
        """The job in hand, else the next one read that has not expired (an expired one is
        done with, unscored, as the live runner skips it)."""
        if self._job is not None:
            return self._job
        jobs = self.topic.jobs
        while self._position < len(jobs):
            job = jobs[self._position]
            self._position += 1
            self.ledger.take(PARTITION, job.offset)
            if job.expires_ms > now:
                self._job = job
                return job
            self.ledger.done(PARTITION, job.offset)
            self.region.skipped.add((job.key, job.issued_ms))
        self._commit()
        return None

    def delivered(self, job: SimJob) -> None:
        """Its answer is on the cache topic: the offset may be committed (a set that no
        longer holds the partition commits nothing; its new holder reads it again)."""
        if self.topic.holder is self:
            self.ledger.done(PARTITION, job.offset)
            self._commit()

    def _commit(self) -> None:
        commit = self.ledger.commits().get(PARTITION)
        if commit is not None and self.topic.holder is self:
            self.topic.committed = max(self.topic.committed, commit)

    def halt(self) -> None:
        """A notice (or the replicas leaving): drop the job in hand unanswered and give the
        partition back; its next holder reads from the committed offset."""
        self._job, self._done = None, 0.0
        self.ledger.drop([PARTITION])
        self.ledger = OffsetLedger()
        if self.topic.holder is self:
            self.topic.holder = None

    def measure(self) -> None:
        """At each report: the replicas' busy share, requests' and precompute's, feeds the
        pace (a live worker feeds it its process's CPU time)."""
        server = self.worker.server
        span = server.clock - self._measured_ms
        if span <= 0:
            return
        self.pace.update(server.utilisation() + self._busy_ms / span)
        self._busy_ms, self._measured_ms = 0.0, server.clock
