"""What one replica decides about optional work: the rules the live worker and the simulated
worker share, written once so that a simulated result cannot drift from production.

A replica holds the targets of its scope (:class:`TargetState`), a share of the fleet's
optional-work budget, and the ids of the preemption notices it already acted on. From those it
decides, per request, how many extra candidates it may queue and why the rest are shed; per
targets message, whether optional work resumes; and per notice, whether the notice is for it
and still to act on. A reclaim that reached it ends its optional work at the notice's deadline
for good (this incarnation): targets are scope-wide and cannot say this replica's capacity is
lent again, and a replica lent again is a new life (the capacity agent never grants after its
own notice; `surplus demo` restarts a replica lent again at its deadline). Before the
deadline, newer targets issued after the notice may still resume it. What it decides is
applied by the caller to its admission queues (the live worker's batcher, or the simulator's
admission directly): this class holds no queue, reads no clock and takes every time as an
argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from schemas.contract import ControlTargets, PreemptionNotice, ShedReason
from workers.policy.targets import (
    EffectiveTargets,
    LocalLimits,
    TargetState,
    TargetVerdict,
    baseline_only,
)

NoticeOutcome = Literal["applied", "not_mine", "stale", "duplicate"]
#: Notice ids a replica gives the notice it publishes for itself on SIGTERM.
SHUTDOWN_PREFIX = "shutdown-"


def serves_whole_requests(model: str, tier: str) -> bool:
    """An opportunistic replica of the powerful model only ever does optional work (SBM): each
    request it takes is one unit of optional work, done whole or not at all, and no baseline
    waits behind its queue. The live worker and the simulated one ask this, not their own
    test, so that both bound that queue alike (`Admission(whole_requests=...)`)."""
    return tier == "opportunistic" and model == "powerful"


def notice_reaches(notice: PreemptionNotice, pool_id: str, replica_id: str) -> bool:
    """The notice names this replica of ``pool_id``, or the whole pool (no replicas named):
    what a replica acts on, and whom a sender posts the notice to."""
    return notice.pool_id == pool_id and (not notice.replicas or replica_id in notice.replicas)


def fail_safe_reason(targets: EffectiveTargets) -> ShedReason:
    """Why optional work is refused while targets say baseline only (invariant 2)."""
    return "preemption" if targets.reason == "preempted" else "stale_targets"


#: A worker's budget banks at least this many requests' worth of the target. Its share of the
#: budget is its share of the throughput, and a load balancer spreads a few requests a second
#: unevenly: a bucket of one second's share starved whenever they clumped, though the share paid
#: for all of them on average (`diurnal_day` refused 39,559 extras for `budget` in 1,800 s
#: against 1,680 once the budget was held to the target's spend). Where a second's share holds
#: more, as at `azure_steady`'s rates, it is that second that bounds a swing. Ten let a clump
#: through into one window of `diurnal_day`'s whole day; five, none (docs/benchmarks.md).
BANKED_REQUESTS = 5


@dataclass(frozen=True, slots=True)
class ExtraAllowance:
    """How many of a request's extra candidates may be queued, and what to do about the rest."""

    allowed: int
    #: Why the ``requested - allowed`` others are shed (None when none are).
    refused: ShedReason | None
    #: A budget (units/s) admission must hold from now on, when it or the target changed;
    #: else None.
    new_budget: float | None = None
    #: The least that budget may bank: ``BANKED_REQUESTS`` requests' worth of the target.
    banked_units: float = 0.0


