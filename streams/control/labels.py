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
eviction pop from the front. Where the entries are kept is the caller's choice, injected as
a ``PendingStore`` (`streams.control.pending`): an ordered dict in the process by default
(replay, the simulator, unit tests), RocksDB with a changelog topic in the live control plane
(`streams.agents.pending`), where pending decisions cost disk rather than RAM at any request
rate and survive a restart, so their labels still join after it. They are not part of the
controller's snapshot; the estimates made from joined decisions are
(``streams.control.offpolicy``).
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

from schemas.contract import OutcomeLabel, RoutingOutcome
from streams.control.config import LabelsConfig
from streams.control.pending import MemoryPendingStore, Pending, PendingStore

JoinReason = Literal["joined", "inline", "late", "orphan", "duplicate", "duplicate_decision",
                     "unlabelled", "evicted"]
JOIN_REASONS: tuple[JoinReason, ...] = get_args(JoinReason)


class AttributionJoin:
    """Decisions of one scope waiting for their labels (see the module docstring).

    :param config: the attribution window and the cap on entries held (``max_pending``).
    :param store: where the entries wait (`streams.control.pending`); None: in this process.
    """

    def __init__(self, config: LabelsConfig, store: PendingStore | None = None) -> None:
        self.window_ms = round(config.window_s * 1000)
        self.retain_ms = 2 * self.window_ms
        self.max_pending = config.max_pending
        #: request id -> its entry: the decision waiting, or only its arrival once joined
        #: (kept to tell duplicates and late labels from orphans until it expires).
        self._store: PendingStore = store if store is not None else MemoryPendingStore()
        self.counts: dict[str, int] = dict.fromkeys(JOIN_REASONS, 0)

    def __len__(self) -> int:
        return len(self._store)

    @property
    def store(self) -> PendingStore:
        """Where the entries wait."""
        return self._store

    def on_decision(self, decision: RoutingOutcome, now_ms: int) -> RoutingOutcome | None:
        """Hold a decision for its label; one that carries its value is joined at once."""
        counts = self.counts
        if decision.value is not None:
            counts["inline"] += 1
            return decision
        rid = decision.request_id
        store = self._store
        if rid in store:
            counts["duplicate_decision"] += 1
            return None
        self._expire(now_ms)
        while len(store) >= self.max_pending:
            if store.drop_oldest():
                counts["evicted"] += 1
        store.add(rid, Pending(now_ms, decision))
        return None

    def on_label(self, label: OutcomeLabel, now_ms: int) -> RoutingOutcome | None:
        """The decision a label completes, with its value; None (counted) when none."""
        counts = self.counts
        rid = label.request_id
        entry = self._store.get(rid)
        if entry is None:
            counts["orphan"] += 1
            return None
        decision = entry.decision
        if decision is None:
            counts["duplicate"] += 1
            return None
        self._store.replace(rid, Pending(entry.arrived_ms, None))
        if now_ms - entry.arrived_ms > self.window_ms:
            counts["late"] += 1
            return None
        counts["joined"] += 1
        return msgspec.structs.replace(decision, value=label.value)

    def expire(self, now_ms: int) -> None:
        """Drop what is older than two windows (the controller calls it every tick)."""
        self._expire(now_ms)

    def _expire(self, now_ms: int) -> None:
        self.counts["unlabelled"] += self._store.drop_older(now_ms - self.retain_ms)
