"""A scenario file read as the description of a live fleet: its replicas, its timeline, its phases.

The simulator's scenario format (``sim.scenario``) already says everything a live run needs:
the control laws, the region's traffic and segments, the pools and their capacity shapes, and
the storms. A live run starts one worker process per replica the scenario can ever lend, and
stretches the scenario's timeline (capacity steps, storms) to the run's duration, so a 90 s
run and a 180 s run show the same story at different speeds.

An opportunistic replica's process exists only while it is lent (``replica_changes``), as on a
real fleet where the owner takes the machine back at the notice's deadline and a new replica
starts when capacity is lent again; when that happens comes from the capacity schedule
(``sim.schedule``), the one the simulator follows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from sim.scenario import (
    CapacityConfig,
    PoolConfig,
    RegionConfig,
    Scenario,
    ScenarioError,
    StormConfig,
    find_scenario,
    load_scenario,
)
from sim.schedule import Action, replica_id

DEFAULT_SCENARIO = "demo"


@dataclass(frozen=True)
class Replica:
    """One worker process of a live run."""

    worker_id: str
    region: str
    service: str
    model: str
    tier: str
    accelerator: str
    pool_id: str


@dataclass(frozen=True)
class Phase:
    """A named stretch of the run (seconds from the start of the load)."""

    name: str
    start_s: float
    end_s: float


def scenario_path(name_or_path: str) -> Path:
    """The file of a scenario given by shipped name or path (absolute, for child processes)."""
    return find_scenario(name_or_path).resolve()


def load(name_or_path: str, duration_s: float | None = None) -> tuple[Scenario, Path]:
    """A scenario by shipped name or path, its timeline stretched to ``duration_s`` if given."""
    scenario, base = load_scenario(find_scenario(name_or_path))
    if duration_s is not None:
        scenario = stretch(scenario, duration_s)
    return scenario, base


def stretch(scenario: Scenario, duration_s: float) -> Scenario:
    """The same story told in ``duration_s``: storm times and capacity steps scale with it.

    Notice lengths, grant periods and the control period do not scale: they are properties of
    the systems involved, not of the story.
    """
    if duration_s <= 0:
        raise ScenarioError(f"duration must be > 0, got {duration_s}")
    factor = duration_s / scenario.duration_s
    storms = [msgspec.structs.replace(
        s, at_s=s.at_s * factor,
        return_after_s=None if s.return_after_s is None else s.return_after_s * factor)
        for s in scenario.storms]
    regions = [msgspec.structs.replace(r, pools=[_stretch_pool(p, factor) for p in r.pools])
               for r in scenario.regions]
    return msgspec.structs.replace(scenario, duration_s=duration_s, storms=storms,
                                   regions=regions)


def _stretch_pool(pool: PoolConfig, factor: float) -> PoolConfig:
    cap = pool.capacity
    if cap is None or cap.kind != "steps":
        return pool
    steps = [(at * factor, n) for at, n in cap.steps]
    return msgspec.structs.replace(pool, capacity=msgspec.structs.replace(cap, steps=steps))


def max_replicas(cap: CapacityConfig) -> int:
    """The most replicas a capacity shape ever lends (the processes a live run needs)."""
    if cap.kind == "constant":
        return cap.replicas
    if cap.kind == "steps":
        return max([cap.replicas, *(n for _, n in cap.steps)])
    if cap.kind == "diurnal":
        return cap.max_replicas
    raise ScenarioError("a live run needs a capacity shape of kind constant, steps or diurnal "
                        f"(got {cap.kind!r}): it starts one process per replica")


def replicas(region: RegionConfig) -> list[Replica]:
    """Every worker process of a region: baseline-tier replicas, then the opportunistic ones."""
    out: list[Replica] = []
    for pool in region.pools:
        count = pool.replicas if pool.capacity is None else max_replicas(pool.capacity)
        out.extend(Replica(worker_id=replica_id(region.name, pool, i), region=region.name,
                           service=pool.service, model=pool.model, tier=pool.tier,
                           accelerator=pool.accelerator, pool_id=pool.pool_id(region.name))
                   for i in range(count))
    return out


@dataclass(frozen=True)
class ReplicaChange:
    """An opportunistic replica starts (``up``) or is taken back, ``at_ms`` into the run."""

    at_ms: int
    worker_id: str
    up: bool


def replica_changes(actions: list[Action], replicas_: list[Replica]) -> list[ReplicaChange]:
    """When each opportunistic replica of a pool with a capacity shape exists.

    A grant for ``n`` replicas starts replicas 0..n-1 that are not running; a notice takes back
    the replicas it names (all running ones when it names none) at its deadline, and a revoke
    any left at once. A replica lent again before its deadline restarts at the deadline.
    """
    by_pool: dict[str, list[str]] = {}
    for r in replicas_:
        if r.tier == "opportunistic":
            by_pool.setdefault(r.pool_id, []).append(r.worker_id)
    running: dict[str, bool] = {}
    gone_at: dict[str, int] = {}
    out: list[ReplicaChange] = []

    def down(worker_id: str, at_ms: int) -> None:
        if running.get(worker_id):
            running[worker_id] = False
            gone_at[worker_id] = at_ms
            out.append(ReplicaChange(at_ms, worker_id, up=False))

    for a in actions:
        ids = by_pool.get(a.pool_id)
        if ids is None:
            continue
        if a.kind == "notice":
            for worker_id in (a.named or ids):
                down(worker_id, a.at_ms + a.notice_ms)
        elif a.kind == "revoke":
            for worker_id in ids:
                down(worker_id, a.at_ms)
        else:
            for worker_id in ids[:a.replicas]:
                if not running.get(worker_id):
                    running[worker_id] = True
                    out.append(ReplicaChange(max(a.at_ms, gone_at.get(worker_id, 0)),
                                             worker_id, up=True))
    return sorted(out, key=lambda c: c.at_ms)


def managed_replicas(changes: list[ReplicaChange]) -> set[str]:
    """Replicas whose processes follow the schedule (the others run for the whole run)."""
    return {c.worker_id for c in changes}


def phases(scenario: Scenario, first_grant_s: float | None) -> list[Phase]:
    """Warm-up until capacity is first lent, harvest, then each storm and its recovery."""
    end = scenario.duration_s
    marks: list[tuple[float, str]] = [(0.0, "warm-up")]
    if first_grant_s is not None:
        marks.append((first_grant_s, "harvest"))
    for storm in sorted(scenario.storms, key=lambda s: s.at_s):
        marks.append((storm.at_s, "storm"))
        if storm.return_after_s is not None:
            marks.append((storm.at_s + storm.return_after_s, "recovery"))
    marks = sorted((min(t, end), name) for t, name in marks)
    return [Phase(name, start, marks[i + 1][0] if i + 1 < len(marks) else end)
            for i, (start, name) in enumerate(marks) if start < end]


def phase_at(phases_: list[Phase], t_s: float) -> str:
    for phase in phases_:
        if phase.start_s <= t_s < phase.end_s:
            return phase.name
    return phases_[-1].name if phases_ and t_s >= phases_[-1].end_s else "starting"


def storm_windows(scenario: Scenario) -> list[tuple[float, float]]:
    """(start, end) seconds of each storm (end = duration when capacity never returns)."""
    return [(s.at_s, min(scenario.duration_s, s.at_s + s.return_after_s)
             if s.return_after_s is not None else scenario.duration_s)
            for s in sorted(scenario.storms, key=lambda s: s.at_s)]


def control_toml(scenario: Scenario) -> str:
    """The scenario's ``[control]`` table as a control-plane config file (``--config``)."""
    return to_toml(msgspec.to_builtins(scenario.control))


def to_toml(tree: dict[str, Any], table: str = "") -> str:
    """A small TOML writer for config trees (scalars, arrays, nested tables; None left out):
    enough for the structs Surplus loads with ``msgspec.toml``, without another dependency."""
    lines = [f"[{table}]"] if table else []
    nested = []
    for key, value in tree.items():
        if value is None:
            continue
        if isinstance(value, dict):
            nested.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    text = "\n".join(lines) + "\n" if lines else ""
    for key, value in nested:
        text += "\n" + to_toml(value, f"{table}.{key}" if table else key)
    return text


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def region_of(scenario: Scenario, name: str | None) -> RegionConfig:
    if name is None:
        return scenario.regions[0]
    for region in scenario.regions:
        if region.name == name:
            return region
    raise ScenarioError(f"no region {name!r} in scenario {scenario.name!r} "
                        f"(regions: {', '.join(r.name for r in scenario.regions)})")


__all__ = ["DEFAULT_SCENARIO", "Phase", "Replica", "ReplicaChange", "StormConfig",
           "control_toml", "load", "managed_replicas", "max_replicas", "phase_at", "phases",
           "region_of", "replica_changes", "replicas", "storm_windows", "stretch"]
