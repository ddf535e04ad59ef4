"""A worker's two queues (``workers.policy.work_queues``): a forward pass takes baseline
work first and optional work only once no baseline waits."""

from __future__ import annotations

from workers.policy.work_queues import WorkQueues


def test_baseline_goes_first_and_optional_only_once_none_waits() -> None:
    queues: WorkQueues[str] = WorkQueues()
    queues.optional.push("opt", 9.0, 1, 1_000, 0)
    queues.add_baseline("base", 2, 1)
    batch = queues.take(10)
    assert [(w.item, w.optional) for w in batch] == [("base", False), ("opt", True)]
    assert (queues.units, queues.items) == (0, 0)


def test_optional_waits_while_baseline_is_left_over() -> None:
    queues: WorkQueues[str] = WorkQueues()
    queues.add_baseline("b1", 4, 0)
    queues.add_baseline("b2", 4, 0)
    queues.optional.push("opt", 9.0, 1, 1_000, 0)
    assert [w.item for w in queues.take(5)] == ["b1"]  # b2 does not fit; opt may not pass it


def test_the_first_item_is_taken_even_if_it_alone_is_over_the_pass() -> None:
    queues: WorkQueues[str] = WorkQueues()
    queues.add_baseline("big", 50, 0)
    assert [w.item for w in queues.take(10)] == ["big"]


def test_taking_stops_at_the_first_optional_item_that_does_not_fit() -> None:
    queues: WorkQueues[str] = WorkQueues()
    queues.optional.push("large", 9.0, 8, 1_000, 0)
    queues.optional.push("small", 1.0, 1, 1_000, 0)
    queues.add_baseline("base", 4, 0)
    assert [w.item for w in queues.take(10)] == ["base"]  # small may not overtake large


def test_the_oldest_arrival_and_baseline_age_span_both_queues() -> None:
    queues: WorkQueues[str] = WorkQueues()
    assert queues.oldest_enqueued_ms() is None and queues.baseline_age_ms(50) == 0
    queues.optional.push("opt", 1.0, 1, 1_000, 5)
    queues.add_baseline("base", 1, 20)
    assert queues.oldest_enqueued_ms() == 5
    assert queues.baseline_age_ms(50) == 30
