"""The client's counters by class and reason, and the state they explain, as one dict for the
demo's summary.json: what was decided, shed and refused, next to the targets in force, the
feeds and the live set, so a run's summary says why optional work was or was not done."""

from __future__ import annotations

from typing import Any

from workers.client.config import ClientConfig
from workers.client.decision import Decider
from workers.client.feed import MembershipFeed, TargetsFeed
from workers.policy.membership import Membership


def client_summary(config: ClientConfig, decider: Decider, now: int, *,
                   feed: TargetsFeed | None, membership: Membership | None,
                   membership_feed: MembershipFeed | None) -> dict[str, Any]:
    """The summary at ``now`` (the client's clock, ms).

    :param feed: the targets feed (None: no Kafka, or not started).
    :param membership: the live set (None: ``config.membership`` off).
    :param membership_feed: the replicas feed (None: no Kafka, not started, or membership off).
    """
    eff = decider.targets.current(now)
    return {
        "scope": config.scope,
        "decisions": {cls: dict(reasons) for cls, reasons in decider.counters.items()},
        "targets": dict(decider.targets.counters),
        "client_shed": decider.shed_counters(),
        "feed": {} if feed is None else dict(feed.counters),
        "feed_failed": None if feed is None else feed.failed,
        "membership": None if membership is None else {
            "offers": dict(membership.counters),
            "feed": {} if membership_feed is None else dict(membership_feed.counters),
            "routable": {m: len(membership.routable(m, now))
                         for m in ("baseline", "powerful")}},
        "effective": {"epoch": eff.epoch, "baseline_only": eff.baseline_only,
                      "reason": eff.reason, "coverage": eff.coverage,
                      "extra_candidates": eff.extra_candidates},
        "allowance": {model: shedder.allowance(now)
                      for model, shedder in decider.shedders.items()},
    }
