"""The capacity schedule: when opportunistic capacity is granted, renewed, reclaimed and revoked.

A scenario's opportunistic pools have a capacity shape and outages (random reclaims and storms,
``sim.traces``); from them comes the number of replicas lent to each pool at every step. This
module turns that into an ordered list of ``Action``s at offsets from the start of a run, and
is the one place that says what a capacity scheduler sends: the simulator publishes these
actions at their simulated time (``sim.engine``), the live scheduler sends them to Kafka at
their wall-clock time (``surplus.live.scheduler``, ``surplus scheduler``). Nothing here reads
a clock or talks to Kafka: an ``Outbox`` stamps each message when it is sent, so a notice's
deadline is measured from when it really left.

Rules (what a real capacity scheduler promises):

- more replicas lent -> a grant at the new size, renewed every ``grant_every_s`` and valid for
  ``grant_ttl_s``, so a silent scheduler means less optional work, never more;
- fewer replicas -> a PreemptionNotice first (the newest replicas by id, or the whole pool,
  with the outage's notice; re-announced every ``notice_repeat_s`` until its deadline when the
  pool says so), then a grant at the smaller size at once, or, when nothing is
  left, a revoke at the notice's deadline (the moment the replicas are really gone);
- end of the run -> every pool still lent is revoked (``Outbox.closing``).

Replica ids (``replica_id``) and message ids are formatted here and nowhere else: a partial
notice names replicas by these ids, so the worker it means recognises itself.

Outages are drawn from the scenario seed's capacity stream (``capacity_rng``), the same one
wherever the schedule is built, so the simulator and a live run of a scenario lose the same
capacity at the same moments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from schemas.contract import CapacityEvent, PreemptionNotice
from sim.scenario import PoolConfig, Scenario
from sim.traces import capacity_shape, lendable, outages

Kind = Literal["grant", "revoke", "notice"]

_ORDER = {"notice": 0, "grant": 1, "revoke": 2}
"""Ties at one moment: a notice goes before the grant at the smaller size."""

CAPACITY_STREAM = 1
"""Child of the scenario's ``SeedSequence`` that outages are drawn from (the simulator draws
its other random streams from the other children)."""


def capacity_rng(seed: int) -> np.random.Generator:
    """The random stream of a scenario's outages (random reclaims)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(CAPACITY_STREAM,)))


def replica_id(region: str, pool: PoolConfig, index: int) -> str:
    """Worker id of the ``index``-th replica of a pool (replicas are lent from index 0 up and
    reclaimed from the top down)."""
    return f"{region}-{pool.model}-{pool.accelerator}-{pool.tier}-{index}"


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
    repeat: bool = False
    """A re-announcement of a notice already sent: those replicas are already leaving."""

    @property
    def topic(self) -> str:
        return "preemption" if self.kind == "notice" else "capacity"

    @property
    def lent_after(self) -> int | None:
        """Replicas of the pool still lent once this is sent (None: a partial notice, whose
        grant at the smaller size follows)."""
        if self.kind == "grant":
            return self.replicas
        if self.kind == "revoke" or not self.named:
            return 0
        return None

    def revoke(self, at_ms: int) -> Action:
        """The revoke of this action's pool at ``at_ms``."""
        return dataclasses.replace(self, at_ms=at_ms, kind="revoke", replicas=0, ttl_ms=0,
                                   notice_ms=0, named=())

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
    rng = capacity_rng(scenario.seed)
    steps = int(scenario.duration_ms // scenario.step_ms)
    actions: list[Action] = []
    for region in scenario.regions:
        for pool in region.pools:
            if pool.capacity is not None:
                actions.extend(_pool_actions(scenario, base_dir, region.name, pool, steps, rng))
    return sorted(actions, key=lambda a: (a.at_ms, _ORDER[a.kind], a.pool_id))


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
    lend = lendable(shape, found, step_ms).tolist()
    every_ms = round(pool.grant_every_s * 1000)
    grant = Action(at_ms=0, kind="grant", region=region, pool_id=pool.pool_id(region),
                   accelerator=pool.accelerator, replicas=0,
                   cpu_per_replica=pool.cpu_per_replica, ttl_ms=round(pool.grant_ttl_s * 1000))

    out: list[Action] = []
    lent, renew_at = 0, 0
    for k in range(steps):
        t, want = k * step_ms, int(lend[k])
        if want < lent:
            notice_ms = notice_at.get(k, round(cap.notice_s * 1000))
            named = () if want == 0 else tuple(replica_id(region, pool, i)
                                               for i in range(want, lent))
            notice = dataclasses.replace(grant, at_ms=t, kind="notice", replicas=lent - want,
                                         ttl_ms=0, notice_ms=notice_ms, named=named)
            out.extend(_announcements(notice, round(pool.notice_repeat_s * 1000)))
            if want == 0:
                out.append(grant.revoke(t + notice_ms))
        if want != lent or (want and t >= renew_at):
            if want:
                out.append(dataclasses.replace(grant, at_ms=t, replicas=want))
                renew_at = t + every_ms
            lent = want
    return out


def _announcements(notice: Action, repeat_ms: int) -> list[Action]:
    """A notice, and its re-announcements every ``repeat_ms`` until its deadline (each with
    the notice left, so every one names the same deadline)."""
    if repeat_ms <= 0:
        return [notice]
    return [dataclasses.replace(notice, at_ms=notice.at_ms + dt, notice_ms=notice.notice_ms - dt,
                                repeat=dt > 0)
            for dt in range(0, notice.notice_ms, repeat_ms)]


def first_grant_s(actions: list[Action]) -> float | None:
    grants = [a.at_ms for a in actions if a.kind == "grant"]
    return min(grants) / 1000.0 if grants else None


class Outbox:
    """One run's sending of a schedule: each message stamped as it leaves and numbered from 1
    (ids unique within the run), and what is still lent, to revoke when the run ends."""

    def __init__(self) -> None:
        self.sent = 0
        self._lent: dict[str, Action] = {}

    def stamp(self, action: Action, now_ms: int) -> CapacityEvent | PreemptionNotice:
        """The message of ``action`` sent at ``now_ms``."""
        self.sent += 1
        lent = action.lent_after
        if lent:
            self._lent[action.pool_id] = action
        elif lent == 0:
            self._lent.pop(action.pool_id, None)
        return action.event(now_ms, self.sent)

    def closing(self, at_ms: int) -> list[Action]:
        """Revokes, at ``at_ms``, for every pool still lent (by pool id)."""
        return [a.revoke(at_ms) for _, a in sorted(self._lent.items())]
