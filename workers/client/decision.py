"""The per-request decision of the client, with no I/O: how many extra candidates (RMA), which
pool (SBM), and the counters that explain every unit of optional work not done.

Kept apart from the HTTP and Kafka code so it can be unit-tested with a fake clock and timed by
`bench/client_decision.py`: targets lookup, routing and shed check must stay within 10 µs.
"""

from __future__ import annotations

import msgspec

from schemas.contract import ControlTargets
from schemas.signing import Keyring, KeySource, verifier
from workers.client.config import ClientConfig
from workers.policy.client_shed import BudgetBucket, ClientShedder, ServerSignals, extra_candidates
from workers.policy.holdout import in_holdout
from workers.policy.replica_room import ReplicaRooms
from workers.policy.routing import Model, SbmRouter
from workers.policy.shed_order import extras_gain
from workers.policy.targets import EffectiveTargets, TargetState, TargetVerdict


class Decision(msgspec.Struct, frozen=True):
    """What one request does: its pool, whether that is exploration, and its extra candidates;
    the probability the router gave its pool (``propensity``, logged for off-policy
    estimates) and whether it is in the randomized holdout (no optional work)."""

    model: Model
    explored: bool
    extra: int
    targets_reason: str
    propensity: float = 1.0
    holdout: bool = False
    gain: float | None = None
    """What its optional work is expected to add, the order replicas shed it in: the
    segment's gain from the powerful model, or the marginal value of its last extra
    candidate. None without optional work."""


Counters = dict[str, dict[str, int]]


def logged_propensity(chosen: Model, chosen_p: float, served: Model) -> float:
    """The propensity a decision record logs for the arm that served the request: the
    router's probability of the chosen arm, or, when the powerful call failed and baseline
    served it, the probability of not choosing powerful (the logged arm is what served it)."""
    p = chosen_p if chosen == served else 1.0 - chosen_p
    return min(max(p, 1e-6), 1.0)


