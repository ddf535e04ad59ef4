"""The load generator's books: every request counted once, in the second it finished and in
the run's totals, with its row for ``requests.csv``, what became of the extra candidates it
was offered, and the true lift of the treated requests.

Rows are written as the run goes (``write_rows``), not held to the end: held, they made the
generator grow for as long as it ran (about 0.5 MiB a minute at 30 requests/s, found by
``surplus soak``). The client's own cuts are read from its counters each second, as deltas.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram

from schemas.contract import AnswerUse
from sim.attribution import add_truth, true_lift
from workers.api import RankResponse
from workers.client.client import RankingClient

LATENCY_BUCKETS_S = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.5, 1.0, 2.0)
REQUEST_COLUMNS = ("t_ms", "latency_ms", "ok", "model", "segment", "extra_sent", "extra_scored",
                   "fell_back", "error", "value", "gain_rma", "gain_sbm", "gain_precompute")


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
    #: Value of precompute answers used, over what the request's own extras would have given.
    gain_precompute: float = 0.0
    #: Requests served with a precompute answer, and the extras they did not send for it.
    precompute_hits: int = 0
    precompute_extra_saved: int = 0
    latencies: list[float] = field(default_factory=list)
    fate: dict[str, int] = field(default_factory=dict)
    """What became of the extra candidates retrieval offered (see ``LoadGenerator._one``), by
    outcome."""


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


class Books:
    """The run's accounts, kept as requests finish and written out each second.

    :param out: the load's output folder (``requests.csv``, ``loadgen.jsonl``).
    :param client: the run's client: its cut counters and the targets in force.
    :param metrics: the load's Prometheus metrics, counted with the books.
    """

    def __init__(self, out: Path, client: RankingClient, metrics: LoadMetrics) -> None:
        self.out = out
        self.client = client
        self.metrics = metrics
        self.rows: list[tuple[Any, ...]] = []
        """One tuple per request done since the rows were last written, in REQUEST_COLUMNS
        order (see ``write_rows``)."""
        self.errors: dict[str, int] = {}
        self.totals = Second()
        self.holdout_requests = 0
        #: Per segment, treated requests: [baseline n, Σ RMA value, powerful n, Σ gain + RMA].
        self._truth: dict[str, list[float]] = {}
        self._second = Second()
        self._cuts_seen: dict[str, int] = {}

    def truth(self, segment: str, powerful: bool, gain: float, weight: float,
              answer: AnswerUse | None = None) -> None:
        """A treated request's true gain, ``weight`` the inverse of the logged chance of the
        model that served it (a holdout request is only counted, in ``holdout_requests``);
        ``answer``: what became of the precompute answer it held (None: none)."""
        add_truth(self._truth, segment, powerful, gain, weight, answer)

    def served(self, offset: float, latency_ms: float, resp: RankResponse, extra_sent: int,
               extra_scored: int, fell_back: str | None, segment: str, value: float,
               gain_rma: float, gain_sbm: float, fate: dict[str, int], *,
               gain_precompute: float = 0.0, precompute_saved: int | None = None) -> None:
        """A request served; ``precompute_saved`` is None unless it used a precompute answer,
        else the extras the targets offered it that it did not send."""
        for s in (self._second, self.totals):
            s.requests += 1
            s.powerful += resp.model == "powerful"
            s.fell_back += fell_back is not None
            s.extra_sent += extra_sent
            s.extra_scored += extra_scored
            s.server_shed += resp.optional_shed
            s.gain += gain_rma + gain_sbm + gain_precompute
            s.gain_rma += gain_rma
            s.gain_sbm += gain_sbm
            s.gain_precompute += gain_precompute
            if precompute_saved is not None:
                s.precompute_hits += 1
                s.precompute_extra_saved += precompute_saved
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
        m.value.labels("precompute").inc(gain_precompute)
        self.rows.append((round(offset, 1), round(latency_ms, 3), 1, resp.model, segment,
                          extra_sent, extra_scored, fell_back or "", "", round(value, 5),
                          round(gain_rma, 6), round(gain_sbm, 6), round(gain_precompute, 6)))

    def failed(self, offset: float, reason: str, segment: str = "") -> None:
        for s in (self._second, self.totals):
            s.requests += 1
            s.failed += 1
        self.errors[reason] = self.errors.get(reason, 0) + 1
        self.metrics.requests.labels("failed").inc()
        self.rows.append((round(offset, 1), "", 0, "", segment, 0, 0, "", reason, "", 0.0, 0.0,
                          0.0))

    def write_rows(self) -> None:
        """Append the rows of the requests done since the last call to requests.csv (each
        batch in arrival order)."""
        if not self.rows:
            return
        rows, self.rows = sorted(self.rows, key=lambda row: float(row[0])), []
        with (self.out / "requests.csv").open("a", newline="") as fh:
            csv.writer(fh).writerows(rows)

    def flush_second(self, t_s: float, in_flight: int) -> None:
        """The rows so far, and the second's line of ``loadgen.jsonl`` (``t_s`` into the run,
        ``in_flight`` requests not answered yet)."""
        self.write_rows()
        s, self._second = self._second, Second()
        cuts = self.client_cuts()
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
            "t_s": t_s, "requests": s.requests,
            "failed": s.failed, "powerful": s.powerful, "fell_back": s.fell_back,
            "extra_sent": s.extra_sent, "extra_scored": s.extra_scored,
            "server_shed": s.server_shed, "gain": round(s.gain, 6),
            "precompute_hits": s.precompute_hits,
            "p50_ms": None if lat is None else round(float(np.percentile(lat, 50)), 3),
            "p99_ms": None if lat is None else round(float(np.percentile(lat, 99)), 3),
            "in_flight": in_flight, "targets": eff,
            "optional": dict(sorted(s.fate.items())),
            "sbm_shed": {k: v for k, v in sbm.items() if v}, "client_cuts": cuts}
        with (self.out / "loadgen.jsonl").open("a") as fh:
            fh.write(json.dumps(line) + "\n")

    def client_cuts(self) -> dict[str, int]:
        """Optional work the client itself did not send, by class and reason."""
        counters = self.client.decider.counters
        cuts: dict[str, int] = {}
        for cls in ("rma_shed", "sbm_shed", "baseline_only"):
            for reason, n in counters.get(cls, {}).items():
                cuts[f"{cls}/{reason}"] = n
        return cuts

    def close(self) -> Second:
        """The last rows written; the totals with the client's cuts over the whole run."""
        self.write_rows()
        t = self.totals
        for key, n in self.client_cuts().items():
            if key.startswith("rma_shed/") and key != "rma_shed/fallback":
                t.fate[f"client/{key.removeprefix('rma_shed/')}"] = n
        return t

    def lift_true(self) -> dict[str, float | None]:
        """The true lift of the treated requests by segment (``sim.attribution.true_lift``)."""
        return {k: None if v is None else round(v, 6) for k, v in true_lift(self._truth).items()}
