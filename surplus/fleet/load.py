"""Open-loop ranking load through the real client library, recorded per request.

A `LoadRunner` runs a `RankingClient` (targets from Kafka, HTTP to real worker processes) on an
event loop of its own thread, so a test's main thread can stop brokers and kill processes while
load keeps arriving at a fixed rate. Requests are started on schedule whether or not earlier
ones finished (open loop): a stalled worker shows up as latency and loss, not as a slower
generator. Every request leaves one `Request` record (`surplus.fleet.records`); `Window` turns
a time slice of them into the figures the fault tests print and check: load held, baseline loss
by reason, optional work done and shed by reason.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.clock import wall_ms
from schemas.contract import ControlTargets
from schemas.heap import freeze_startup_heap
from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring
from surplus.fleet.procs import NUM_DENSE, NUM_SPARSE, REGION
from surplus.fleet.records import Request, TargetOffer
from workers.api import Candidate
from workers.client.client import RankingClient, RankingError
from workers.client.config import ClientConfig


@dataclass
class Window:
    """Figures of the samples started in [t0, t1)."""

    t0: float
    t1: float
    samples: list[Request]
    sent: int = 0
    served: int = 0
    lost: Counter[str] = field(default_factory=Counter)
    optional_done: int = 0
    optional_shed: Counter[str] = field(default_factory=Counter)
    routed_powerful: int = 0
    served_powerful: int = 0
    fallbacks: Counter[str] = field(default_factory=Counter)
    baseline_p50_ms: float = 0.0
    baseline_p99_ms: float = 0.0
    fallback_max_ms: float = 0.0
    #: The SLA's own split: the p99 of the requests routed to the ranking pool, and the
    #: slowest one routed to the powerful model (judged against its deadline, fallbacks in).
    ranking_p99_ms: float = 0.0
    routed_powerful_max_ms: float = 0.0

    # optional_done counts RMA extra candidates scored (units); SBM work is counted in requests
    # (served_powerful), a different unit.

    def __post_init__(self) -> None:
        picked = [s for s in self.samples if self.t0 <= s.t < self.t1]
        self.sent = len(picked)
        latencies, ranking = [], []
        for s in picked:
            if not s.served:
                self.lost[s.error or "unknown"] += 1
                continue
            self.served += 1
            latencies.append(s.latency_ms)
            if s.routed == "powerful":
                self.routed_powerful_max_ms = max(self.routed_powerful_max_ms, s.latency_ms)
            else:
                ranking.append(s.latency_ms)
            self.optional_done += s.optional_scored
            if s.optional_shed:
                self.optional_shed[s.shed_reason or "unspecified"] += s.optional_shed
            if s.routed == "powerful":
                self.routed_powerful += 1
            if s.model == "powerful":
                self.served_powerful += 1
            if s.fell_back:
                self.fallbacks[s.fell_back] += 1
                self.fallback_max_ms = max(self.fallback_max_ms, s.latency_ms)
        if latencies:
            self.baseline_p50_ms = float(np.percentile(latencies, 50))
            self.baseline_p99_ms = float(np.percentile(latencies, 99))
        if ranking:
            self.ranking_p99_ms = float(np.percentile(ranking, 99))

    @property
    def seconds(self) -> float:
        return max(self.t1 - self.t0, 1e-9)

    @property
    def rps(self) -> float:
        return self.served / self.seconds

    @property
    def optional_per_s(self) -> float:
        return self.optional_done / self.seconds

    def line(self, label: str) -> str:
        return (f"{label:<18} {self.seconds:5.1f}s sent {self.sent:5d} served {self.served:5d} "
                f"({self.rps:5.1f}/s) lost {dict(self.lost) or 0} | p50 "
                f"{self.baseline_p50_ms:5.1f} ms p99 {self.baseline_p99_ms:6.1f} ms | optional "
                f"done {self.optional_done} ({self.optional_per_s:.0f}/s) shed "
                f"{dict(self.optional_shed) or 0} | powerful {self.served_powerful}/"
                f"{self.routed_powerful} fallbacks {dict(self.fallbacks) or 0}")


class LoadRunner:
    """Fixed-rate ranking requests through a `RankingClient` on a background event loop."""

    def __init__(self, *, baseline_urls: list[str], powerful_urls: list[str] | None = None,
                 kafka: KafkaSettings | None, rate_rps: float = 40.0, base: int = 8,
                 extra: int = 24, deadline_ms: float = 250.0, seed: int = 7,
                 signing_key: Keyring | bytes | None = None, max_in_flight: int = 200,
                 client_overrides: dict[str, Any] | None = None,
                 label_share: float = 0.0) -> None:
        """``label_share``: the share of served requests whose outcome the client labels at
        once (`RankingClient.label`); their ids are kept in ``labelled``."""
        self.config = ClientConfig(scope=REGION, baseline_urls=baseline_urls,
                                   powerful_urls=powerful_urls or [],
                                   default_deadline_ms=deadline_ms, catch_up_timeout_s=20.0,
                                   **(client_overrides or {}))
        self.kafka = kafka
        self.rate = rate_rps
        self.base, self.extra = base, extra
        self.signing_key = signing_key
        self.max_in_flight = max_in_flight
        self.samples: list[Request] = []
        self.offers: list[TargetOffer] = []
        self.label_share = label_share
        self.labelled: list[str] = []
        self.dropped_by_generator = 0
        self.client: RankingClient | None = None
        self.summary: dict[str, Any] = {}
        self.stopped_at: float | None = None
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._t0 = 0.0
        self._in_flight = 0
        self._thread = threading.Thread(target=self._main, name="fault-load", daemon=True)

    # -- control (test thread) -----------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> LoadRunner:
        # This load runs in the test process, whose heap (torch, the test modules) a full
        # collection walks with the GIL held for a few hundred ms: freeze it first, as the
        # load generator does (`schemas.heap`), or such a pause reads as a worker's latency.
        freeze_startup_heap()
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._failed is not None:
            raise AssertionError(f"load runner did not start: {self._failed!r}")
        return self

    def now(self) -> float:
        """Seconds since the load started (the time base of samples)."""
        return time.monotonic() - self._t0

    def stop(self) -> None:
        """Stop sending, wait for what is in flight, close the client (its Kafka clients too:
        a closed-over producer would keep reconnecting to a broker the test has stopped)."""
        if self.stopped_at is None:
            self.stopped_at = self.now()
        self._stop.set()
        self._thread.join(30)
        if self._failed is not None:
            raise AssertionError(f"load runner failed: {self._failed!r}")
        if self.client is not None:
            self.summary = self.client.summary()
            self.client = None

    def window(self, t0: float, t1: float | None = None) -> Window:
        """Samples started in [t0, t1); t1 defaults to now, or to when the load stopped."""
        end = self.stopped_at if self.stopped_at is not None else self.now()
        return Window(t0, end if t1 is None else t1, list(self.samples))

    def in_flight(self) -> int:
        return self._in_flight

    def client_summary(self) -> dict[str, Any]:
        """The client's counters: live while running, as of `stop()` afterwards."""
        return self.client.summary() if self.client is not None else self.summary

    # -- the loop (runner thread) --------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # reported by start()/stop()
            self._failed = exc
            self._ready.set()

    async def _run(self) -> None:
        client = RankingClient(self.config, self.kafka, signing_key=self.signing_key)
        self.client = client
        self._record_offers(client)
        await client.start()
        tasks: set[asyncio.Task[None]] = set()
        self._t0 = time.monotonic()
        self._ready.set()
        interval, n = 1.0 / self.rate, 0
        try:
            while not self._stop.is_set():
                due = self._t0 + n * interval
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                n += 1
                if self._in_flight >= self.max_in_flight:
                    self.dropped_by_generator += 1
                    continue
                task = asyncio.create_task(self._one(client, n))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=10)
        finally:
            await client.close()

    def _record_offers(self, client: RankingClient) -> None:
        """Every targets message offered to the client is kept with its verdict (it arrives
        on this loop, from the feed's thread)."""
        decider = client.decider
        offer = decider.offer

        def recorded(targets: ControlTargets, now_ms: int) -> Any:
            verdict = offer(targets, now_ms)
            # Offers read as the client starts (catching up) come before the load's clock.
            at = self.now() if self._t0 else 0.0
            self.offers.append(TargetOffer(at, now_ms, targets.epoch, targets.issued_at_ms,
                                           targets.ttl_ms, verdict.accepted, verdict.reason))
            return verdict

        decider.offer = recorded  # type: ignore[method-assign]

    async def _one(self, client: RankingClient, n: int) -> None:
        rng = self._rng
        candidates = [Candidate(id=i, sparse=[rng.randrange(64) for _ in range(NUM_SPARSE)],
                                prior=rng.random()) for i in range(self.base + self.extra)]
        started = time.monotonic()
        # The targets the client decides under (rank decides before its first await).
        decided_ms = wall_ms()
        state = client.decider.targets
        held, effective = state.held, state.current(decided_ms)
        seen = {"request_id": f"r{n}", "wall_ms": decided_ms,
                "epoch": -1 if held is None else held.epoch,
                "issued_at_ms": 0 if held is None else held.issued_at_ms,
                "ttl_ms": 0 if held is None else held.ttl_ms,
                "baseline_only": effective.baseline_only}
        self._in_flight += 1
        try:
            result = await client.rank(segment=f"s{n % 4}", value=rng.uniform(0.1, 2.0),
                                       candidates=candidates, base_count=self.base,
                                       dense=[rng.random() for _ in range(NUM_DENSE)],
                                       request_id=f"r{n}")
        except RankingError as exc:
            self.samples.append(Request(t=started - self._t0,
                                        latency_ms=(time.monotonic() - started) * 1000,
                                        served=False, error=exc.reason, end_t=self.now(),
                                        **seen))  # type: ignore[arg-type]
            return
        except Exception as exc:  # anything else is a bug in the client: record it loudly
            self.samples.append(Request(t=started - self._t0,
                                        latency_ms=(time.monotonic() - started) * 1000,
                                        served=False, error=f"client_bug:{type(exc).__name__}",
                                        end_t=self.now(), **seen))  # type: ignore[arg-type]
            return
        finally:
            self._in_flight -= 1
        resp = result.response
        self.samples.append(Request(
            t=started - self._t0, latency_ms=result.latency_ms, served=True, model=resp.model,
            routed=result.decision.model, fell_back=result.fell_back,
            extra=result.decision.extra, optional_scored=resp.optional_scored,
            optional_shed=resp.optional_shed, shed_reason=resp.shed_reason, end_t=self.now(),
            **seen))  # type: ignore[arg-type]
        if self.label_share and rng.random() < self.label_share:
            client.label(resp.request_id, rng.uniform(0.0, 1.0))
            self.labelled.append(resp.request_id)
