"""The end of a chaos run: what the fleet made of the nemesis's messages, read back.

The preemption topic's notice ids show which notices the cluster kept through its faults; the
dead-letter topic's letters, by digest, which forgeries a receiver refused; the control
plane's LiftReports, followed through the run (the estimates topic is compacted, so at the
end it would hold only the last few), how many labels its join counted against how many the
load delivered.
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Callable

from schemas.clock import wall_ms
from schemas.codec import decode
from schemas.contract import DeadLetter, LiftReport, PreemptionNotice
from schemas.kafka_config import KafkaSettings
from surplus.chaos import history as h
from surplus.chaos.check import counted_labels
from surplus.chaos.forgery import digest
from surplus.chaos.recorder import Recorder
from surplus.fleet.load import LoadRunner
from surplus.fleet.procs import REGION, TopicReader

#: Seconds the end waits for the control plane's join to count every label delivered.
LABELS_SETTLE_S = 60.0


def read_all(kafka: KafkaSettings, topic: str, seconds: float = 5.0) -> list[bytes]:
    """Every message value on ``topic`` that ``seconds`` of reading from the start find."""
    reader = TopicReader(kafka, topic)
    try:
        reader.poll(seconds)
        return [m.value() for m in reader.messages if m.value()]
    finally:
        reader.close()


def read_back(kafka: KafkaSettings, rec: Recorder) -> None:
    """The notice ids on the preemption topic and the dead letters, into the history."""
    ids = []
    for value in read_all(kafka, "preemption"):
        with contextlib.suppress(Exception):
            ids.append(decode(PreemptionNotice, value).notice_id)
    rec.add(h.ReadBack(topic="preemption", ids=ids))
    for value in read_all(kafka, "deadletter"):
        with contextlib.suppress(Exception):
            letter = decode(DeadLetter, value)
            rec.add(h.DeadLetterRecord(
                source_topic=letter.source_topic, reason=letter.reason,
                digest=digest(base64.b64decode(letter.value_b64))))


def labels(estimates: TopicReader, rec: Recorder, load: LoadRunner, now: Callable[[], float],
           *, delivered: int, sent: int) -> None:
    """Every LiftReport of the scope (followed through the run), read on until the join
    has counted every label delivered (or ``LABELS_SETTLE_S`` passed).

    :param estimates: the reader that followed the estimates topic through the run.
    :param rec: the history so far (its faults), where the estimates and totals go.
    :param load: the fleet's load: the requests labelled and when each ended.
    :param now: load time (seconds), to place each report on the load's clock.
    :param delivered: labels the client delivered (sent less those dropped).
    :param sent: labels the load sent.
    """
    found: list[h.Estimate] = []
    deadline = time.monotonic() + LABELS_SETTLE_S
    while time.monotonic() < deadline:
        estimates.poll(2.0)
        found = []
        for message in estimates.messages:
            with contextlib.suppress(Exception):
                report = decode(LiftReport, message.value())
                if report.scope == REGION:
                    t = now() - (wall_ms() - report.ts_ms) / 1000.0
                    found.append(h.Estimate(t=round(t, 3), ts_ms=report.ts_ms,
                                            epoch=report.epoch, join=dict(report.join)))
        probe = h.History([h.RunInfo(seed=0, duration_s=1, sla_p99_ms=1, window_s=1,
                                     ttl_ms=1, max_clock_skew_ms=0, ttl_slack_ms=0,
                                     settle_s=0), *rec.of(h.FaultRecord), *found])
        if sum(counted_labels(probe).values()) >= delivered:
            break
    for estimate in found:
        rec.add(estimate)
    ends = {s.request_id: s.end_t for s in load.samples}
    times = sorted(round(ends[i], 3) for i in load.labelled if i in ends)
    rec.add(h.LabelTotals(sent=sent, delivered=delivered, times=times))
