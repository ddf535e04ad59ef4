"""When a recording with ``--stop-at-end`` may stop, and what it may write before: at the end
each partition had at start."""

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


def test_an_early_end_of_partition_event_holds_the_watermark_back() -> None:
    other = ("telemetry", 0)
    merge = _Merge([TP, other], {TP: (0, 2), other: (0, 1)})
    merge.eof(*TP)                      # said "at end" before its two messages were fetched
    merge.push("telemetry", 0, 0, 50, None, None)  # type: ignore[arg-type]
    merge.consumed("telemetry", 0, 0)
    assert merge.watermark() == float("-inf")     # TP may still bring earlier events
    merge.push("capacity", 0, 0, 10, None, None)  # type: ignore[arg-type]
    merge.consumed(*TP, 0)
    assert merge.watermark() == 10
    merge.push("capacity", 0, 1, 20, None, None)  # type: ignore[arg-type]
    merge.consumed(*TP, 1)
    merge.eof(*TP)
    merge.eof(*other)
    assert merge.watermark() == float("inf")
    assert [ts for ts, *_ in merge.pop_until(merge.watermark())] == [10, 20, 50]