class Decider:
    """Targets + router + shedder + budget for one client; every decision is counted."""

    def __init__(self, config: ClientConfig,
                 signing_key: KeySource | Keyring | bytes | str | None = None) -> None:
        """``signing_key``: the keyring targets must verify against (a `KeySource` is read
        at each check, so a rotation reaches the client as the source reloads; a bare key is
        id ``default``); None accepts unsigned targets."""
        self.config = config
        check = (None if signing_key is None else signing_key.check
                 if isinstance(signing_key, KeySource) else verifier(signing_key))
        self.targets = TargetState(config.scope, config.limits, check)
        self.router = SbmRouter(config.router, config.seed)
        #: One allowance per pool: a pool's load signals cut the optional work sent to it only
        #: (RMA extras on the ranking pool, SBM coverage on the powerful one), so a full
        #: powerful pool does not stop extras the ranking replicas have room for.
        self.shedders: dict[Model, ClientShedder] = {
            "baseline": ClientShedder(config.shed),
            "powerful": ClientShedder(config.shed, judge_queue_delay=False)}
        self.budget = BudgetBucket(0.0, 0.0)
        #: Each ranking replica's recent room for extras: a request's extras are sized to the
        #: replica it goes to (``fit_to_replica``).
        self.rooms = ReplicaRooms()
        self.counters: Counters = {}
        #: SBM routing is on when there are powerful replicas to route to: a fixed list, or
        #: those announced on the replicas topic (membership).
        self._sbm = bool(config.powerful_urls) or config.membership
        self._eff: EffectiveTargets | None = None

    def decide(self, segment: str, available_extra: int, now_ms: int,
               request_id: str | None = None) -> Decision:
        """Extra candidates and pool for one request of `segment` at `now_ms`; a request whose
        id hashes into the holdout (``holdout_fraction``) gets no optional work."""
        eff = self.targets.current(now_ms)
        if eff is not self._eff:
            self._on_targets(eff, now_ms)
        bump = self.bump
        bump("requests", "total")
        if request_id is not None and in_holdout(request_id, self.config.holdout_fraction):
            bump("holdout", "total")
            withheld = 0 if eff.baseline_only else min(eff.extra_candidates,
                                                       max(available_extra, 0))
            if withheld:
                bump("rma_shed", "holdout", withheld)   # every unit not done has a reason
            return Decision("baseline", False, 0, eff.reason, 1.0, True)
        if eff.baseline_only:
            bump("baseline_only", eff.reason)
            if self._sbm:
                self.router.route(segment, eff)     # keeps the traffic shares current
            return Decision("baseline", False, 0, eff.reason)
        ranking = self.shedders["baseline"].allowance(now_ms)
        if not self._sbm:
            extra = self._extra(eff, ranking, available_extra, now_ms, budgeted=True)
            return Decision("baseline", False, extra, eff.reason,
                            gain=extras_gain(extra))
        powerful = self.shedders["powerful"].allowance(now_ms)
        router = self.router
        route = router.route(segment, eff, powerful)
        if route.shed:
            bump("sbm_shed", "overload")
        elif route.model == "powerful":
            bump("sbm_routed", "explored" if route.explored else "exploited")
        # The RMA budget pays for extra candidates scored on the ranking pool; a request the
        # powerful pool serves whole is paid for by SBM's share of the capacity, and its
        # extras are cut by that pool's allowance.
        on_ranking = route.model == "baseline"
        available = available_extra if on_ranking else self._powerful_cap(eff, available_extra)
        extra = self._extra(eff, ranking if on_ranking else powerful, available, now_ms,
                            budgeted=on_ranking)
        p = router.last_p
        if route.model == "powerful":
            return Decision("powerful", route.explored, extra, eff.reason, p,
                            gain=router.expected_gain(segment, eff))
        return Decision("baseline", route.explored, extra, eff.reason, 1.0 - p,
                        gain=extras_gain(extra))

    def observe(self, state: ServerSignals | None, now_ms: int, *,
                error: str | None = None, model: Model = "baseline",
                replica: str | None = None) -> None:
        """A replica of pool `model` answered (or did not): feed that pool's allowance, and
        (``replica`` named, ranking pool) what it said it has room for."""
        self.shedders[model].observe(state, now_ms, error=error)
        if state is not None and replica is not None and model == "baseline":
            self.rooms.observe(replica, state.optional_room)

    def fit_to_replica(self, replica: str, extra: int, counted: bool = True) -> int:
        """How many of a request's ``extra`` candidates to send ranking ``replica``: no more
        than it had room for lately (``ReplicaRooms``). The cut is counted as ``room`` once
        per request (``counted``: not again for a hedge). Its budget is not given back, as
        extras a replica trims are not: the next requests would carry them at once, into the
        moment that had no room (docs/client.md)."""
        kept = self.rooms.fit(replica, extra)
        if kept < extra and counted:
            self.bump("rma_shed", "room", extra - kept)
        return kept

    def shed_counters(self) -> dict[str, dict[str, int]]:
        """Each pool's client-side cuts by reason (pools that never cut are left out)."""
        return {model: dict(sorted(s.counters.items()))
                for model, s in self.shedders.items() if s.counters}

    def bump(self, cls: str, reason: str, n: int = 1) -> None:
        """Count `n` units of class `cls` for `reason` (the demo summary reads these)."""
        by_reason = self.counters.get(cls)
        if by_reason is None:
            by_reason = self.counters[cls] = {}
        by_reason[reason] = by_reason.get(reason, 0) + n

    def _powerful_cap(self, eff: EffectiveTargets, available: int) -> int:
        """The candidates beyond its base a powerful request may carry: the SBM target's cap
        on their extras, the cut counted as ``over_target``."""
        wanted = min(eff.extra_candidates, max(available, 0))
        allowed = min(wanted, eff.powerful_extra_candidates)
        if allowed < wanted:
            self.bump("rma_shed", "over_target", wanted - allowed)
        return allowed

    def _extra(self, eff: EffectiveTargets, allowance: float, available: int,
               now_ms: int, *, budgeted: bool) -> int:
        """RMA: target, shrunk by the allowance, then (on the ranking pool) by the budget;
        each cut counted."""
        wanted = min(eff.extra_candidates, max(available, 0))
        if wanted <= 0:
            return 0
        allowed = extra_candidates(eff, allowance, available)
        if allowed < wanted:
            self.bump("rma_shed", "overload", wanted - allowed)
        granted = self.budget.take(allowed, now_ms) if budgeted else allowed
        if granted < allowed:
            self.bump("rma_shed", "budget", allowed - granted)
        if granted:
            self.bump("rma_granted", "units", granted)
        return granted

    def offer(self, targets: ControlTargets, now_ms: int) -> TargetVerdict:
        """A targets message arrived (from the feed): apply it if it is trustworthy."""
        verdict = self.targets.offer(targets, now_ms)
        if verdict.accepted:
            if targets.reason == "period":
                self.rooms.new_period()
            self._on_targets(self.targets.current(now_ms), now_ms)
        return verdict

    def _on_targets(self, eff: EffectiveTargets, now_ms: int) -> None:
        """New effective targets: resize this client's share of the RMA budget. Banked tokens
        carry over within the new burst; the first target starts from an empty bucket, so
        targets arriving never release a burst of extra work at once."""
        rate = eff.budget_units_per_s * self.config.rma_budget_share
        self.budget.set_rate(rate, rate * self.config.rma_burst_s, now_ms)
        self._eff = eff
