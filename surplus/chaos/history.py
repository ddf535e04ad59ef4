"""What a chaos run saw, one record a line (JSONL): the history the checker judges.

Pure: typed records and their encoding; writing the file is the run's (``surplus.chaos.run``).
A request and a targets offer are the load's own records (`surplus.fleet.records`), written as
they are.
Times ``t`` are seconds since the load started on the run's monotonic clock (the clock no
fault moves); ``wall_ms`` is the run's own wall clock, which no fault moves either (clock jumps
are applied to the processes the run starts, never to itself).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec

from surplus.fleet.records import Request, TargetOffer

__all__ = ["DeadLetterRecord", "Estimate", "FaultRecord", "ForgedRecord", "GrantRecord",
           "History", "LabelTotals", "NoticeRecord", "ReadBack", "Record", "Request",
           "RunInfo", "TargetOffer", "WorkerEpoch", "decode_lines", "encode"]


class RunInfo(msgspec.Struct, frozen=True, kw_only=True, tag="run"):
    """The run: seed and length, and the limits the checker holds it to."""

    seed: int
    duration_s: float
    sla_p99_ms: float
    window_s: float
    ttl_ms: int
    max_clock_skew_ms: int
    #: How much older than its TTL a target may be when used, on the run's clock: the
    #: receiver reads age through its estimated offset to the control plane (the least lag
    #: of recent targets), which a true clock on both sides keeps to transit time.
    ttl_slack_ms: int
    #: The longest the client may go without a new target, faults and all (a failover and a
    #: control plane's restart take seconds; a control plane that never ticks, for ever).
    max_targets_gap_s: float = 60.0
    #: Seconds after a fault on the baseline path ends during which SLA windows still count
    #: as faulted (the replica's restart and the client's retries settling).
    settle_s: float
    #: Seconds from the start of the history during which SLA windows count as faulted: the
    #: fleet's own start, three brokers' JVMs still warming up on the run's one host as after
    #: a broker's restart (the schedule's ``warmup_s``, in which no fault is injected either).
    #: 0 in a history written before it.
    startup_s: float = 0.0


class WorkerEpoch(msgspec.Struct, frozen=True, tag="worker_epoch"):
    """The epoch of the targets one worker held, scraped from its /metrics."""

    t: float
    worker: str
    epoch: int


class FaultRecord(msgspec.Struct, frozen=True, tag="fault"):
    """A fault as injected: when it started and healed (``end_t``), and whether it could be
    (``ok``; ``detail`` says what happened or why not)."""

    t: float
    end_t: float
    kind: str
    target: str
    param: str = ""
    baseline_path: bool = False
    ok: bool = True
    detail: str = ""


class NoticeRecord(msgspec.Struct, frozen=True, tag="notice"):
    """A genuine preemption notice the nemesis published (a storm's, or a duplicate of one)."""

    t: float
    notice_id: str
    pool: str
    replicas: list[str]
    #: The notice's deadline on the run's clock.
    deadline_t: float
    #: The broker acknowledged it (acks=all), and when.
    acked: bool
    acked_t: float | None = None
    #: Whether the notice reaches a replica that serves optional work only (the powerful
    #: pool's): the checker holds that replica to the deadline.
    reclaims_replica: bool = False
    #: When the reclaimed replica answered the direct copy (POST /v1/preempt), if it did.
    direct_t: float | None = None


class GrantRecord(msgspec.Struct, frozen=True, tag="grant"):
    """Opportunistic capacity (re)granted to a pool."""

    t: float
    pool: str
    acked: bool


class ForgedRecord(msgspec.Struct, frozen=True, tag="forged"):
    """A message forged by the nemesis (no signature, an unknown key, a bad signature)."""

    t: float
    topic: str
    how: str
    digest: str
    acked: bool


class DeadLetterRecord(msgspec.Struct, frozen=True, tag="deadletter"):
    """A dead letter read back at the end: where it came from, why, and its value's digest."""

    source_topic: str
    reason: str
    digest: str


class ReadBack(msgspec.Struct, frozen=True, tag="readback"):
    """The ids of one topic's messages read back from the beginning at the end of the run."""

    topic: str
    ids: list[str]


class LabelTotals(msgspec.Struct, frozen=True, tag="labels"):
    """Labels the client sent, those it handed to its producer (not dropped), and when each
    was sent."""

    sent: int
    delivered: int
    times: list[float] = []


class Estimate(msgspec.Struct, frozen=True, tag="estimate"):
    """One LiftReport of the scope read back from the estimates topic at the end: when it
    was issued (``t``, its ``ts_ms`` on the run's clock; the control plane keeps a true
    clock) and its join counts by reason, since that control-plane process started (the
    counts are not part of the state a restart restores)."""

    t: float
    ts_ms: int
    epoch: int
    join: dict[str, int]


Record = (RunInfo | Request | TargetOffer | WorkerEpoch | FaultRecord | NoticeRecord
          | GrantRecord | ForgedRecord | DeadLetterRecord | ReadBack | LabelTotals | Estimate)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)


def encode(record: Record) -> bytes:
    """One line of the history file (no newline)."""
    return _encoder.encode(record)


def decode_lines(lines: Iterable[bytes | str]) -> Iterator[Record]:
    """Records of a history file's lines (blank lines skipped); a bad line raises, naming
    its number and the field."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield _decoder.decode(line)
        except msgspec.ValidationError as exc:
            raise ValueError(f"history line {n}: {exc}") from None
        except msgspec.DecodeError as exc:
            raise ValueError(f"history line {n}: {exc}") from None


class History:
    """A history's records by type, in the order they were written."""

    def __init__(self, records: Iterable[Record]) -> None:
        self.records = list(records)
        infos = [r for r in self.records if isinstance(r, RunInfo)]
        if len(infos) != 1:
            raise ValueError(f"a history has one run record, this one {len(infos)}")
        self.run = infos[0]
        self.requests = sorted((r for r in self.records if isinstance(r, Request)),
                               key=lambda r: r.t)
        self.offers = [r for r in self.records if isinstance(r, TargetOffer)]
        self.worker_epochs = [r for r in self.records if isinstance(r, WorkerEpoch)]
        self.faults = [r for r in self.records if isinstance(r, FaultRecord)]
        self.notices = [r for r in self.records if isinstance(r, NoticeRecord)]
        self.grants = [r for r in self.records if isinstance(r, GrantRecord)]
        self.forged = [r for r in self.records if isinstance(r, ForgedRecord)]
        self.dead_letters = [r for r in self.records if isinstance(r, DeadLetterRecord)]
        self.read_back = {r.topic: set(r.ids) for r in self.records if isinstance(r, ReadBack)}
        labels = [r for r in self.records if isinstance(r, LabelTotals)]
        self.labels = labels[-1] if labels else None
        self.estimates = [r for r in self.records if isinstance(r, Estimate)]
