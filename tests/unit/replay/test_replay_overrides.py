"""Offline replay honours the operator's overrides a log holds, as the live plane does."""

from __future__ import annotations

from pathlib import Path

from schemas.codec import encode
from schemas.contract import ControlTargets, OperatorOverride
from streams.control.config import ControlConfig
from streams.eventlog import AnyEvent, make_event, read_events, write_events
from streams.replay import ControlDriver
from tests.unit.control.factories import REGION
from tests.unit.replay.helpers import T0, small_log_events

CONFIG = ControlConfig(period_s=2.0)
KILL_AT, KILL_TTL_MS = T0 + 8_500, 4_000
CAP_AT, CLEAR_AT = T0 + 16_500, T0 + 26_500  # before the log's preemption (at 30 s)


def _log_with_overrides(path: Path) -> list[AnyEvent]:
    def override(at: int, **fields: object) -> AnyEvent:
        return make_event(at, "overrides", REGION, OperatorOverride(
            scope=REGION, issued_at_ms=at, reason="test", **fields))  # type: ignore[arg-type]

    events = [*small_log_events(seconds=60),
              override(KILL_AT, kill=True, ttl_ms=KILL_TTL_MS),
              override(CAP_AT, max_extra=1, ttl_ms=3_600_000),
              override(CLEAR_AT, action="clear", ttl_ms=3_600_000)]
    events.sort(key=lambda e: e.ts)  # stable: an override after the reports of its second
    write_events(path, events)
    return list(read_events(path, strict=True))  # through the log's codec, as replay reads it


def _replay(events: list[AnyEvent]) -> list[ControlTargets]:
    out: list[ControlTargets] = []
    ControlDriver(CONFIG, on_targets=lambda t, c: out.append(t)).run(iter(events))
    return out


def test_replay_applies_kill_ttl_cap_and_clear_where_the_log_has_them(tmp_path: Path) -> None:
    events = _log_with_overrides(tmp_path / "log.jsonl")
    assert sum(e.topic == "overrides" for e in events) == 3
    targets = _replay(events)
    killed = next(t for t in targets if t.issued_at_ms == KILL_AT)
    assert killed.reason == "operator" and killed.rma.extra_candidates == 0
    assert killed.sbm.coverage == 0.0
    during = [t for t in targets if KILL_AT <= t.issued_at_ms < KILL_AT + KILL_TTL_MS]
    assert during and all(t.reason == "operator" for t in during)
    after_ttl = [t for t in targets if KILL_AT + KILL_TTL_MS <= t.issued_at_ms < CAP_AT]
    assert after_ttl and all(t.reason != "operator" for t in after_ttl)
    capped = [t for t in targets if CAP_AT < t.issued_at_ms <= CLEAR_AT]
    assert capped and all(t.reason == "operator" and t.rma.extra_candidates <= 1
                          for t in capped)
    assert any(t.rma.limited_by == "operator" for t in capped)  # the cap bound
    assert all(t.reason != "operator" for t in targets if t.issued_at_ms > CLEAR_AT)


def test_replaying_a_log_with_overrides_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    events = _log_with_overrides(tmp_path / "log.jsonl")
    first, second = _replay(events), _replay(events)
    assert [encode(t) for t in first] == [encode(t) for t in second]
