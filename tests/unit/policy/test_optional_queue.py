"""The value-ordered optional queue (``workers.policy.optional_queue``): served best first,
shed worst first, expired earliest deadline first, whatever order removals come in."""

from __future__ import annotations

from workers.policy.optional_queue import COMPACT_SLACK, OptionalQueue


def test_best_is_the_highest_value_and_the_oldest_among_equals() -> None:
    queue: OptionalQueue[str] = OptionalQueue()
    queue.push("a", 1.0, 1, 100, 0)
    queue.push("b", 5.0, 1, 100, 1)
    queue.push("c", 5.0, 1, 100, 2)
    assert queue.best().item == "b"


def test_worst_is_the_lowest_value_and_the_newest_among_equals() -> None:
    queue: OptionalQueue[str] = OptionalQueue()
    queue.push("a", 1.0, 1, 100, 0)
    queue.push("b", 1.0, 1, 100, 1)
    queue.push("c", 5.0, 1, 100, 2)
    assert queue.worst().item == "b"


def test_earliest_is_the_first_deadline_whatever_its_value() -> None:
    queue: OptionalQueue[str] = OptionalQueue()
    queue.push("late", 0.1, 1, 500, 0)
    queue.push("soon", 9.0, 1, 50, 1)
    assert queue.earliest().item == "soon"


def test_a_removed_entry_is_never_returned_and_its_units_leave() -> None:
    queue: OptionalQueue[str] = OptionalQueue()
    best = queue.push("best", 9.0, 3, 50, 0)
    queue.push("rest", 1.0, 2, 500, 1)
    queue.remove(best)
    assert (queue.items, queue.units) == (1, 2)
    assert queue.best().item == queue.worst().item == queue.earliest().item == "rest"
    assert queue.oldest_enqueued_ms() == 1


def test_an_empty_queue_has_no_oldest_arrival() -> None:
    queue: OptionalQueue[str] = OptionalQueue()
    queue.remove(queue.push("a", 1.0, 1, 100, 7))
    assert queue.oldest_enqueued_ms() is None
    assert (queue.items, queue.units) == (0, 0)


def test_many_removals_from_one_end_keep_the_other_orders_right() -> None:
    queue: OptionalQueue[int] = OptionalQueue()
    entries = [queue.push(i, float(i), 1, 1_000 - i, i) for i in range(4 * COMPACT_SLACK)]
    for entry in entries[: 3 * COMPACT_SLACK]:   # the lowest values go, heaps get compacted
        queue.remove(entry)
    left = 4 * COMPACT_SLACK - 1
    assert queue.items == COMPACT_SLACK
    assert (queue.best().item, queue.worst().item) == (left, 3 * COMPACT_SLACK)
    assert queue.earliest().item == left
    assert queue.oldest_enqueued_ms() == 3 * COMPACT_SLACK
