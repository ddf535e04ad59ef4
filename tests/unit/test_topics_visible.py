"""`surplus.topics.await_visible`: a topic counts as created once the brokers serve it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from surplus.topics import await_visible


@dataclass
class _Partition:
    leader: int


@dataclass
class _Topic:
    partitions: dict[int, _Partition]
    error: Any = None


@dataclass
class _Admin:
    """Serves one metadata snapshot per call, the last one for ever."""

    snapshots: list[dict[str, _Topic]]
    calls: int = 0
    timeouts: list[float] = field(default_factory=list)

    def list_topics(self, timeout: float) -> Any:
        self.timeouts.append(timeout)
        snap = self.snapshots[min(self.calls, len(self.snapshots) - 1)]
        self.calls += 1
        return type("Meta", (), {"topics": snap})()


def test_waits_until_every_partition_of_every_topic_has_a_leader() -> None:
    led = _Topic({0: _Partition(1), 1: _Partition(1)})
    admin = _Admin([{}, {"a": _Topic({0: _Partition(-1), 1: _Partition(1)})},
                    {"a": led}, {"a": led, "b": led}])
    await_visible(admin, ["a", "b"], timeout_s=5.0)  # type: ignore[arg-type]
    assert admin.calls == 4


def test_a_topic_never_served_times_out_naming_it() -> None:
    admin = _Admin([{"a": _Topic({0: _Partition(0)})}])
    with pytest.raises(TimeoutError, match="not served after 0 s: b"):
        await_visible(admin, ["a", "b"], timeout_s=0.2)  # type: ignore[arg-type]
