"""A chaos run's history reads on the schedule's clock: every load time shifted by the time
the schedule started, the warm-up's requests left out, records without a time kept as they
are."""

from __future__ import annotations

from surplus.chaos import history as h
from surplus.chaos.assembly import history, run_info
from surplus.chaos.config import ChaosConfig
from surplus.chaos.recorder import Recorder
from surplus.fleet.records import Request, TargetOffer


def test_history_is_on_the_schedule_clock_from_its_start() -> None:
    rec = Recorder()
    rec.add(h.FaultRecord(t=15.0, end_t=17.5, kind="net_cut", target="b1"))
    rec.add(h.NoticeRecord(t=12.0, notice_id="n", pool="p", replicas=[], deadline_t=13.0,
                           acked=True, acked_t=12.25))
    rec.add(h.LabelTotals(sent=2, delivered=2, times=[11.0, 14.5]))
    rec.add(h.ReadBack(topic="preemption", ids=["n"]))
    samples = [Request(t=9.0, end_t=9.1, request_id="warm", served=True, latency_ms=1.0),
               Request(t=11.0, end_t=11.02, request_id="r", served=True, latency_ms=20.123)]
    offers = [TargetOffer(t=10.5, wall_ms=0, epoch=1, issued_at_ms=0, ttl_ms=1000,
                          accepted=True, reason="")]
    run = run_info(7, 150.0, ChaosConfig())
    out = history(run, samples, offers, rec, shift=10.0)
    assert out[0] is run
    [request] = [r for r in out if isinstance(r, Request)]
    assert (request.request_id, request.t, request.end_t, request.latency_ms) == (
        "r", 1.0, 1.02, 20.12)
    [offer] = [r for r in out if isinstance(r, TargetOffer)]
    assert offer.t == 0.5
    [fault] = [r for r in out if isinstance(r, h.FaultRecord)]
    assert (fault.t, fault.end_t) == (5.0, 7.5)
    [notice] = [r for r in out if isinstance(r, h.NoticeRecord)]
    assert (notice.t, notice.deadline_t, notice.acked_t, notice.direct_t) == (
        2.0, 3.0, 2.25, None)
    [totals] = [r for r in out if isinstance(r, h.LabelTotals)]
    assert totals.times == [1.0, 4.5]
    assert h.ReadBack(topic="preemption", ids=["n"]) in out


def test_run_info_takes_rma_sla_unless_the_run_sets_one() -> None:
    assert run_info(7, 150.0, ChaosConfig(sla_p99_ms=80.0)).sla_p99_ms == 80.0
    assert run_info(7, 150.0, ChaosConfig()).sla_p99_ms > 0
