"""The ranking clients of one region: the real client decision, or the naive team's rule.

``SurplusClient`` is the library a ranking service embeds, minus HTTP: the real ``Decider``
(TargetState + SbmRouter + ClientShedder + BudgetBucket) decides each request's extra
candidates and pool, is told every worker's load signals, and learns from observed values.
``NaiveClient`` is what a team writes first for the ``naive`` controller: it still fails safe
on stale targets (the same ``TargetState``), asks for the target's extra candidates on every
request, and sends a request to the powerful model whenever its value signal is above a
threshold and the powerful share so far is below the target coverage.
"""

from __future__ import annotations

from typing import Protocol

from schemas.contract import ControlTargets
from sim.scenario import ClientConfigPart, NaiveConfig
from workers.api import ServerState
from workers.client.config import ClientConfig
from workers.client.decision import Decider, Decision
from workers.policy.routing import Model
from workers.policy.targets import TargetState

SIM_URL = "http://sim.invalid"


class SimClient(Protocol):
    """What the engine needs from a region's clients."""

    def decide(self, segment: str, value: float, available_extra: int, now: int,
               request_id: str | None = None) -> Decision:
        """One request's pool and extra candidates, before it is sent.

        :param segment: the request's segment, what the router learns gains by.
        :param value: its value signal; only the naive rule reads it (the real router ranks
            segments by learned gain, not by the signal).
        :param available_extra: extra candidates retrieval offers for it.
        :param now: simulated time (ms).
        :param request_id: the id a logged decision carries, for the label join.
        """
        ...

    def offer(self, targets: ControlTargets, now: int) -> None:
        """Targets as the broadcast delivers them, late or out of order as it may."""
        ...

    def observe(self, state: ServerState | None, now: int, error: str | None = None,
                model: Model = "baseline", replica: str | None = None) -> None:
        """A worker's load signals on an answer (None with ``error``: no answer), which the
        client-side shedding reacts to within a request; ``replica``: the worker's id."""
        ...

    def fit_to_replica(self, replica: str, extra: int) -> int:
        """How many of a request's ``extra`` candidates to send ranking ``replica``."""
        ...

    def learn(self, segment: str, model: str, value: float) -> None:
        """A joined label's value, for the router's per-segment gain (explore/exploit)."""
        ...

    def counters(self) -> dict[str, dict[str, int]]:
        """Counts by class and reason, sorted, for the run's summary."""
        ...


class SurplusClient:
    """The real per-request decision (``workers.client.decision.Decider``)."""

    def __init__(self, region: str, part: ClientConfigPart, *, powerful: bool,
                 seed: int) -> None:
        config = ClientConfig(
            scope=region, baseline_urls=[f"{SIM_URL}/{region}/baseline"],
            powerful_urls=[f"{SIM_URL}/{region}/powerful"] if powerful else [],
            powerful_deadline_share=part.powerful_deadline_share, rma_budget_share=1.0,
            rma_burst_s=part.rma_burst_s, seed=seed, publish_outcomes=True,
            limits=part.limits, router=part.router, shed=part.shed,
            holdout_fraction=part.holdout_fraction, decision_sample=part.decision_sample,
            answer_holdout_fraction=part.answer_holdout_fraction)
        self.decider = Decider(config)

    def decide(self, segment: str, value: float, available_extra: int, now: int,
               request_id: str | None = None) -> Decision:
        return self.decider.decide(segment, available_extra, now, request_id)

    def offer(self, targets: ControlTargets, now: int) -> None:
        self.decider.offer(targets, now)

    def observe(self, state: ServerState | None, now: int, error: str | None = None,
                model: Model = "baseline", replica: str | None = None) -> None:
        self.decider.observe(state, now, error=error, model=model, replica=replica)

    def fit_to_replica(self, replica: str, extra: int) -> int:
        return self.decider.fit_to_replica(replica, extra)

    def learn(self, segment: str, model: str, value: float) -> None:
        self.decider.router.observe(segment, model, value)  # type: ignore[arg-type]

    def counters(self) -> dict[str, dict[str, int]]:
        out = {cls: dict(sorted(reasons.items()))
               for cls, reasons in sorted(self.decider.counters.items())}
        out["targets"] = dict(sorted(self.decider.targets.counters.items()))
        for model, cuts in self.decider.shed_counters().items():
            out[f"client_shed_{model}"] = cuts
        return out


class NaiveClient:
    """Value threshold routing toward a coverage target; extra candidates as targeted."""

    def __init__(self, region: str, part: ClientConfigPart, naive: NaiveConfig) -> None:
        self.targets = TargetState(region, part.limits)
        self.naive = naive
        self.routed = 0.0
        self.seen = 0.0
        self._counters: dict[str, dict[str, int]] = {}

    def decide(self, segment: str, value: float, available_extra: int, now: int,
               request_id: str | None = None) -> Decision:
        eff = self.targets.current(now)
        self._bump("requests", "total")
        if eff.baseline_only:
            self._bump("baseline_only", eff.reason)
            return Decision("baseline", False, 0, eff.reason)
        extra = min(eff.extra_candidates, max(available_extra, 0))
        self.seen = self.seen * 0.999 + 1.0
        model: Model = "baseline"
        if value > self.naive.value_threshold and self.routed < eff.coverage * self.seen:
            model = "powerful"
            self.routed = self.routed * 0.999 + 1.0
            self._bump("sbm_routed", "value_threshold")
        else:
            self.routed *= 0.999
        return Decision(model, False, extra, eff.reason)

    def offer(self, targets: ControlTargets, now: int) -> None:
        self.targets.offer(targets, now)

    def observe(self, state: ServerState | None, now: int, error: str | None = None,
                model: Model = "baseline", replica: str | None = None) -> None:
        if error is not None:
            self._bump("errors", error)

    def fit_to_replica(self, replica: str, extra: int) -> int:
        return extra    # greedy: every replica is sent all it is offered

    def learn(self, segment: str, model: str, value: float) -> None:
        return None

    def counters(self) -> dict[str, dict[str, int]]:
        out = {cls: dict(sorted(reasons.items())) for cls, reasons in
               sorted(self._counters.items())}
        out["targets"] = dict(sorted(self.targets.counters.items()))
        return out

    def _bump(self, cls: str, reason: str) -> None:
        by_reason = self._counters.setdefault(cls, {})
        by_reason[reason] = by_reason.get(reason, 0) + 1
