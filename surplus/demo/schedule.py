"""The capacity scheduler's script: when it grants, renews, revokes and reclaims, from a scenario.

A scenario's opportunistic pools have a capacity shape and outages (random reclaims and
storms, ``sim.traces``); from them comes the number of replicas the scheduler lends each pool
at every step. This module turns that into an ordered list of ``Action``s at offsets from the
start of a run. Nothing here reads a clock or talks to Kafka: ``Action.event(now_ms)`` stamps
the message when the live scheduler sends it, so a notice's deadline is measured from when it
really left.

Rules (what a real capacity scheduler promises):

- more replicas lent -> a grant at the new size, renewed every ``grant_every_s`` and valid for
  ``grant_ttl_s``, so a silent scheduler means less optional work, never more;
- fewer replicas -> a PreemptionNotice first (the newest replicas by name, or the whole pool,
  with the outage's notice), then a grant at the smaller size at once, or, when nothing is
  left, a revoke at the notice's deadline (the moment the replicas are really gone);
- end of the run -> every pool still lent is revoked (``closing_actions``).

A live run also follows the replicas themselves (``replica_changes``): an opportunistic
replica's process exists only while it is lent, as on a real fleet where the owner takes the
machine back at the notice's deadline and a new replica starts when capacity is lent again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from schemas.contract import CapacityEvent, PreemptionNotice
from sim.scenario import PoolConfig, Scenario
from sim.traces import capacity_shape, lendable, outages
from surplus.demo.plan import Replica, replica_id

Kind = Literal["grant", "revoke", "notice"]


@dataclass(frozen=True)
class Action:
    """One message the scheduler sends ``at_ms`` after the start of the run."""

    at_ms: int
    kind: Kind
    region: str
    pool_id: str
    accelerator: str
    replicas: int
    """Replicas lent after a grant; replicas reclaimed by a notice; 0 for a revoke."""
    cpu_per_replica: float
    ttl_ms: int = 0
    notice_ms: int = 0
    named: tuple[str, ...] = ()
    """Replica ids a partial notice reclaims (empty: the whole pool)."""

    @property
    def topic(self) -> str:
        return "preemption" if self.kind == "notice" else "capacity"

    def event(self, now_ms: int, seq: int) -> CapacityEvent | PreemptionNotice:
        """The message, stamped at ``now_ms`` (``seq`` keeps ids unique within a run)."""
        units = float(self.replicas)
        if self.kind == "notice":
            return PreemptionNotice(
                notice_id=f"{self.pool_id}!{now_ms}-{seq}", ts_ms=now_ms, region=self.region,
                pool_id=self.pool_id, replicas=list(self.named),
                deadline_ms=now_ms + self.notice_ms, accelerator=self.accelerator,
                accelerator_units=units, cpu_units=units * self.cpu_per_replica)
        if self.kind == "revoke":
            return CapacityEvent(event_id=f"{self.pool_id}@{now_ms}-{seq}", ts_ms=now_ms,
                                 region=self.region, pool_id=self.pool_id, kind="revoke",
                                 accelerator=self.accelerator)
        return CapacityEvent(
            event_id=f"{self.pool_id}@{now_ms}-{seq}", ts_ms=now_ms, region=self.region,
            pool_id=self.pool_id, kind="grant", accelerator=self.accelerator,
            accelerator_units=units, cpu_units=units * self.cpu_per_replica,
            expires_at_ms=now_ms + self.ttl_ms)


def build(scenario: Scenario, base_dir: Path) -> list[Action]:
    """Every action of the run, in time order (ties: notices before grants and revokes)."""
    rng = np.random.default_rng(scenario.seed)
    steps = int(scenario.duration_ms // scenario.step_ms)
    actions: list[Action] = []
    for region in scenario.regions:
        for pool in region.pools:
            if pool.capacity is not None:
                actions.extend(_pool_actions(scenario, base_dir, region.name, pool, steps, rng))
    order = {"notice": 0, "grant": 1, "revoke": 2}
    return sorted(actions, key=lambda a: (a.at_ms, order[a.kind], a.pool_id))


def _pool_actions(scenario: Scenario, base_dir: Path, region: str, pool: PoolConfig,
                  steps: int, rng: np.random.Generator) -> list[Action]:
    cap = pool.capacity
    assert cap is not None
    step_ms = scenario.step_ms
    shape = capacity_shape(cap, steps, step_ms, base_dir, region=region,
                           accelerator=pool.accelerator)
    found = outages(cap, scenario.storms, scenario.duration_ms, region=region, model=pool.model,
                    rng=rng)
    notice_at = {o.start_ms // step_ms: o.notice_ms for o in found}
    lend = lendable(shape, found, step_ms)
    every_ms = round(pool.grant_every_s * 1000)

    def action(t: int, kind: Kind, replicas: int, **kw: object) -> Action:
        return Action(at_ms=t, kind=kind, region=region, pool_id=pool.pool_id(region),
                      accelerator=pool.accelerator, replicas=replicas,
                      cpu_per_replica=pool.cpu_per_replica,
                      ttl_ms=round(pool.grant_ttl_s * 1000), **kw)  # type: ignore[arg-type]

    out: list[Action] = []
    lent, renew_at = 0, 0
    for k in range(steps):
        t, want = k * step_ms, int(lend[k])
        if want < lent:
            notice_ms = notice_at.get(k, round(cap.notice_s * 1000))
            named = () if want == 0 else tuple(replica_id(region, pool, i)
                                               for i in range(want, lent))
            out.append(action(t, "notice", lent - want, notice_ms=notice_ms, named=named))
            if want == 0:
                out.append(action(t + notice_ms, "revoke", 0))
        if want != lent or (want and t >= renew_at):
            if want:
                out.append(action(t, "grant", want))
                renew_at = t + every_ms
            lent = want
    return out


def closing_actions(actions: list[Action], sent_until_ms: int) -> list[Action]:
    """Revokes for every pool still lent once the actions up to ``sent_until_ms`` are sent."""
    lent: dict[str, Action] = {}
    for a in actions:
        if a.at_ms > sent_until_ms:
            break
        if a.kind == "grant":
            lent[a.pool_id] = a
        elif a.kind == "revoke" or (a.kind == "notice" and not a.named):
            lent.pop(a.pool_id, None)
    return [Action(at_ms=sent_until_ms, kind="revoke", region=a.region, pool_id=a.pool_id,
                   accelerator=a.accelerator, replicas=0, cpu_per_replica=a.cpu_per_replica)
            for _, a in sorted(lent.items())]


def first_grant_s(actions: list[Action]) -> float | None:
    grants = [a.at_ms for a in actions if a.kind == "grant"]
    return min(grants) / 1000.0 if grants else None


@dataclass(frozen=True)
class ReplicaChange:
    """An opportunistic replica starts (``up``) or is taken back, ``at_ms`` into the run."""

    at_ms: int
    worker_id: str
    up: bool


def replica_changes(actions: list[Action], replicas: list[Replica]) -> list[ReplicaChange]:
    """When each opportunistic replica of a pool with a capacity shape exists.

    A grant for ``n`` replicas starts replicas 0..n-1 that are not running; a notice takes back
    the replicas it names (all running ones when it names none) at its deadline, and a revoke
    any left at once. A replica lent again before its deadline restarts at the deadline.
    """
    by_pool: dict[str, list[str]] = {}
    for r in replicas:
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
