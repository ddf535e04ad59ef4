"""The nemesis's schedule: which fault, on what, when and for how long, drawn from a seed.

Pure: no clock, no process, no Kafka. The same seed, duration and config give the same
schedule, so a run that found a violation replays (`surplus chaos --seed N`).

Faults arrive as a Poisson process (exponential gaps of mean ``mean_gap_s``) between the
warm-up and the cool-down, each of a kind drawn by weight, on a target drawn among those
the kind applies to, held for a time drawn uniformly from its range. Faults overlap, as they
do on a real cluster, within what the fleet is built to survive:

- at most one broker is down or paused at a time (replication factor 3, min.insync.replicas 2:
  two down stop every acks=all write, a loss of availability the design does not claim to
  survive);
- at most one baseline replica is impaired (killed, frozen, cut, slowed, restarting) at a
  time: the client retries a baseline request on another baseline replica, so baseline is
  never lost, but two baseline replicas down is a baseline outage, not a chaos finding;
- one fault at a time on any one process (a frozen worker is not also killed).

A drawn fault that would break one of these is dropped, not moved, so the draw of every later
fault is the same with or without it.
"""

from __future__ import annotations

import random
from typing import Literal, get_args

import msgspec

FaultKind = Literal["broker_kill", "broker_pause", "control_kill", "worker_kill",
                    "worker_freeze", "net_delay", "net_cut", "clock_jump", "notice_storm",
                    "duplicate", "reorder", "forge"]
KINDS: tuple[FaultKind, ...] = get_args(FaultKind)

#: Kinds aimed at one worker: its target is a worker name.
WORKER_KINDS = frozenset({"worker_kill", "worker_freeze", "net_delay", "net_cut",
                          "clock_jump"})
#: Kinds aimed at one broker of the three-node cluster: the target is its node id.
BROKER_KINDS = frozenset({"broker_kill", "broker_pause"})
#: Kinds that act on Kafka's topics (messages published by the nemesis), not on a process.
MESSAGE_KINDS = frozenset({"notice_storm", "duplicate", "reorder", "forge"})
#: What a forged message pretends to be, and how it is forged.
FORGED_TOPICS = ("preemption", "capacity", "targets", "overrides")
FORGERIES = ("unsigned", "unknown_key", "bad_signature")


