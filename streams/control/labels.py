"""The join of decision records with their outcome labels: pure, bounded, counted.

A client writes a decision record (``RoutingOutcome`` v4) when it serves a request; the outcome
(click, conversion, watch time) arrives seconds to hours later as an ``OutcomeLabel`` with the
same request id, or never. ``AttributionJoin`` holds each scope's decisions waiting for their
label and pairs them:

- a label within the attribution window (``labels.window_s``) of its decision's arrival is
  ``joined``: the decision comes back with its value, for the estimators;
- a label that arrives later is ``late``, a second label for one decision a ``duplicate``, a
  label whose decision was never seen (or was dropped, or is long gone) an ``orphan``: each is
  counted by that reason and used for nothing;
- a decision that carried its value already (a client that knew it at response time, every
  v1-v3 record) is joined on arrival (``inline``);
- a decision still unlabelled two windows after it arrived is dropped (``unlabelled``); past
  ``labels.max_pending`` decisions the oldest is dropped (``evicted``). Orphan labels are never
  stored, so a flood of labels for unknown ids costs counters only, and a flood of decisions
  costs at most ``max_pending`` entries.

A client that logs a sample of its decisions (``decision_sample``; contract v9) sends only
the sampled records, each with its inclusion probability pi, and no labels for the rest
(`workers.policy.sampling`: any labeller can tell them by the request-id hash; a label it
sends anyway is an orphan). The join treats a sampled record as any other and hands it back
with ``inclusion`` kept: the estimators weigh it by 1/pi (`streams.control.offpolicy`,
*Sampled decision records*), so the counts here are of logged records, not of requests.
Sampling is what bounds the join at ad scale: at pi = 0.01 ``max_pending`` holds a hundred
times the request rate.

Entries stay for two windows, not one, so that a label one window late is told apart from a
label for a decision never seen. Time is the caller's ``now_ms`` (the event time in replay and
in the simulator, the wall clock live); entries are kept in arrival order, so expiry and
eviction pop from the front in O(1). The pending decisions are not part of the controller's
snapshot (a restart loses at most one window of joins: their labels count as orphans); the
estimates made from joined decisions are (``streams.control.offpolicy``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal, get_args

import msgspec

from schemas.contract import OutcomeLabel, RoutingOutcome
from streams.control.config import LabelsConfig

JoinReason = Literal["joined", "inline", "late", "orphan", "duplicate", "duplicate_decision",
                     "unlabelled", "evicted"]
JOIN_REASONS: tuple[JoinReason, ...] = get_args(JoinReason)


class AttributionJoin:
    """Decisions of one scope waiting for their labels (see the module docstring)."""

    def __init__(self, config: LabelsConfig) -> None:
        self.window_ms = round(config.window_s * 1000)
        self.retain_ms = 2 * self.window_ms
        self.max_pending = config.max_pending
        #: request id -> the decision (waiting), or its arrival time (joined: kept to tell
        #: duplicates and late labels from orphans until it expires).
        self._pending: OrderedDict[str, RoutingOutcome | int] = OrderedDict()
        #: arrival time of each entry, in the same order (expiry reads the front).
        self._arrived: OrderedDict[str, int] = OrderedDict()
        self.counts: dict[str, int] = dict.fromkeys(JOIN_REASONS, 0)

    def __len__(self) -> int:
        return len(self._pending)

    def on_decision(self, decision: RoutingOutcome, now_ms: int) -> RoutingOutcome | None:
        """Hold a decision for its label; one that carries its value is joined at once."""
        counts = self.counts
        if decision.value is not None:
            counts["inline"] += 1
            return decision
        rid = decision.request_id
        if rid in self._pending:
            counts["duplicate_decision"] += 1
            return None
        self._expire(now_ms)
        pending, arrived = self._pending, self._arrived
        while len(pending) >= self.max_pending:
            old, entry = pending.popitem(last=False)
            del arrived[old]
            if not isinstance(entry, int):
                counts["evicted"] += 1
        pending[rid] = decision
        arrived[rid] = now_ms
        return None

    def on_label(self, label: OutcomeLabel, now_ms: int) -> RoutingOutcome | None:
        """The decision a label completes, with its value; None (counted) when none."""
        counts = self.counts
        rid = label.request_id
        entry = self._pending.get(rid)
        if entry is None:
            counts["orphan"] += 1
            return None
        if isinstance(entry, int):
            counts["duplicate"] += 1
            return None
        arrived = self._arrived[rid]
        self._pending[rid] = arrived
        if now_ms - arrived > self.window_ms:
            counts["late"] += 1
            return None
        counts["joined"] += 1
        return msgspec.structs.replace(entry, value=label.value)

    def expire(self, now_ms: int) -> None:
        """Drop what is older than two windows (the controller calls it every tick)."""
        self._expire(now_ms)

    def _expire(self, now_ms: int) -> None:
        arrived, pending = self._arrived, self._pending
        cutoff = now_ms - self.retain_ms
        while arrived:
            rid, at = next(iter(arrived.items()))
            if at >= cutoff:
                return
            del arrived[rid]
            if not isinstance(pending.pop(rid), int):
                self.counts["unlabelled"] += 1
