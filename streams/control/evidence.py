"""What one scope's decisions and their labels say optional work is worth.

Decision records wait in the label join (``streams.control.labels``) for their outcome
labels; a decision joined with its label within the attribution window (or one that carried
its value) is folded into the gain estimates (``streams.control.offpolicy``): the segments'
off-policy gains SBM's targets carry, the holdout lift, and the value curves the allocator may
learn. The join's entries wait where the caller's ``PendingStore`` keeps them; the estimates
are controller state. Pure: time is the caller's ``now_ms``.
"""

from __future__ import annotations

from schemas.contract import LiftReport, OutcomeLabel, RoutingOutcome
from streams.control.config import ControlConfig
from streams.control.labels import AttributionJoin
from streams.control.offpolicy import EstimatesState, GainEstimator, lift_report
from streams.control.pending import PendingStore


class ValueEvidence:
    """The label join of one scope and the estimates its joined decisions feed."""

    def __init__(self, config: ControlConfig, state: EstimatesState,
                 pending: PendingStore | None = None) -> None:
        """:param config: the scope's control laws (the ``labels`` and ``sbm`` tables).
        :param state: the estimates to continue from (a fresh ``EstimatesState``: none).
        :param pending: where decisions wait for their labels; None: in this process.
        """
        self.join = AttributionJoin(config.labels, pending)
        self.estimates = GainEstimator(config.sbm, config.labels, state)

    def on_decision(self, outcome: RoutingOutcome, now_ms: int) -> None:
        """A decision record: held for its label, or joined at once if it carries its value."""
        joined = self.join.on_decision(outcome, now_ms)
        if joined is not None:
            self.estimates.observe(joined)

    def on_label(self, label: OutcomeLabel, now_ms: int) -> None:
        """An outcome label: joined with its decision within the window, else counted."""
        joined = self.join.on_label(label, now_ms)
        if joined is not None:
            self.estimates.observe(joined)

    def report(self, scope: str, now_ms: int, epoch: int, curves_learned: bool) -> LiftReport:
        """The measured lift and the join's counts, for the estimates topic and the log."""
        return lift_report(scope, now_ms, epoch, self.estimates, self.join.counts,
                           curves_learned)
