"""Optional work shed unserved (``workers.policy.shedding``): every unit counted by reason,
withdrawn from the offered load, its waiter told unless it was refused at the door."""

from __future__ import annotations

from workers.policy.admission_state import Admitted
from workers.policy.load_meter import LoadMeter
from workers.policy.optional_queue import OptionalQueue
from workers.policy.shedding import Shedding


def shedding() -> tuple[Shedding[str], list[tuple[str, str]]]:
    told: list[tuple[str, str]] = []
    queue: OptionalQueue[str] = OptionalQueue()
    return Shedding(queue, LoadMeter(100.0, 10_000.0),
                    lambda item, reason: told.append((item, reason))), told


def test_expired_work_is_shed_for_its_deadline_and_the_rest_stays() -> None:
    shed, told = shedding()
    shed.queue.push("due", 1.0, 2, 10, 0)
    shed.queue.push("later", 1.0, 3, 100, 0)
    shed.expire(10)
    assert told == [("due", "deadline")]
    assert shed.units == {"deadline": 2}
    assert shed.queue.items == 1


def test_all_sheds_everything_best_first_and_says_how_many() -> None:
    shed, told = shedding()
    shed.queue.push("low", 1.0, 1, 100, 0)
    shed.queue.push("high", 9.0, 1, 100, 0)
    assert shed.all("preemption") == 2
    assert [item for item, _ in told] == ["high", "low"]
    assert shed.units == {"preemption": 2}


def test_work_refused_at_the_door_is_counted_but_nobody_is_told() -> None:
    shed, told = shedding()
    shed.load.add(4, optional=True)
    shed.refuse(shed.queue.push("new", 1.0, 4, 100, 0))
    assert told == [] and shed.units == {"overload": 4}
    assert shed.load.rate(1, optional=True) == 0.0  # offered, then withdrawn


def test_nothing_is_counted_for_no_units() -> None:
    shed, _ = shedding()
    shed.count("stale_targets", 0)
    assert shed.units == {}


def test_a_notice_during_service_stops_the_optional_answers_only() -> None:
    shed, _ = shedding()
    batch = [Admitted("b", False, 3, 0), Admitted("o", True, 5, 0)]
    assert shed.stopped(batch) == [True, False]
    assert shed.units == {"preemption": 5}
