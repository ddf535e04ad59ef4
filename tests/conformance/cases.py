"""Recorded sequences that the live worker and the simulated worker must answer alike.

A case is a list of steps on one replica, on a shared fake clock that starts at ``T0``. To add
a case, append a :class:`Case` to ``CASES``: the test runs every case on both sides and compares
each step's answer. Steps:

- ``Wait(ms)``: the clock moves on.
- ``Targets(...)``: a ControlTargets message for the replica's scope (valid, expired, from
  another scope, out of range...).
- ``Notice(...)``: a PreemptionNotice for this replica, its whole pool, or another replica.
- ``Capacity(...)``: a CapacityEvent (the control plane's input: neither worker acts on it,
  and the answers after it show that).
- ``Rank(base, extra)``: a ranking request with baseline and extra candidates (on a replica
  of the powerful model, the whole request is optional).
- ``Report()``: close the telemetry window.
"""

from __future__ import annotations

from dataclasses import dataclass

T0 = 1_700_000_000_000
REGION = "eu1"
WORKER = "eu1-w0"


@dataclass(frozen=True)
class Wait:
    ms: int


@dataclass(frozen=True)
class Targets:
    epoch: int
    extra: int = 8
    budget: float = 1e6
    coverage: float = 0.5
    issued_ms_ago: int = 0
    ttl_ms: int = 60_000
    scope: str = REGION
    out_of_range: bool = False
    """Built in code past the contract's bounds (a negative budget), as a buggy sender would."""
    powerful_extra: int | None = None
    """The SBM target's cap on the extras of powerful requests (a v5 target)."""


@dataclass(frozen=True)
class Notice:
    notice_id: str
    replicas: tuple[str, ...] = (WORKER,)
    deadline_in_ms: int = 30_000
    other_pool: bool = False
    issued_ms_ago: int = 0
    """How long before now the notice was issued (before the replica started: stale)."""


@dataclass(frozen=True)
class Capacity:
    kind: str = "grant"
    units: float = 2.0


@dataclass(frozen=True)
class Rank:
    base: int
    extra: int
    value: float = 1.0


@dataclass(frozen=True)
class Report:
    pass


Step = Wait | Targets | Notice | Capacity | Rank | Report


@dataclass(frozen=True)
class Case:
    name: str
    steps: tuple[Step, ...]
    model: str = "baseline"
    """``powerful``: an opportunistic replica of the powerful model (whole requests)."""
    budget_share: float = 1.0
    ms_per_unit: float | None = None
    """A service time both sides assume before they measure one (the live side then measures
    torch, the simulated side its pool's rate): a case that depends on it ranks once."""
    max_queue_delay_ms: float | None = None


CASES: tuple[Case, ...] = (
    Case("no targets: baseline only, extras counted stale", (
        Rank(4, 6), Wait(10), Rank(4, 0), Report())),
    Case("valid targets cap extras; the rest over target", (
        Targets(1, extra=5), Rank(4, 8), Rank(4, 3), Wait(100), Report())),
    Case("expired, from another scope and out of range leave baseline only", (
        Targets(1, issued_ms_ago=70_000), Rank(4, 4),
        Targets(2, scope="us1"), Rank(4, 4),
        Targets(3, out_of_range=True), Rank(4, 4),
        Targets(4, extra=2), Rank(4, 4),
        Targets(4, extra=9), Rank(4, 4),  # same epoch again: refused, extra stays 2
        Report())),
    Case("held targets lapse at their TTL", (
        Targets(1, ttl_ms=1_000), Rank(2, 3), Wait(1_500), Rank(2, 3), Report())),
    Case("budget: this replica's share of the fleet budget, banked for a second or five "
         "requests' worth of the target, whichever is more", (
        Targets(1, extra=8, budget=40.0), Rank(2, 8), Rank(2, 8), Rank(2, 8), Rank(2, 8),
        Rank(2, 8), Rank(2, 8), Wait(500), Rank(2, 8), Report()), budget_share=0.5),
    Case("notices: another replica's, mine, a duplicate, then resume on newer targets", (
        Targets(1, extra=4), Rank(3, 4),
        Notice("n-other", replicas=("eu1-w9",)), Rank(3, 4),
        Notice("n-pool", other_pool=True), Rank(3, 4),
        Notice("n1"), Rank(3, 4), Report(),
        Notice("n1"), Wait(10), Rank(3, 4),
        Targets(2, extra=4, issued_ms_ago=100), Rank(3, 4),  # sent before the notice
        Wait(10), Targets(3, extra=4), Rank(3, 4), Report())),
    Case("a reclaim issued before the replica started and over by now changes nothing", (
        Targets(1, extra=4), Notice("old", issued_ms_ago=5, deadline_in_ms=-1), Rank(3, 4),
        Report())),
    Case("a notice past its deadline stops optional work at once", (
        Targets(1, extra=4), Rank(3, 4), Wait(20), Notice("late", deadline_in_ms=-5),
        Rank(3, 4), Report())),
    Case("capacity events are the control plane's, not the worker's", (
        Targets(1, extra=3), Capacity("grant", 4.0), Rank(2, 5), Capacity("revoke", 0.0),
        Rank(2, 5), Report())),
    Case("extras are trimmed to what fits under the delay bound, the rest overload", (
        Targets(1, extra=32), Rank(4, 32), Report()), ms_per_unit=1.0, max_queue_delay_ms=10.0),
    Case("a powerful replica queues a whole request to its deadline, past the ranking bound", (
        Targets(1, extra=20, coverage=0.5), Rank(20, 20), Report()), model="powerful",
        ms_per_unit=1.0, max_queue_delay_ms=10.0),
    Case("a powerful replica serves the base and keeps the extras that fit the queue bound", (
        Targets(1, extra=200, coverage=0.5), Rank(4, 200), Report()), model="powerful",
        ms_per_unit=1.0, max_queue_delay_ms=10.0),
    Case("powerful replica: whole requests, refused while baseline only", (
        Rank(4, 4), Targets(1, extra=8, coverage=0.5), Rank(4, 4), Rank(6, 2),
        Notice("p1"), Rank(4, 4), Report()), model="powerful"),
    Case("a powerful replica holds a whole request's extras to RMA's target and SBM's cap", (
        Targets(1, extra=6, coverage=0.5), Rank(4, 10), Targets(2, extra=6, powerful_extra=2),
        Rank(4, 10), Report()), model="powerful"),
)
