"""What a soak reads of a process: /proc of a real one, and lag and age from /metrics text."""

from __future__ import annotations

import os
import threading

from surplus.soak import probe


def test_resources_of_this_process_count_its_threads_and_fds() -> None:
    before = probe.resources(os.getpid())
    assert before is not None and before.rss_mib > 1
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    read, write = os.pipe()
    try:
        after = probe.resources(os.getpid())
        assert after is not None
        assert after.threads == before.threads + 1
        assert after.fds == before.fds + 2
    finally:
        stop.set()
        thread.join()
        os.close(read)
        os.close(write)


def test_a_process_that_is_gone_has_no_resources() -> None:
    assert probe.resources(2**22 + 12345) is None


CONTROL = """\
# TYPE surplus_control_consumer_lag gauge
surplus_control_consumer_lag{partition="0",topic="t.telemetry"} 3.0
surplus_control_consumer_lag{partition="1",topic="t.telemetry"} 2.0
surplus_control_events_total{topic="telemetry"} 812.0
"""
WORKER = """\
# TYPE surplus_worker_kafka_lag_messages gauge
surplus_worker_kafka_lag_messages{topic="targets"} 0.0
surplus_worker_kafka_lag_messages{topic="preemption"} 1.0
# TYPE surplus_worker_targets_age_seconds gauge
surplus_worker_targets_age_seconds 0.734
"""


def test_lag_is_summed_over_partitions_and_consumers_and_age_read_from_workers() -> None:
    assert probe.flow(CONTROL) == {"consumer_lag": 5.0}
    assert probe.flow(WORKER) == {"consumer_lag": 1.0, "targets_age_s": 0.734}


def test_a_worker_without_targets_reports_no_age_and_a_plain_process_nothing() -> None:
    assert probe.flow(WORKER.replace("0.734", "-1.0")) == {"consumer_lag": 1.0}
    assert probe.flow("# nothing\n") == {}
