"""The checker: each invariant fails on the history that breaks it, and only there."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from surplus.chaos.check import FORGED_EPOCH, check, counted_labels, summary
from surplus.chaos.history import (
    DeadLetterRecord,
    Estimate,
    FaultRecord,
    ForgedRecord,
    GrantRecord,
    History,
    LabelTotals,
    NoticeRecord,
    ReadBack,
    Record,
    Request,
    RunInfo,
    TargetOffer,
    WorkerEpoch,
    decode_lines,
    encode,
)

RUN = RunInfo(seed=7, duration_s=60.0, sla_p99_ms=100.0, window_s=10.0, ttl_ms=6000,
              max_clock_skew_ms=5000, ttl_slack_ms=1000, settle_s=2.0,
              max_targets_gap_s=45.0)
POOL = "eu1/rank/powerful/a100/opportunistic"


def _req(t: float, n: int, **kw: object) -> Request:
    fields: dict[str, object] = {
        "t": t, "end_t": t + 0.01, "request_id": f"r{n}", "served": True,
        "latency_ms": 10.0, "wall_ms": 1_000_000 + int(t * 1000), "epoch": 5,
        "issued_at_ms": 1_000_000 + int(t * 1000) - 500, "ttl_ms": 6000,
        "baseline_only": False, "extra": 4, "optional_scored": 4}
    fields.update(kw)
    return Request(**fields)  # type: ignore[arg-type]


def _load(seconds: float = 60.0, rate: float = 10.0) -> list[Any]:
    return [_req(i / rate, i) for i in range(int(seconds * rate))]


def _offer(t: float, epoch: int, accepted: bool = True) -> TargetOffer:
    return TargetOffer(t=t, wall_ms=0, epoch=epoch, issued_at_ms=0, ttl_ms=6000,
                       accepted=accepted, reason="applied" if accepted else "older_epoch")


def _clean() -> list[Any]:
    return [RUN, *_load(), ReadBack("preemption", []), _offer(0.5, 1), _offer(30.0, 2),
            LabelTotals(sent=10, delivered=10), Estimate(1, 1, 1, {"joined": 3}),
            Estimate(2, 2, 2, {"joined": 8, "orphan": 2})]


def _violated(records: list[Any]) -> dict[str, int]:
    counts: dict[str, int] = summary(History(records), check(History(records)))["violations"]
    return {k: v for k, v in counts.items() if v}


def test_a_clean_history_breaks_nothing() -> None:
    assert _violated(_clean()) == {}


def test_a_lost_baseline_request() -> None:
    records = _clean()
    records[5] = _req(0.4, 4, served=False, error="timeout")
    violations = check(History(records))
    assert [v.invariant for v in violations] == ["baseline_served"]
    assert "r4" in violations[0].what and "timeout" in violations[0].what


def test_sla_is_judged_only_in_windows_with_no_fault_on_the_baseline_path() -> None:
    slow = [_req(12 + i / 10, 1000 + i, latency_ms=500.0) for i in range(5)]
    assert _violated(_clean() + slow) == {"sla": 1}
    freeze = FaultRecord(t=9.0, end_t=11.0, kind="worker_freeze", target="b1",
                         baseline_path=True)
    assert _violated([*_clean(), *slow, freeze]) == {}
    elsewhere = FaultRecord(t=9.0, end_t=11.0, kind="broker_pause", target="2")
    violations = check(History([*_clean(), *slow, elsewhere]))
    assert [v.invariant for v in violations] == ["sla"]
    assert violations[0].t0 == 10.0 and violations[0].t1 == 20.0
    assert violations[0].faults == ["broker_pause:2@9.0-11.0"]


def test_the_fleets_start_up_is_not_judged_for_the_sla_but_its_p99_is_reported() -> None:
    """The first ``startup_s`` count as a fault on the baseline path (the brokers warming up
    on the run's one host); a window after it is judged as any other."""
    early = [_req(2 + i / 10, 2000 + i, latency_ms=160.0) for i in range(5)]
    started = msgspec.structs.replace(RUN, startup_s=10.0)
    assert _violated([*_clean(), *early]) == {"sla": 1}   # without a start-up: judged
    records = [started, *_clean()[1:], *early]
    assert _violated(records) == {}
    assert summary(History(records), [])["startup"] == {"seconds": 10.0,
                                                        "baseline_p99_ms": 160.0}
    late = [_req(12 + i / 10, 3000 + i, latency_ms=160.0) for i in range(5)]
    violations = check(History([*records, *late]))
    assert [(v.invariant, v.t0) for v in violations] == [("sla", 10.0)]


def test_thin_windows_are_not_judged() -> None:
    records = [RUN, _req(1, 1, latency_ms=900.0), ReadBack("preemption", []),
               LabelTotals(sent=0, delivered=0), _offer(0, 1), _offer(30, 2)]
    assert _violated(records) == {}


def _notice(**kw: object) -> NoticeRecord:
    fields: dict[str, object] = {"t": 20.0, "notice_id": "n1", "pool": POOL, "replicas": [],
                                 "deadline_t": 21.0, "acked": True, "acked_t": 20.05,
                                 "reclaims_replica": True, "direct_t": 20.01}
    fields.update(kw)
    return NoticeRecord(**fields)  # type: ignore[arg-type]


def test_powerful_work_after_the_deadline_until_the_next_grant() -> None:
    before = _req(20.5, 5000, model="powerful", routed="powerful")
    after = _req(22.0, 5001, model="powerful", routed="powerful")
    after_grant = _req(31.0, 5002, model="powerful", routed="powerful")
    base = [RUN, *_load(), ReadBack("preemption", ["n1"]),
            LabelTotals(sent=0, delivered=0), _offer(0, 1), _offer(30, 2), before, after_grant,
            GrantRecord(t=30.0, pool=POOL, acked=True)]
    assert _violated([*base, _notice()]) == {}
    violations = check(History([*base, _notice(), after]))
    assert [v.invariant for v in violations] == ["reclaim"]
    assert "r5001" in violations[0].what
    # A notice that reached the replica after its deadline holds it from its arrival.
    assert _violated([*base, _notice(deadline_t=19.0, direct_t=None, acked_t=22.5),
                      after]) == {}
    assert _violated([*base, _notice(deadline_t=19.0, direct_t=None, acked_t=21.5),
                      after]) == {"reclaim": 1}


def test_optional_work_on_targets_past_their_ttl() -> None:
    old = _req(30.0, 6000, issued_at_ms=1_000_000 + 30_000 - 7_100)
    assert _violated([*_clean(), old]) == {"targets_ttl": 1}
    within_skew = _req(30.0, 6001, issued_at_ms=1_000_000 + 30_000 - 6_900)
    baseline_only = _req(30.0, 6002, issued_at_ms=0, baseline_only=True)
    assert _violated([*_clean(), within_skew, baseline_only]) == {}


def test_an_older_epoch_applied_by_the_client_or_held_by_a_worker() -> None:
    base = [r for r in _clean() if not isinstance(r, TargetOffer)]
    ok = [_offer(1, 3), _offer(2, 2, accepted=False), _offer(3, 4), _offer(40, 5),
          WorkerEpoch(1, "b1", 3), WorkerEpoch(2, "b1", 0), WorkerEpoch(3, "b1", 4)]
    assert _violated([*base, *ok]) == {}
    assert _violated([*base, _offer(1, 3), _offer(2, 2), _offer(40, 4)]) == {
        "targets_epoch": 1}
    assert _violated([*_clean(), WorkerEpoch(1, "b1", 4), WorkerEpoch(2, "b1", 3)]) == {
        "targets_epoch": 1}


def test_targets_that_stop_flowing() -> None:
    base = [r for r in _clean() if not isinstance(r, TargetOffer)]
    assert _violated([*base, _offer(1, 1), _offer(44, 2)]) == {}
    assert _violated([*base, _offer(1, 1), _offer(47, 2)]) == {"targets_flow": 1}
    # A control plane up but never ticking: nothing new for the rest of the run.
    violations = check(History([*base, _offer(1, 1), _offer(2, 2, accepted=False)]))
    assert [v.invariant for v in violations] == ["targets_flow"]
    assert (violations[0].t0, violations[0].t1) == (1.0, 60.0)
    assert _violated(base) == {"targets_flow": 1}


def test_an_acknowledged_notice_missing_from_the_topic() -> None:
    records = [*_clean(), _notice(reclaims_replica=False), _notice(notice_id="n2",
                                                                   acked=False)]
    violations = check(History(records))
    assert [v.invariant for v in violations] == ["notices_kept"]
    assert "n1" in violations[0].what


def test_labels_delivered_but_not_counted() -> None:
    records = [r for r in _clean() if not isinstance(r, Estimate)]
    assert _violated([*records, Estimate(1, 1, 1, {"joined": 7, "unlabelled": 3})]) == {
        "labels_counted": 1}
    assert _violated(records) == {"labels_counted": 1}
    assert _violated([*records, Estimate(1, 1, 1, {"joined": 7, "late": 3})]) == {}


def test_labels_counted_by_each_control_plane_process_are_summed() -> None:
    records = [r for r in _clean() if not isinstance(r, Estimate)]
    kill = FaultRecord(t=10.0, end_t=12.0, kind="control_kill", target="cp")
    # 6 joined and 1 orphan, then a restart: the new process counts from 0 again, and
    # counts more orphans at once (3) than the first did in all.
    restarted = [Estimate(5, 1, 1, {"joined": 4}), Estimate(9, 2, 2, {"joined": 6,
                                                                        "orphan": 1}),
                 Estimate(13, 3, 3, {"joined": 1, "orphan": 3}),
                 Estimate(14, 4, 4, {"joined": 1, "orphan": 3})]
    history = History([*records, kill, *restarted])
    assert counted_labels(history) == {"joined": 7, "orphan": 4, "late": 0, "duplicate": 0}
    assert _violated([*records, kill, *restarted]) == {}
    # Without the kill in the history, the counts are one process's: too few.
    assert _violated([*records, *restarted]) == {"labels_counted": 1}


def test_labels_a_killed_process_took_in_after_its_last_report_are_allowed() -> None:
    records = [r for r in _clean() if not isinstance(r, Estimate | LabelTotals)]
    kill = FaultRecord(t=10.0, end_t=12.0, kind="control_kill", target="cp")
    counts = [Estimate(8, 1, 1, {"joined": 5}), Estimate(13, 2, 2, {"joined": 3})]
    # 10 labels; the two sent at 7.5 and 9.5 (after the last report less 1 s, before the
    # kill) were taken in by the dead process and counted by nobody.
    sent = LabelTotals(sent=10, delivered=10, times=[1, 2, 3, 4, 5, 7.5, 9.5, 14, 15, 16])
    assert _violated([*records, kill, *counts, sent]) == {}
    late = LabelTotals(sent=10, delivered=10, times=[1, 2, 3, 4, 5, 6, 9.5, 14, 15, 16])
    violations = check(History([*records, kill, *counts, late]))
    assert [v.invariant for v in violations] == ["labels_counted"]
    assert "2 of 10" in violations[0].what and "1 of them" in violations[0].what


@pytest.mark.parametrize("reason", ["unsigned", "unknown_key: k9", "bad_signature"])
def test_forged_messages_dead_lettered_as_refused(reason: str) -> None:
    forged = ForgedRecord(t=5.0, topic="preemption", how="unsigned", digest="abc", acked=True)
    assert _violated([*_clean(), forged]) == {"forged_refused": 1}
    other = DeadLetterRecord(source_topic="preemption", reason="decode: bad field",
                             digest="abc")
    assert _violated([*_clean(), forged, other]) == {"forged_refused": 1}
    refused = DeadLetterRecord(source_topic="preemption", reason=reason, digest="abc")
    assert _violated([*_clean(), forged, refused]) == {}


def test_forged_targets_applied() -> None:
    applied = TargetOffer(t=1, wall_ms=0, epoch=FORGED_EPOCH + 3, issued_at_ms=0,
                          ttl_ms=6000, accepted=True, reason="applied")
    assert _violated([*_clean(), applied])["forged_refused"] == 1


def test_history_lines_round_trip_and_bad_lines_name_their_number() -> None:
    records: list[Record] = [*_clean()[:3], _notice(), GrantRecord(1.0, POOL, True)]
    lines = [encode(r) for r in records]
    assert list(decode_lines(lines)) == records
    with pytest.raises(ValueError, match="line 2"):
        list(decode_lines([lines[0], b'{"type": "request", "t": "soon"}']))
    with pytest.raises(ValueError, match="one run record"):
        History(records[1:])
