"""What a period's targets are held to: no higher than targets already issued.

Two moments act on evidence the latency loop cannot trust, and hold the levers to the last
targets instead of letting them step:

- the first period after a restart (the open window died with the old process) or after an
  operator's override lapsed or was cleared (its window was measured under the override):
  a :class:`Ceiling` from the last targets bounds that one period's step;
- the fast path (a preemption notice): it only ever lowers optional work, so what it emits is
  clamped to the last targets (:func:`preemption_targets`), and nothing issued yet means
  baseline only.

Pure: the caller passes the last targets, the override and the time.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.contract import ControlTargets, OperatorOverride, RmaTarget, SbmTarget
from streams.control import override as operator
from streams.control.sbm import sbm_target

#: Why a period's targets say what they say (``ControlTargets.reason``).
Reason = Literal["period", "preemption", "restart", "operator"]


class Ceiling(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Upper bounds on one period's targets, each lever's taken from targets issued before."""

    extra_candidates: float
    """RMA's extra candidates per request."""
    coverage: float
    """SBM's share of requests served by the powerful model."""
    budget_units_per_s: float
    """RMA's extra-work budget."""

    @classmethod
    def of(cls, targets: ControlTargets | None) -> Ceiling:
        """The bounds the given targets set (none issued: zero, baseline only)."""
        if targets is None:
            return cls(extra_candidates=0.0, coverage=0.0, budget_units_per_s=0.0)
        return cls(extra_candidates=float(targets.rma.extra_candidates),
                   coverage=targets.sbm.coverage,
                   budget_units_per_s=targets.rma.budget_units_per_s)


def period_ceiling(restart: Ceiling | None, last: ControlTargets | None,
                   override: OperatorOverride | None,
                   now_ms: int) -> tuple[Ceiling | None, Reason]:
    """This period's ceiling (None: the usual step limits only) and its reason.

    :param restart: the snapshot's last targets, on the first tick after a restart (else None).
    :param last: the targets this controller issued last.
    :param override: the scope's latest operator override.
    :param now_ms: the tick's time.

    After a restart the period is held to the snapshot's targets, reason ``restart``. After
    an override lapsed or was cleared it is held to what the override allowed, reason
    ``period``: from the next period the usual rules apply, the held point of a lever it cut
    included. An override still active is applied after the step (``override.apply``).
    """
    if restart is not None:
        return restart, "restart"
    if last is not None and last.reason == "operator" and not operator.active(override, now_ms):
        return Ceiling.of(last), "period"
    return None, "period"


def preemption_targets(last: ControlTargets | None, rma: RmaTarget,
                       coverage: float) -> tuple[RmaTarget, SbmTarget] | None:
    """The fast path's targets: what remaining capacity supports (``rma``, ``coverage``), no
    higher than the last targets issued, every lever limited by ``preemption``. Nothing issued
    yet: baseline only, since the fast path never raises optional work.

    None when the last targets, emitted for an earlier notice, already say exactly that: a
    repeat (a scheduler re-announcing its reclaim until the deadline) changes nothing, and
    re-sending them would only load the broker and every worker at the moment the notices
    themselves must be fast.
    """
    if last is None:
        return (RmaTarget(extra_candidates=0, budget_units_per_s=0.0, limited_by="preemption"),
                sbm_target(0.0, {}, "preemption", None))
    held = RmaTarget(extra_candidates=min(rma.extra_candidates, last.rma.extra_candidates),
                     budget_units_per_s=min(rma.budget_units_per_s,
                                            last.rma.budget_units_per_s),
                     limited_by="preemption")
    sbm = sbm_target(min(coverage, last.sbm.coverage), last.sbm.segments, "preemption",
                     last.sbm.extra_candidates)
    if last.reason == "preemption" and (last.rma, last.sbm) == (held, sbm):
        return None
    return held, sbm
