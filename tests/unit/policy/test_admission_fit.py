"""Whole requests and divisible extras: how much of one request a replica takes, and the
most one request could have kept (the room the control plane holds its targets to)."""

from __future__ import annotations

from tests.unit.policy.test_admission import CFG, make
from workers.policy.admission import Admission


def test_a_whole_request_replica_queues_up_to_the_deadlines_its_requests_carry() -> None:
    ranking, _ = make()
    whole: Admission[str] = Admission(CFG, whole_requests=True)
    for adm in (ranking, whole):
        assert adm.admit_optional("first", value=1.0, deadline_ms=40, now_ms=0, units=8)
    # 16 ms of predicted wait: over a ranking replica's 10 ms bound, inside a 40 ms deadline
    assert ranking.admit_optional("second", value=1.0, deadline_ms=40, now_ms=0, units=8) is False
    assert whole.admit_optional("second", value=1.0, deadline_ms=40, now_ms=0, units=8)
    assert whole.delay_bound_ms == 40.0
    assert whole.shedding_level(0) == 1  # 16 of 40 ms: the levels scale with the bound too


def test_a_whole_request_replica_still_sheds_past_its_deadline_horizon() -> None:
    adm: Admission[str] = Admission(CFG, whole_requests=True)
    for i in range(5):
        assert adm.admit_optional(f"o{i}", value=1.0, deadline_ms=30, now_ms=0, units=6)
    assert adm.admit_optional("over", value=0.5, deadline_ms=30, now_ms=0, units=6) is False
    assert adm.shed_units == {"overload": 6}


def test_a_whole_request_bound_leaves_the_batchers_own_wait_to_the_deadline() -> None:
    adm: Admission[str] = Admission(CFG, whole_requests=True, batch_wait_ms=15.0)
    adm.admit_optional("o", value=1.0, deadline_ms=40, now_ms=0, units=1)
    assert adm.delay_bound_ms == 25.0


def test_a_whole_request_bound_is_never_below_the_configured_one() -> None:
    adm: Admission[str] = Admission(CFG, whole_requests=True)
    adm.admit_optional("short", value=1.0, deadline_ms=3, now_ms=0, units=1)
    assert adm.delay_bound_ms == CFG.max_queue_delay_ms


def test_a_whole_requests_extras_fit_under_the_queue_bound_its_base_under_the_deadline() -> None:
    adm: Admission[str] = Admission(CFG, whole_requests=True)
    kept = adm.fit_whole(base=4, extra=100)
    assert kept == 6                                     # 10 ms bound at 1 ms per unit, 4 of base
    assert adm.shed_units == {"overload": 94}
    assert adm.admit_optional("r", value=1.0, deadline_ms=40, now_ms=0, units=4 + kept)
    assert adm.admit_optional("next", value=1.0, deadline_ms=40, now_ms=0, units=20)
    assert adm.shed_units == {"overload": 94}            # bases queue to the 40 ms deadline


def test_a_whole_requests_extras_fit_behind_the_queue_and_none_when_it_is_long() -> None:
    adm: Admission[str] = Admission(CFG, whole_requests=True)
    adm.admit_optional("first", value=1.0, deadline_ms=40, now_ms=0, units=3)
    assert adm.fit_whole(base=4, extra=100) == 3
    adm.admit_optional("second", value=1.0, deadline_ms=40, now_ms=0, units=20)
    assert adm.fit_whole(base=4, extra=5) == 0
    assert adm.fit_whole(base=4, extra=0) == 0


def test_the_room_a_whole_request_had_is_what_fitted_not_what_it_asked() -> None:
    adm: Admission[str] = Admission(CFG, whole_requests=True)
    assert adm.take_room() is None                       # no request carried extras yet
    assert adm.fit_whole(base=4, extra=2) == 2
    adm.admit_optional("r", value=1.0, deadline_ms=40, now_ms=0, units=6)
    assert adm.fit_whole(base=4, extra=100) == 0         # behind the first one: no room
    assert adm.take_room() == 6                          # the best a request could have had
    assert adm.take_room() is None                       # read once a window


def test_the_room_a_ranking_request_had_is_the_most_it_could_have_kept() -> None:
    adm, _ = make()
    adm.admit_baseline("base", now_ms=0, units=3)
    assert adm.fit_optional(2) == 2
    assert adm.fit_optional(50) == 7
    assert adm.fit_optional(0) == 0
    assert adm.take_room() == 7
