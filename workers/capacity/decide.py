"""What the platform says about one replica's machine, turned into ``PreemptionNotice``s (pure).

Sources and what they mean for Surplus:

- **EC2 spot interruption** (``/latest/meta-data/spot/instance-action``: ``{"action":
  "terminate", "time": "2026-12-01T12:00:00Z"}``): the machine is taken back at ``time``, so the
  notice's deadline is that time. A time already past still makes a notice (invariant 3: a
  notice at or past its deadline stops optional work on arrival).
- **EC2 rebalance recommendation** (``/latest/meta-data/events/recommendations/rebalance``:
  ``{"noticeTime": "..."}``): the machine is at elevated risk of interruption, and may well run
  for hours. Surplus reacts to the interruption itself within milliseconds, so by default the
  recommendation is only logged (``on_rebalance="log"``); ``"notice"`` treats it as a reclaim
  ``rebalance_deadline_s`` after its notice time, for fleets that would rather give up the
  replica's optional work early (AWS's "proactive rebalancing").
- **Kubernetes termination** (the pod's preStop hook or SIGTERM): the pod goes within its
  grace period, so the deadline is now plus the grace.

Whatever the source, one rule: a notice goes out when it is the replica's first, or when it
brings the deadline forward (an interruption after a rebalance notice, a preStop call shorter
than the interruption's notice). Polling the same document again sends nothing. Bad documents
raise ``MetadataError`` saying what was wrong; the caller logs it and polls on.

No clock here: every call takes ``now_ms``.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from schemas.contract import PreemptionNotice

ACTIONS = ("terminate", "stop", "hibernate")
RebalancePolicy = Literal["log", "notice"]


class MetadataError(ValueError):
    """A metadata document that cannot be used; the message names what was wrong."""


class Replica(msgspec.Struct, frozen=True, kw_only=True):
    """The replica an agent speaks for: its id and pool as the worker reports them, and the
    units a reclaim takes off the pool's grant."""

    worker_id: str
    pool_id: str
    accelerator_units: float = 1.0
    cpu_units: float = 0.0

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise ValueError("worker id must not be empty")
        parts = self.pool_id.split("/")
        if len(parts) != 5 or not all(parts):
            raise ValueError(f"pool id {self.pool_id!r} is not "
                             "region/service/model/accelerator/tier")
        if self.accelerator_units < 0 or self.cpu_units < 0:
            raise ValueError("accelerator and CPU units must not be negative")

    @property
    def region(self) -> str:
        return self.pool_id.split("/")[0]

    @property
    def accelerator(self) -> str:
        return self.pool_id.split("/")[3]


class InstanceAction(msgspec.Struct, frozen=True):
    """A spot interruption: ``action`` happens to the instance at ``at_ms``."""

    action: str
    at_ms: int


class Rebalance(msgspec.Struct, frozen=True):
    """A rebalance recommendation, emitted at ``notice_ms``."""

    notice_ms: int


class _ActionDoc(msgspec.Struct):
    action: str
    time: str


class _RebalanceDoc(msgspec.Struct, rename={"notice_time": "noticeTime"}):
    notice_time: str


_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?"
                      r"([Zz]|[+-]\d{2}:\d{2})")


def rfc3339_ms(text: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 time (``2026-12-01T12:00:00Z``, offsets and
    fractions allowed); MetadataError names the text otherwise."""
    m = _RFC3339.fullmatch(text.strip())
    if m is None:
        raise MetadataError(f"time {text!r} is not RFC 3339 (e.g. 2026-12-01T12:00:00Z)")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= _days_in(year, month) and hour < 24
            and minute < 60 and second < 61):
        raise MetadataError(f"time {text!r} is not a valid date and time")
    frac, zone = m.group(7), m.group(8)
    offset_s = 0
    if zone not in ("Z", "z"):
        sign = -1 if zone[0] == "-" else 1
        offset_s = sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    seconds = (_days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60
               + second - offset_s)
    millis = int((frac[1:] + "000")[:3]) if frac else 0
    return seconds * 1000 + millis


def _days_in(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def _decode(body: bytes, doc: type[msgspec.Struct], what: str) -> msgspec.Struct:
    try:
        return msgspec.json.decode(body, type=doc)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        shown = body[:120].decode("utf-8", errors="replace")
        raise MetadataError(f"{what} is not the expected JSON ({exc}): {shown!r}") from None


def parse_instance_action(body: bytes) -> InstanceAction:
    """``spot/instance-action``'s document; MetadataError says what is wrong with it."""
    doc = _decode(body, _ActionDoc, "spot/instance-action")
    assert isinstance(doc, _ActionDoc)
    if doc.action not in ACTIONS:
        raise MetadataError(f"spot/instance-action: action {doc.action!r} is not one of "
                            f"{', '.join(ACTIONS)}")
    return InstanceAction(doc.action, rfc3339_ms(doc.time))


def parse_rebalance(body: bytes) -> Rebalance:
    """``events/recommendations/rebalance``'s document; MetadataError says what is wrong."""
    doc = _decode(body, _RebalanceDoc, "events/recommendations/rebalance")
    assert isinstance(doc, _RebalanceDoc)
    return Rebalance(rfc3339_ms(doc.notice_time))


class NoticeDecider:
    """The notices one replica's agent sends, from what its sources report over time."""

    def __init__(self, replica: Replica, *, on_rebalance: RebalancePolicy = "log",
                 rebalance_deadline_s: float = 120.0) -> None:
        if rebalance_deadline_s < 0:
            raise ValueError("rebalance_deadline_s must not be negative")
        self.replica = replica
        self.on_rebalance_policy = on_rebalance
        self.rebalance_deadline_ms = round(rebalance_deadline_s * 1000)
        self.sent: list[PreemptionNotice] = []
        self.rebalances_seen = 0

    @property
    def deadline_ms(self) -> int | None:
        """The earliest deadline announced so far (None: no notice sent)."""
        return min((n.deadline_ms for n in self.sent), default=None)

    def on_instance_action(self, action: InstanceAction, now_ms: int) -> PreemptionNotice | None:
        return self._notice(f"aws-{action.action}", action.at_ms, now_ms)

    def on_rebalance(self, rebalance: Rebalance, now_ms: int) -> PreemptionNotice | None:
        """A notice only with ``on_rebalance="notice"``, once; always counted."""
        first = self.rebalances_seen == 0
        self.rebalances_seen += 1
        if self.on_rebalance_policy != "notice" or not first:
            return None
        return self._notice("aws-rebalance", rebalance.notice_ms + self.rebalance_deadline_ms,
                            now_ms)

    def on_termination(self, grace_s: float, now_ms: int, *, why: str) -> PreemptionNotice | None:
        """The pod is being terminated (``why``: ``prestop`` or ``sigterm``): it is gone
        within ``grace_s``."""
        if grace_s < 0:
            raise ValueError("grace period must not be negative")
        return self._notice(f"k8s-{why}", now_ms + round(grace_s * 1000), now_ms)

    def _notice(self, kind: str, deadline_ms: int, now_ms: int) -> PreemptionNotice | None:
        known = self.deadline_ms
        if known is not None and deadline_ms >= known:
            return None
        r = self.replica
        notice = PreemptionNotice(
            notice_id=f"{kind}-{deadline_ms}-{r.worker_id}"[:200], ts_ms=now_ms, region=r.region,
            pool_id=r.pool_id, replicas=[r.worker_id], deadline_ms=max(0, deadline_ms),
            accelerator=r.accelerator, accelerator_units=r.accelerator_units,
            cpu_units=r.cpu_units)
        self.sent.append(notice)
        return notice
