"""`surplus chaos --config FILE`: the run's settings, strict (an unknown or bad key stops the run
naming it). Pure: parsing only; reading the file is the command's."""

from __future__ import annotations

import tomllib

import msgspec

from surplus.chaos.schedule import ScheduleConfig


class ChaosConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The load, the checker's limits and the nemesis's schedule."""

    #: Ranking requests a second through the client library (open loop).
    rate_rps: float = 30.0
    #: Each request's deadline (ms): the powerful call's budget before baseline fallback.
    deadline_ms: float = 250.0
    #: Targets' TTL the control plane issues with (s).
    ttl_s: float = 6.0
    #: Baseline p99 bound (ms) in windows with no fault on the baseline path. Unset: the
    #: control plane's own RMA SLA (`RmaConfig.sla_p99_ms`).
    sla_p99_ms: float | None = None
    #: SLA windows (s), and how long after a fault on the baseline path heals its windows
    #: still count as faulted.
    window_s: float = 10.0
    settle_s: float = 5.0
    #: Share of served requests the client labels (their labels must all be counted).
    label_share: float = 0.2
    schedule: ScheduleConfig = msgspec.field(default_factory=ScheduleConfig)

    def __post_init__(self) -> None:
        for name in ("rate_rps", "deadline_ms", "ttl_s", "window_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: expected > 0, got {getattr(self, name)}")
        if self.sla_p99_ms is not None and self.sla_p99_ms <= 0:
            raise ValueError(f"sla_p99_ms: expected > 0, got {self.sla_p99_ms}")
        if self.settle_s < 0:
            raise ValueError(f"settle_s: expected >= 0, got {self.settle_s}")
        if not 0 <= self.label_share <= 1:
            raise ValueError(f"label_share: expected 0 to 1, got {self.label_share}")


def parse(text: str, source: str = "config") -> ChaosConfig:
    """The config in TOML ``text``; ValueError naming ``source`` and the key when it is bad."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: {exc}") from None
    try:
        return msgspec.convert(raw, ChaosConfig)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ValueError(f"{source}: {exc}") from None
