"""Admission: baseline is never refused nor queued behind optional work; optional work is shed
lowest value first, by reason, on overload, deadline, preemption and budget (fake clock)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.policy.admission import Admission, AdmissionConfig

# 1 ms per unit makes predicted delays easy to read: units queued == ms of predicted wait.
CFG = AdmissionConfig(max_queue_delay_ms=10.0, initial_ms_per_unit=1.0,
                      level_fractions=(0.25, 0.5), max_optional_items=100)
FAR = 1_000_000


def make(config: AdmissionConfig = CFG) -> tuple[Admission[str], list[tuple[str, str]]]:
    shed: list[tuple[str, str]] = []
    return Admission(config, on_shed=lambda item, reason: shed.append((item, reason))), shed


def items(batch: list) -> list[str]:
    return [w.item for w in batch]


# -- invariant 1: baseline first, never refused -------------------------------------------------

def test_baseline_is_served_before_optional_work_that_arrived_earlier() -> None:
    adm, _ = make()
    adm.admit_optional("opt-high", value=100.0, deadline_ms=FAR, now_ms=0)
    adm.admit_baseline("base", now_ms=1)
    batch = adm.next_batch(max_units=1, now_ms=2)
    assert items(batch) == ["base"]
    assert items(adm.next_batch(max_units=1, now_ms=3)) == ["opt-high"]


def test_a_batch_puts_every_baseline_item_before_any_optional_item() -> None:
    adm, _ = make()
    adm.admit_optional("o1", value=5.0, deadline_ms=FAR, now_ms=0)
    adm.admit_baseline("b1", now_ms=0)
    adm.admit_optional("o2", value=9.0, deadline_ms=FAR, now_ms=0)
    adm.admit_baseline("b2", now_ms=0)
    batch = adm.next_batch(max_units=10, now_ms=1)
    assert items(batch) == ["b1", "b2", "o2", "o1"]
    assert [w.optional for w in batch] == [False, False, True, True]


def test_optional_work_is_not_taken_while_baseline_work_is_still_queued() -> None:
    adm, _ = make()
    adm.admit_baseline("b1", now_ms=0, units=3)
    adm.admit_baseline("b2", now_ms=0, units=3)
    adm.admit_optional("o", value=1.0, deadline_ms=FAR, now_ms=0, units=1)
    # b2 does not fit after b1, so the optional unit must not jump ahead of it.
    assert items(adm.next_batch(max_units=4, now_ms=1)) == ["b1"]
    assert items(adm.next_batch(max_units=4, now_ms=1)) == ["b2", "o"]


def test_baseline_is_admitted_while_preempted_and_at_the_highest_shedding_level() -> None:
    adm, _ = make()
    adm.preempt(now_ms=0)
    for i in range(50):  # 50 ms of predicted work against a 10 ms bound
        adm.admit_baseline(f"b{i}", now_ms=0)
    assert adm.shedding_level(0) == 3
    served = items(adm.next_batch(max_units=1000, now_ms=1))
    assert served == [f"b{i}" for i in range(50)]
    assert adm.shed_units == {}


def test_arriving_baseline_pushes_optional_work_out_instead_of_waiting_behind_it() -> None:
    adm, shed = make()
    for i in range(8):
        adm.admit_optional(f"o{i}", value=float(i), deadline_ms=FAR, now_ms=0)
    adm.admit_baseline("big", now_ms=1, units=6)  # 6 + 8 units > 10 ms bound
    assert shed == [("o0", "overload"), ("o1", "overload"), ("o2", "overload"),
                    ("o3", "overload")]
    assert adm.predicted_delay_ms() <= CFG.max_queue_delay_ms
    assert items(adm.next_batch(max_units=100, now_ms=2))[0] == "big"


def test_first_item_is_taken_even_when_larger_than_the_batch() -> None:
    adm, _ = make()
    adm.admit_baseline("huge", now_ms=0, units=500)
    adm.admit_baseline("small", now_ms=0, units=1)
    assert items(adm.next_batch(max_units=64, now_ms=1)) == ["huge"]
    assert items(adm.next_batch(max_units=64, now_ms=1)) == ["small"]


# -- optional ordering and overload -------------------------------------------------------------

def test_optional_work_is_served_highest_value_first_and_fifo_among_equals() -> None:
    adm, _ = make()
    for name, value in [("a", 1.0), ("b", 3.0), ("c", 2.0), ("d", 3.0)]:
        adm.admit_optional(name, value=value, deadline_ms=FAR, now_ms=0)
    assert items(adm.next_batch(max_units=10, now_ms=1)) == ["b", "d", "c", "a"]


def test_overload_sheds_the_lowest_value_queued_work_first() -> None:
    adm, shed = make()
    for i, value in enumerate([5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0, 0.5]):
        assert adm.admit_optional(f"o{i}", value=value, deadline_ms=FAR, now_ms=0)
    assert adm.predicted_delay_ms() == 10.0
    assert adm.admit_optional("o10", value=10.0, deadline_ms=FAR, now_ms=0)
    assert shed == [("o9", "overload")]  # value 0.5 was the lowest
    assert adm.admit_optional("o11", value=6.5, deadline_ms=FAR, now_ms=0)
    assert shed[-1] == ("o1", "overload")  # then value 1.0
    assert adm.shed_units == {"overload": 2}


def test_newcomer_with_the_lowest_value_is_refused_without_a_callback() -> None:
    adm, shed = make()
    for i in range(10):
        adm.admit_optional(f"o{i}", value=5.0, deadline_ms=FAR, now_ms=0)
    assert adm.admit_optional("low", value=1.0, deadline_ms=FAR, now_ms=0) is False
    assert adm.last_refusal == "overload"
    assert shed == []
    assert adm.shed_units == {"overload": 1}
    assert adm.state(0).optional_items == 10


def test_overload_counts_units_not_items() -> None:
    adm, _ = make()
    adm.admit_optional("wide", value=1.0, deadline_ms=FAR, now_ms=0, units=8)
    adm.admit_optional("narrow", value=2.0, deadline_ms=FAR, now_ms=0, units=4)
    assert adm.shed_units == {"overload": 8}
    assert adm.state(0).optional_units == 4


def test_queued_item_cap_sheds_lowest_value() -> None:
    cfg = AdmissionConfig(max_queue_delay_ms=10_000.0, initial_ms_per_unit=0.001,
                          max_optional_items=3)
    adm, shed = make(cfg)
    for i, value in enumerate([4.0, 2.0, 3.0, 1.0]):
        adm.admit_optional(f"o{i}", value=value, deadline_ms=FAR, now_ms=0)
    assert adm.shed_units == {"overload": 1}
    assert adm.state(0).optional_items == 3
    assert shed == []  # the newcomer itself was the lowest


def test_optional_work_past_its_deadline_is_refused_at_the_door() -> None:
    adm, shed = make()
    assert adm.admit_optional("late", value=9.0, deadline_ms=100, now_ms=100) is False
    assert adm.last_refusal == "deadline"
    assert adm.shed_units == {"deadline": 1}
    assert shed == []


def test_queued_optional_work_that_expires_is_shed_not_served() -> None:
    adm, shed = make()
    adm.admit_optional("soon", value=9.0, deadline_ms=5, now_ms=0)
    adm.admit_optional("later", value=1.0, deadline_ms=50, now_ms=0)
    adm.admit_baseline("b", now_ms=0)
    assert items(adm.next_batch(max_units=10, now_ms=5)) == ["b", "later"]
    assert shed == [("soon", "deadline")]
    assert adm.shed_units == {"deadline": 1}


def test_baseline_work_has_no_deadline_shedding() -> None:
    adm, _ = make()
    adm.admit_baseline("b", now_ms=0)
    assert items(adm.next_batch(max_units=1, now_ms=10_000_000)) == ["b"]


# -- preemption ---------------------------------------------------------------------------------

def test_preemption_drops_all_queued_optional_work_at_once_and_counts_it() -> None:
    adm, shed = make()
    for i in range(4):
        adm.admit_optional(f"o{i}", value=float(i), deadline_ms=FAR, now_ms=0, units=2)
    adm.admit_baseline("b", now_ms=0)
    assert adm.preempt(now_ms=1) == 4
    assert sorted(shed) == [(f"o{i}", "preemption") for i in range(4)]
    assert adm.shed_units == {"preemption": 8}
    assert items(adm.next_batch(max_units=100, now_ms=2)) == ["b"]


def test_a_batch_in_service_across_a_notice_keeps_only_its_baseline_answers() -> None:
    adm, _ = make()
    adm.admit_baseline("b", now_ms=0, units=2)
    adm.admit_optional("o", value=1.0, deadline_ms=FAR, now_ms=0, units=3)
    before = adm.preemptions
    batch = adm.next_batch(max_units=100, now_ms=1)
    assert adm.usable(batch, before) == [True, True]  # no notice while it ran: all used
    assert adm.shed_units == {}
    adm.preempt(now_ms=2)
    adm.resume()  # resumed before the pass ended: it still ran across the notice
    assert adm.usable(batch, before) == [True, False]
    assert adm.shed_units == {"preemption": 3}
    assert adm.usable(batch, adm.preemptions) == [True, True]  # a pass taken after it


def test_preempted_admission_refuses_optional_work_until_resumed() -> None:
    adm, _ = make()
    adm.preempt(now_ms=0)
    assert adm.admit_optional("o", value=100.0, deadline_ms=FAR, now_ms=1) is False
    assert adm.last_refusal == "preemption"
    assert adm.shed_units == {"preemption": 1}
    assert adm.state(1).preempted and adm.shedding_level(1) == 3
    adm.resume()
    assert adm.admit_optional("o", value=100.0, deadline_ms=FAR, now_ms=2) is True
    assert adm.last_refusal is None
    assert adm.shedding_level(2) == 0


# -- budget -------------------------------------------------------------------------------------

def test_budget_limits_the_optional_rate_and_refills_with_time() -> None:
    cfg = AdmissionConfig(max_queue_delay_ms=10_000.0, initial_ms_per_unit=0.001,
                          budget_burst_s=1.0)
    adm, _ = make(cfg)
    adm.set_budget(10.0, now_ms=0)  # 10 units/s, 1 s of burst
    assert all(adm.admit_optional(f"o{i}", 1.0, FAR, now_ms=0) for i in range(10))
    assert adm.admit_optional("over", 1.0, FAR, now_ms=0) is False
    assert adm.last_refusal == "budget"
    assert adm.shed_units == {"budget": 1}
    assert adm.admit_optional("refilled", 1.0, FAR, now_ms=100) is True  # +1 unit after 100 ms
    assert adm.admit_optional("again", 1.0, FAR, now_ms=100) is False


def test_zero_budget_refuses_all_optional_work_and_none_lifts_the_limit() -> None:
    adm, _ = make(AdmissionConfig(max_queue_delay_ms=10_000.0, initial_ms_per_unit=0.001))
    adm.set_budget(0.0, now_ms=0)
    assert adm.admit_optional("o", 1.0, FAR, now_ms=0) is False
    assert adm.shed_units == {"budget": 1}
    adm.set_budget(None, now_ms=1)
    assert all(adm.admit_optional(f"o{i}", 1.0, FAR, now_ms=1, units=50) for i in range(5))


def test_baseline_work_is_not_charged_to_the_budget() -> None:
    adm, _ = make()
    adm.set_budget(0.0, now_ms=0)
    adm.admit_baseline("b", now_ms=0, units=5)
    assert items(adm.next_batch(10, now_ms=0)) == ["b"]
    assert adm.shed_units == {}


# -- bursts: optional work yields to a baseline surge within milliseconds -----------------------

# 0.01 ms per unit: 100 units/ms of throughput; no delay bound in the way, no floor unless asked.
SURGE = AdmissionConfig(max_queue_delay_ms=10_000.0, initial_ms_per_unit=0.01,
                        surge_floor_share=0.0)


def quiet(adm: Admission[str], start: int, end: int, *, every_ms: int = 10,
          optional_units: int = 9) -> list[bool]:
    """Steady traffic (1 baseline unit and ``optional_units`` optional units every
    ``every_ms``), served as it comes; returns whether each optional item was admitted."""
    admitted = []
    for t in range(start, end, every_ms):
        adm.admit_baseline(f"b{t}", now_ms=t)
        if optional_units:
            admitted.append(adm.admit_optional(f"o{t}", 1.0, FAR, now_ms=t,
                                               units=optional_units))
        batch = adm.next_batch(10**6, now_ms=t)
        adm.record_service(sum(w.units for w in batch), 0.1)
    return admitted


def test_steady_traffic_is_no_surge_and_optional_work_is_admitted() -> None:
    adm, _ = make(SURGE)
    assert all(quiet(adm, 0, 20_000))
    assert not adm.surging(20_000)
    assert adm.shed_units == {}


def test_a_baseline_burst_stops_optional_admission_within_milliseconds() -> None:
    adm, _ = make(SURGE)
    quiet(adm, 0, 20_000)
    # baseline at 10x its settled rate: one unit every millisecond
    t = 20_000
    while not adm.surging(t):
        adm.admit_baseline(f"burst{t}", now_ms=t)
        t += 1
    assert t - 20_000 <= 30  # caught in tens of milliseconds, not a control period
    assert adm.admit_optional("during", 1.0, FAR, now_ms=t, units=9) is False
    assert adm.last_refusal == "overload"
    assert adm.shed_units == {"overload": 9}
    assert adm.shedding_level(t) == 1  # clients are told to send less
    # the burst passes: optional work is admitted again and the level clears
    assert all(quiet(adm, t + 1_000, t + 3_000)[-10:])
    assert not adm.surging(t + 3_000)
    assert adm.shedding_level(t + 3_000) == 0


def test_during_a_surge_optional_work_keeps_the_load_at_the_settled_level() -> None:
    adm, _ = make(SURGE)
    quiet(adm, 0, 20_000, optional_units=29)  # settled: 3 units/ms offered
    admitted = 0
    for t in range(20_000, 20_500):  # baseline 1 unit/ms, optional offered at 29 units/ms
        adm.admit_baseline(f"b{t}", now_ms=t)
        admitted += adm.admit_optional(f"o{t}", 1.0, FAR, now_ms=t, units=29)
        adm.record_service(sum(w.units for w in adm.next_batch(10**6, now_ms=t)), 0.1)
    assert adm.surging(20_499)
    assert adm.load.rate(0) <= 1.05 * adm.surge_ceiling()
    assert 0 < admitted < 500 * 0.2  # the baseline took most of the room optional work had


def test_queued_optional_work_yields_to_a_surge_lowest_value_first() -> None:
    adm, shed = make(SURGE)
    quiet(adm, 0, 20_000)
    for i, value in enumerate([3.0, 1.0, 2.0]):
        assert adm.admit_optional(f"q{value:.0f}", value, FAR, now_ms=20_000 + i, units=9)
    t = 20_003
    while len(shed) < 3 and t < 20_200:
        adm.admit_baseline(f"burst{t}", now_ms=t, units=2)
        t += 1
    assert [item for item, _ in shed] == ["q1", "q2", "q3"]
    assert {reason for _, reason in shed} == {"overload"}
    assert adm.state(t).baseline_items == t - 20_003  # no baseline work lost


def test_a_fresh_worker_and_a_few_close_requests_are_no_surge() -> None:
    adm, _ = make(SURGE)
    for t in range(20):  # a new worker's first traffic
        adm.admit_baseline(f"b{t}", now_ms=t)
    assert not adm.surging(20)
    slow, _ = make(SURGE)
    for t in range(0, 60_000, 1_000):  # one request a second ...
        slow.admit_baseline(f"b{t}", now_ms=t)
    for t in range(60_000, 60_005):  # ... then five within 5 ms: chance, not a burst
        slow.admit_baseline(f"c{t}", now_ms=t)
    assert not slow.surging(60_005)
    assert slow.admit_optional("o", 1.0, FAR, now_ms=60_005, units=9)


def test_a_surge_still_admits_optional_work_under_the_floor_share() -> None:
    cfg = msgspec.structs.replace(SURGE, surge_floor_share=0.5)  # 50 units/ms always allowed
    adm, _ = make(cfg)
    quiet(adm, 0, 20_000)
    for t in range(20_000, 20_100):
        adm.admit_baseline(f"b{t}", now_ms=t)
    assert adm.surging(20_100)
    assert adm.admit_optional("o", 1.0, FAR, now_ms=20_100, units=9)


# -- shedding level and state -------------------------------------------------------------------

@pytest.mark.parametrize(("queued_units", "level"), [(0, 0), (2, 0), (3, 1), (5, 2), (9, 2),
                                                     (10, 3), (30, 3)])
def test_shedding_level_follows_queue_delay_against_the_bounds(queued_units: int,
                                                               level: int) -> None:
    adm, _ = make()
    if queued_units:
        adm.admit_baseline("b", now_ms=0, units=queued_units)
    assert adm.shedding_level(0) == level
    assert adm.state(0).shedding_level == level


def test_waiting_baseline_raises_the_reported_queue_delay() -> None:
    adm, _ = make()
    adm.admit_baseline("b", now_ms=0)
    assert adm.queue_delay_ms(now_ms=7) == 7.0
    assert adm.shedding_level(now_ms=7) == 2


def test_oldest_enqueued_covers_both_queues() -> None:
    adm, _ = make()
    assert adm.oldest_enqueued_ms() is None
    adm.admit_optional("o", 1.0, FAR, now_ms=3)
    adm.admit_baseline("b", now_ms=5)
    assert adm.oldest_enqueued_ms() == 3
    adm.next_batch(1, now_ms=6)
    assert adm.oldest_enqueued_ms() == 3
    adm.next_batch(1, now_ms=6)
    assert adm.oldest_enqueued_ms() is None


def test_count_shed_records_reasons_decided_elsewhere() -> None:
    adm, _ = make()
    adm.count_shed("stale_targets", 7)
    adm.count_shed("stale_targets", 0)
    assert adm.state(0).shed_units == {"stale_targets": 7}


def test_nan_value_is_a_programming_error() -> None:
    adm, _ = make()
    with pytest.raises(ValueError, match="NaN"):
        adm.admit_optional("o", float("nan"), FAR, now_ms=0)


def test_config_rejects_unknown_keys_and_unordered_levels_by_name() -> None:
    with pytest.raises(msgspec.ValidationError, match="max_delay"):
        msgspec.convert({"max_delay": 3}, AdmissionConfig)
    with pytest.raises(msgspec.ValidationError, match="level_fractions"):
        msgspec.convert({"level_fractions": [0.6, 0.3]}, AdmissionConfig)
    with pytest.raises(msgspec.ValidationError, match="max_queue_delay_ms"):
        msgspec.convert({"max_queue_delay_ms": -1}, AdmissionConfig)
    with pytest.raises(msgspec.ValidationError, match="surge_window_ms"):
        msgspec.convert({"surge_window_ms": 40_000}, AdmissionConfig)


# -- property: conservation and ordering under any interleaving ---------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("base"), st.integers(1, 4)),
    st.tuples(st.just("opt"), st.integers(1, 4), st.floats(0, 10), st.integers(0, 30)),
    st.tuples(st.just("batch"), st.integers(1, 8)),
    st.tuples(st.just("tick"), st.integers(0, 5)),
    st.tuples(st.just("preempt"),),
    st.tuples(st.just("resume"),),
), max_size=80)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_no_baseline_is_ever_lost_and_every_optional_unit_is_accounted(ops: list) -> None:
    adm, shed = make()
    now, n = 0, 0
    baseline_in: list[str] = []
    baseline_out: list[str] = []
    optional_in = optional_out = 0
    for op in ops:
        if op[0] == "base":
            n += 1
            baseline_in.append(f"b{n}")
            adm.admit_baseline(f"b{n}", now, units=op[1])
        elif op[0] == "opt":
            n += 1
            optional_in += op[1]
            adm.admit_optional(f"o{n}", op[2], now + op[3], now, units=op[1])
        elif op[0] == "batch":
            batch = adm.next_batch(op[1], now)
            flags = [w.optional for w in batch]
            assert flags == sorted(flags), "optional work ahead of baseline in a batch"
            if any(flags):
                assert adm.state(now).baseline_items == 0
            baseline_out += [w.item for w in batch if not w.optional]
            optional_out += sum(w.units for w in batch if w.optional)
            adm.record_service(sum(w.units for w in batch), 1.0)
        elif op[0] == "tick":
            now += op[1]
        elif op[0] == "preempt":
            adm.preempt(now)
        else:
            adm.resume()
    final = adm.next_batch(10**6, now)
    baseline_out += [w.item for w in final if not w.optional]
    optional_out += sum(w.units for w in final if w.optional)
    assert baseline_out == baseline_in  # FIFO, none lost, none shed
    assert all(item.startswith("o") for item, _ in shed)
    state = adm.state(now)
    assert optional_out + state.optional_units + sum(state.shed_units.values()) == optional_in