class ReplicaPolicy:
    """The decisions of one replica (see the module docstring). Not thread-safe: the live worker
    calls it under one lock."""

    def __init__(self, *, pool_id: str, worker_id: str, region: str, limits: LocalLimits,
                 started_ms: int,
                 verifier: Callable[[ControlTargets], str | None] | None = None,
                 budget_share: float = 1.0, notice_memory: int = 1024) -> None:
        """``started_ms``: when this replica started (wall clock); a notice issued before it
        was about an earlier incarnation."""
        self.pool_id = pool_id
        self.worker_id = worker_id
        self.started_ms = started_ms
        self.targets = TargetState(region, limits, verifier)
        #: This replica's share of the fleet budget in the targets (the simulator's load
        #: balancer moves it as replica sets come and go).
        self.budget_share = budget_share
        self._budget: tuple[float, float] | None = None
        self._notice_memory = notice_memory
        self._notices_seen: dict[str, None] = {}  # insertion-ordered, bounded
        #: The earliest deadline of a reclaim this replica applied (None: none yet): from it
        #: on, this incarnation does no optional work, whatever targets say.
        self._reclaimed_at_ms: int | None = None

    # -- requests ----------------------------------------------------------------------------

    def current(self, now_ms: int) -> EffectiveTargets:
        """What may be done at ``now_ms``: the targets held (`TargetState.current`), or
        baseline only (``preempted``) from the deadline of a reclaim that reached it on."""
        if self._reclaimed_at_ms is not None and now_ms >= self._reclaimed_at_ms:
            return baseline_only("preempted", self.targets.epoch)
        return self.targets.current(now_ms)

    def reclaimed(self, now_ms: int) -> bool:
        """A reclaim that reached this replica is past its deadline: no optional work again."""
        return self._reclaimed_at_ms is not None and now_ms >= self._reclaimed_at_ms

    def allow_extra(self, effective: EffectiveTargets, requested: int) -> ExtraAllowance:
        """RMA: as many extra candidates as the targets allow, none while they say baseline
        only. The budget is applied here so that it changes before the first unit it governs."""
        if requested <= 0:
            return ExtraAllowance(0, None)
        if effective.baseline_only:
            return ExtraAllowance(0, fail_safe_reason(effective))
        budget = effective.budget_units_per_s * self.budget_share
        banked = float(BANKED_REQUESTS * effective.extra_candidates)
        new_budget = None
        if (budget, banked) != self._budget:
            self._budget = (budget, banked)
            new_budget = budget
        allowed = min(requested, effective.extra_candidates)
        return ExtraAllowance(allowed, "over_target" if allowed < requested else None,
                              new_budget, banked)

    @staticmethod
    def allow_whole_extra(effective: EffectiveTargets, requested: int) -> ExtraAllowance:
        """SBM: the extra candidates a whole request may carry, RMA's target or the SBM
        target's lower cap on powerful requests (its pools over their SLA). Called once
        ``whole_refusal`` let the request in; what fits the queue is admission's to say."""
        allowed = min(max(requested, 0), effective.powerful_extra_candidates)
        return ExtraAllowance(allowed, "over_target" if allowed < requested else None)

    @staticmethod
    def whole_refusal(effective: EffectiveTargets) -> ShedReason | None:
        """SBM: a whole request of the powerful model is refused at once while targets say
        baseline only (the client falls back to baseline replicas); None means try admission."""
        return fail_safe_reason(effective) if effective.baseline_only else None

    # -- control messages --------------------------------------------------------------------

    def offer(self, targets: ControlTargets, now_ms: int, *,
              admission_preempted: bool) -> tuple[TargetVerdict, bool]:
        """Apply targets; True as second value when optional work must resume (trusted new
        targets after a preemption, issued after it, while its reclaim deadline is ahead)."""
        verdict = self.targets.offer(targets, now_ms)
        resume = (verdict.accepted and not self.targets.preempted and admission_preempted
                  and not self.reclaimed(now_ms))
        return verdict, resume

    def concerns(self, notice: PreemptionNotice) -> bool:
        """The notice names this replica, or its whole pool."""
        return notice_reaches(notice, self.pool_id, self.worker_id)

    def shutdown_notice_id(self, now_ms: int) -> str:
        """The id of the notice this replica publishes for itself on SIGTERM."""
        return f"{SHUTDOWN_PREFIX}{self.worker_id}-{now_ms}"

    def _outlived(self, notice: PreemptionNotice, now_ms: int) -> bool:
        """Issued before this replica started, and about an earlier incarnation: its deadline
        has passed, or it is that incarnation's own shutdown notice (its process is gone; the
        grace period in its deadline was the old process's, not a reclaim of this one)."""
        if notice.ts_ms >= self.started_ms:
            return False
        return (notice.deadline_ms <= now_ms
                or notice.notice_id.startswith(f"{SHUTDOWN_PREFIX}{self.worker_id}-"))

    def on_notice(self, notice: PreemptionNotice, now_ms: int) -> NoticeOutcome:
        """Whether to stop optional work now. On ``applied`` the targets already say baseline
        only; the caller stops its admission queues (and drains until the deadline).

        A notice that arrives at or after its deadline still applies, at once: that is what a
        hardware failure, an unannounced reclaim or Kafka lag longer than the notice looks
        like, and the replica is still doing optional work it is about to lose. Only a notice
        issued before this replica started whose deadline has passed is ``stale``: a reclaim
        of an earlier incarnation, read back after a restart, that this one outlived. So is an
        earlier incarnation's own shutdown notice, whatever its deadline. (Any other notice
        issued before the start with its deadline still ahead is a reclaim still pending.)"""
        if not self.concerns(notice):
            return "not_mine"
        if self._outlived(notice, now_ms):
            return "stale"
        if notice.notice_id in self._notices_seen:
            return "duplicate"  # re-read after a consumer restart: targets may have moved on
        self._notices_seen[notice.notice_id] = None
        if len(self._notices_seen) > self._notice_memory:
            del self._notices_seen[next(iter(self._notices_seen))]
        if self._reclaimed_at_ms is None or notice.deadline_ms < self._reclaimed_at_ms:
            self._reclaimed_at_ms = notice.deadline_ms
        self.targets.preempt(now_ms)
        return "applied"
