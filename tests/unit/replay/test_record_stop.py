"""When a recording with ``--stop-at-end`` may stop: at the end each partition had at start."""

from __future__ import annotations

from streams.replay_live import _Merge

TP = ("capacity", 0)


def test_an_end_of_partition_event_before_the_messages_does_not_stop_the_recording() -> None:
    merge = _Merge([TP], {TP: (0, 3)})
    merge.eof(*TP)                      # a fresh consumer's first fetch said "at end"
    assert not merge.caught_up()
    for offset in range(3):
        merge.consumed(*TP, offset)     # then the three messages came (decoded or not)
    merge.eof(*TP)
    assert merge.caught_up()


def test_a_partition_empty_at_the_start_is_caught_up_at_its_end_event() -> None:
    merge = _Merge([TP], {TP: (5, 5)})
    assert not merge.caught_up()
    merge.eof(*TP)
    assert merge.caught_up()


def test_a_message_after_the_end_event_waits_for_the_next_one() -> None:
    merge = _Merge([TP])
    merge.eof(*TP)
    assert merge.caught_up()
    merge.push("capacity", 0, 0, 1, None, None)  # type: ignore[arg-type]
    assert not merge.caught_up()
