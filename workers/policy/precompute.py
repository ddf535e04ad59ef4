"""The precompute lever's rules on a replica, with no Kafka and no model in them.

- `OffsetLedger`: a job's offset is committed only once its answer is on the cache topic, and
  a partition's commit never passes a job not yet answered, so whatever a replica held when it
  was reclaimed is read again by the replica that takes its partitions over. Answers may land
  out of order (jobs are scored one at a time, delivered asynchronously); the commit is the
  first offset still open.
- `may_precompute`: precompute is optional work, so it runs only where RMA and SBM may: on a
  lent (opportunistic) replica, under fresh trusted targets, never while preempted, and not
  where the targets give the lever no share (`Pace.allow` applies the share they give).
- `chunk_rows`: a job is scored in slices that each take about ``chunk_ms`` at the measured
  cost of a row, so a request that arrives meanwhile waits for one slice, not a whole job.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Annotated

import msgspec
from msgspec import Meta

from schemas.contract import Tier
from workers.policy.targets import EffectiveTargets


class PrecomputeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The precompute lever on a lent replica (`workers.runtime.precompute`; the simulator's
    replica sets read it too): jobs scored in the inference thread's idle time, between
    requests."""

    enabled: bool = False
    #: A job is scored in slices of about this long, so a request waits one slice at most
    #: and a notice stops the lever within one: a slice in service runs on to its end. In
    #: the demo's half-core slices, 2 ms of measured work ran past the notice long enough to
    #: read a notice-to-stop p99 of 10 ms against the extras' 5 ms; 1 ms read 5 ms, the
    #: same, for 16% fewer jobs answered (`surplus demo`, 2026-12-06).
    chunk_ms: Annotated[float, Meta(gt=0.0, le=1000.0)] = 1.0
    #: Jobs read ahead of the one being scored; the partitions pause while it is full.
    read_ahead: Annotated[int, Meta(ge=1, le=1000)] = 2
    #: The share of the replica's CPU quota (one core without one) its process may use with
    #: precompute running, as measured (its CPU time, every thread): past the quota the
    #: process is throttled, and a request that arrives then waits for the next period
    #: (`Pace`).
    max_share: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.8


class OffsetLedger:
    """Per partition, the offsets taken and not yet answered, and the commit they allow.

    Not thread-safe: the runner calls it under its own lock."""

    def __init__(self) -> None:
        self._open: dict[int, set[int]] = {}
        #: Per partition, one past the highest offset taken: the commit once nothing is open.
        self._next: dict[int, int] = {}
        self._committed: dict[int, int] = {}

    def take(self, partition: int, offset: int) -> None:
        """A job read; it stays open until `done`."""
        self._open.setdefault(partition, set()).add(offset)
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def done(self, partition: int, offset: int) -> None:
        """A job answered (or dropped for good: expired, not ours, undecodable). An offset
        of a partition no longer held (`drop`) is ignored: its new owner reads it again."""
        held = self._open.get(partition)
        if held is not None:
            held.discard(offset)

    def commits(self) -> dict[int, int]:
        """Partition -> the offset to commit (the next to read), where it moved since the
        last call: the first still open, or one past the last taken when none is."""
        out = {}
        for partition, upto in self._next.items():
            held = self._open.get(partition)
            commit = min(held) if held else upto
            if commit > self._committed.get(partition, -1):
                self._committed[partition] = commit
                out[partition] = commit
        return out

    def open_jobs(self) -> int:
        return sum(len(held) for held in self._open.values())

    def drop(self, partitions: Iterable[int]) -> None:
        """Partitions given up (a rebalance, or leaving the group): forget them, so a late
        answer neither commits nor holds back a commit there."""
        for partition in partitions:
            self._open.pop(partition, None)
            self._next.pop(partition, None)
            self._committed.pop(partition, None)


def may_precompute(tier: Tier, effective: EffectiveTargets) -> bool:
    """Lent capacity under trusted, fresh targets; never baseline replicas, never preempted
    (a notice makes the targets baseline only), never without targets (fail safe), never
    where the control plane set the lever's share to 0."""
    return (tier == "opportunistic" and not effective.baseline_only
            and effective.precompute_share != 0.0)


def chunk_rows(ms_per_row: float | None, chunk_ms: float, batch_rows: int) -> int:
    """Rows to score in one slice of a job: about ``chunk_ms`` of work at the measured cost
    of a row, at most a batch, at least one. Before any cost is measured: one batch."""
    if ms_per_row is None or ms_per_row <= 0.0:
        return batch_rows
    return max(1, min(batch_rows, math.floor(chunk_ms / ms_per_row)))


def top_k(ids: list[int], scores: list[float], k: int) -> tuple[list[int], list[float]]:
    """The best ``k`` candidates, highest score first, ties by id: the same job scored twice
    gives the same answer, which is what makes a redelivered job idempotent."""
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))[:k]
    return [ids[i] for i in order], [scores[i] for i in order]


class Pace:
    """How long idle work rests after a slice, so that the replica's process uses about
    ``max_share`` of its CPU quota, requests and precompute together.

    A lent replica runs in a CPU quota (its grant): a process that spends its quota early in
    a period is throttled for the rest of it, and a request arriving then waits for the next
    period, however idle the model looked. So precompute is paced, not just run whenever the
    queue is empty: after a slice of ``s`` seconds it rests ``s * (1 / share - 1)``, where
    ``share`` is the part of one core (the inference thread) precompute may use. ``share`` is
    a feedback loop on what the process measurably used (`update`, its CPU seconds per
    second, every thread's): up when under the target, down when over, by ``gain`` times the
    difference. Requests, decoding, Kafka and the Python between slices all count, whatever
    their cost, where a rule reckoned from the model's busy time alone left a third of the
    allowance unused in the demo (0.55-0.7 of the quota against 0.8 allowed).
    """

    def __init__(self, cores: float, max_share: float, floor: float = 0.02,
                 gain: float = 0.5) -> None:
        self.cores = cores
        self.max_share = max_share
        self.target = cores * max_share
        self.floor = floor
        self.gain = gain
        #: The part of one core precompute may use now; starts at half the target.
        self.share = min(1.0, max(floor, self.target / 2.0))
        self.ready_at_s = 0.0

    def allow(self, share: float | None) -> None:
        """The control plane's share for the lever (``EffectiveTargets.precompute_share``;
        None: not set), within this replica's own ``max_share``."""
        allowed = self.max_share if share is None else min(self.max_share, max(0.0, share))
        self.target = self.cores * allowed

    def update(self, used_cores: float) -> None:
        """The process used ``used_cores`` CPU seconds per second lately: move toward the
        target."""
        self.share = min(1.0, max(self.floor, self.share + self.gain
                                  * (self.target - used_cores)))

    def after(self, elapsed_s: float, now_s: float) -> None:
        self.ready_at_s = now_s + elapsed_s * (1.0 / self.share - 1.0)

    def ready_in(self, now_s: float) -> float:
        return max(0.0, self.ready_at_s - now_s)