class Hold(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How long a fault of one kind lasts (seconds, drawn uniformly)."""

    min_s: float = 2.0
    max_s: float = 8.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_s <= self.max_s:
            raise ValueError(f"hold: expected 0 <= min_s <= max_s, got {self.min_s}, "
                             f"{self.max_s}")


def _default_weights() -> dict[str, float]:
    return {"broker_kill": 1.0, "broker_pause": 1.0, "control_kill": 1.0, "worker_kill": 1.0,
            "worker_freeze": 1.0, "net_delay": 1.0, "net_cut": 1.0, "clock_jump": 1.0,
            "notice_storm": 1.0, "duplicate": 1.0, "reorder": 1.0, "forge": 1.0}


def _default_holds() -> dict[str, Hold]:
    return {"broker_kill": Hold(5.0, 15.0), "broker_pause": Hold(2.0, 8.0),
            "control_kill": Hold(1.0, 5.0), "worker_kill": Hold(2.0, 8.0),
            "worker_freeze": Hold(0.5, 3.0), "net_delay": Hold(3.0, 10.0),
            "net_cut": Hold(2.0, 8.0), "clock_jump": Hold(5.0, 15.0),
            "notice_storm": Hold(1.0, 3.0), "duplicate": Hold(0.0, 0.0),
            "reorder": Hold(0.0, 0.0), "forge": Hold(0.0, 0.0)}


class ScheduleConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the nemesis may do (the `[schedule]` table of `surplus chaos --config`)."""

    #: Mean seconds between two faults' starts.
    mean_gap_s: float = 8.0
    #: No fault starts in the first ``warmup_s`` (optional work flowing first) ...
    warmup_s: float = 10.0
    #: ... nor in the last ``cooldown_s``, so every fault has ended and healed before the end.
    cooldown_s: float = 20.0
    #: Relative weight of each kind (0 leaves it out; a kind not named keeps weight 1).
    weights: dict[str, float] = msgspec.field(default_factory=_default_weights)
    #: How long each kind lasts.
    holds: dict[str, Hold] = msgspec.field(default_factory=_default_holds)
    #: Largest clock jump (ms, either way) of a restarted process: inside the receivers'
    #: ``max_clock_skew_ms`` (5000 by default), what the design says it tolerates.
    max_jump_ms: int = 3000
    #: Notices in one storm (each for a pool or one replica, some with no notice at all).
    storm_notices: int = 6

    def __post_init__(self) -> None:
        for name, value in (("mean_gap_s", self.mean_gap_s), ("warmup_s", self.warmup_s),
                            ("cooldown_s", self.cooldown_s)):
            if value < 0 or (name == "mean_gap_s" and value == 0):
                raise ValueError(f"{name}: expected a positive number, got {value}")
        for table in (self.weights, self.holds):
            for kind in table:
                if kind not in KINDS:
                    raise ValueError(f"{kind}: not a fault kind (one of {', '.join(KINDS)})")
        for kind, weight in self.weights.items():
            if weight < 0:
                raise ValueError(f"weights.{kind}: expected >= 0, got {weight}")
        if not any(self.weight(k) > 0 for k in KINDS):
            raise ValueError("weights: every kind has weight 0")
        if self.max_jump_ms < 0:
            raise ValueError(f"max_jump_ms: expected >= 0, got {self.max_jump_ms}")
        if self.storm_notices < 1:
            raise ValueError(f"storm_notices: expected >= 1, got {self.storm_notices}")

    def weight(self, kind: FaultKind) -> float:
        return self.weights.get(kind, 1.0)

    def hold(self, kind: FaultKind) -> Hold:
        return self.holds.get(kind, _default_holds()[kind])


class Fault(msgspec.Struct, frozen=True):
    """One fault of the schedule: what, on what, from ``at_s`` (seconds after the load
    started) for ``hold_s``; ``param`` is the kind's detail (a clock jump's milliseconds, a
    delay's milliseconds, a forgery's topic and way, a storm's size)."""

    at_s: float
    kind: FaultKind
    target: str
    hold_s: float
    param: str = ""

    @property
    def end_s(self) -> float:
        return self.at_s + self.hold_s

    @property
    def on_baseline_path(self) -> bool:
        """Whether it touches what a baseline request goes through (a baseline replica, or
        the network to one): SLA windows with such a fault in them are not judged. A broker
        fault counts too: the run keeps its whole fleet on one host, where a broker's JVM
        resuming or restarting takes the cores the baseline replicas run on (CI rehearsals
        saw baseline p99 of 105-141 ms in windows whose only faults were broker pauses and
        kills). On a fleet whose brokers have hosts of their own it would not."""
        if self.kind in BROKER_KINDS:
            return True
        return self.kind in WORKER_KINDS and self.target.startswith("b")

    def resources(self) -> frozenset[str]:
        """What it occupies while it lasts (see the module docstring)."""
        if self.kind in BROKER_KINDS:
            return frozenset({"broker"})
        if self.kind == "control_kill":
            return frozenset({"control"})
        if self.kind in WORKER_KINDS:
            out = {f"worker:{self.target}"}
            if self.target.startswith("b"):
                out.add("baseline")
            return frozenset(out)
        return frozenset({f"message:{self.kind}"})


class Fleet(msgspec.Struct, frozen=True):
    """What there is to break: worker names (``b*`` baseline, ``p*`` powerful) and brokers."""

    workers: tuple[str, ...] = ("b1", "b2", "p1")
    brokers: int = 3


def _target(kind: FaultKind, fleet: Fleet, rng: random.Random) -> str:
    if kind in BROKER_KINDS:
        return str(rng.randint(1, fleet.brokers))
    if kind == "control_kill":
        return "cp"
    if kind in WORKER_KINDS:
        return rng.choice(fleet.workers)
    return "kafka"


def _param(kind: FaultKind, config: ScheduleConfig, rng: random.Random) -> str:
    if kind == "clock_jump":
        jump = rng.randint(config.max_jump_ms // 4, config.max_jump_ms)
        return str(jump if rng.random() < 0.5 else -jump)
    if kind == "net_delay":
        return str(rng.choice((50, 100, 200, 400)))
    if kind == "notice_storm":
        return str(config.storm_notices)
    if kind == "forge":
        return f"{rng.choice(FORGED_TOPICS)}:{rng.choice(FORGERIES)}"
    return ""


def draw(seed: int, duration_s: float, config: ScheduleConfig | None = None,
         fleet: Fleet | None = None) -> tuple[Fault, ...]:
    """The schedule of a run of ``duration_s`` seconds, by start time.

    Args:
        seed: the random seed; the same seed gives the same schedule.
        duration_s: the run's length; no fault starts in its warm-up or cool-down, and every
            fault ends before the cool-down starts.
        config: rates, weights and holds (defaults: every kind, one every 8 s on average).
        fleet: the workers and brokers there are to break.
    """
    config = config or ScheduleConfig()
    fleet = fleet or Fleet()
    kinds_ok = [k for k in KINDS if k not in BROKER_KINDS] if fleet.brokers < 1 else list(KINDS)
    kinds = [k for k in kinds_ok if config.weight(k) > 0]
    weights = [config.weight(k) for k in kinds]
    rng = random.Random(seed)
    end = duration_s - config.cooldown_s
    faults: list[Fault] = []
    t = config.warmup_s
    while kinds:
        t += rng.expovariate(1.0 / config.mean_gap_s)
        kind = rng.choices(kinds, weights)[0]
        hold = config.hold(kind)
        fault = Fault(at_s=round(t, 3), kind=kind, target=_target(kind, fleet, rng),
                      hold_s=round(rng.uniform(hold.min_s, hold.max_s), 3),
                      param=_param(kind, config, rng))
        if t >= end:
            break
        if fault.end_s > end:
            continue
        busy = {r for f in faults if f.end_s > fault.at_s for r in f.resources()}
        if busy & fault.resources():
            continue
        faults.append(fault)
    return tuple(faults)


def by_kind(faults: tuple[Fault, ...] | list[Fault]) -> dict[str, int]:
    """How many faults of each kind (every kind named, 0 included)."""
    out: dict[str, int] = dict.fromkeys(KINDS, 0)
    for fault in faults:
        out[fault.kind] += 1
    return out
