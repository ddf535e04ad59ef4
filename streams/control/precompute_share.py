"""The precompute lever's target: how much of a lent replica its precompute may use.

A lent replica scores precompute jobs in its idle time, paced so that its requests and its
jobs together use at most a share of its CPU (``workers.policy.precompute.Pace``, capped by
the replica's own ``max_share``). Each replica measures its own headroom that way, every half
second: what its requests leave of the share is what its jobs may use. The control plane sets
the share per scope, once a period, from what only it measures:

- **value**: the lever's lift per visit that used an answer (``precompute_per_hit``, against
  the answer holdout). Where its whole interval is below zero the answers make rankings worse,
  and the share falls to ``probe_share``: enough answers for the holdout to keep measuring
  them, as SBM keeps exploring a segment it does not cover (``demand``: no visit gains from
  more). Otherwise the share is ``max_share``.
- **why not more**: where the lent pools running the lever fill what the share allows (their
  requests' and their slices' measured share of time), ``max`` binds; where they leave it
  unused, they ran out of jobs, and the jobs asked bind (``demand``); with none running it
  (reclaimed), ``capacity``.

Not the latency of the lent pools: a request waits for one slice at most, and the pace keeps
the process under its CPU quota, so a lent pool over its SLA is the RMA and SBM loops'
business (they run those pools up to their SLA by design). Halving the share at each such
period, as first tried, cut the simulated demo's value from 966 to 846 (precompute 528 to
386) while its latency stayed the same.

It is only part of the targets of a scope whose replicas report the lever
(``WindowReport.precompute_utilisation``, contract v13), so readers of older targets are
untouched where it is off.
"""

from __future__ import annotations

import msgspec

from schemas.contract import LimitReason, PrecomputeTarget
from streams.control.config import PrecomputeShareConfig
from streams.control.moments import Estimate
from streams.control.windows import WindowStats

#: The share of its allowance a lent pool must fill (requests' and precompute's time) for
#: the allowance, not the jobs, to be what binds. The pace counts the process's whole CPU
#: time and the reports the model's alone, so a pool at its allowance reads under it.
FILLED = 0.6


class PrecomputeShareState(msgspec.Struct, frozen=True, forbid_unknown_fields=True,
                           kw_only=True):
    """The share last set (None: no replica of the scope has reported the lever yet)."""

    share: float | None = None


class PrecomputeSharePolicy:
    """One step per control period: the lent pools' windows and the lever's lift in, the
    share out."""

    def __init__(self, config: PrecomputeShareConfig,
                 state: PrecomputeShareState | None = None) -> None:
        self.config = config
        self.share = (state or PrecomputeShareState()).share

    def step(self, stats: list[WindowStats], per_hit: Estimate) -> PrecomputeTarget | None:
        """This period's target; None while no lent pool of the scope runs the lever."""
        running = [w for w in sorted(stats, key=lambda w: w.pool_id)
                   if w.tier == "opportunistic" and w.precompute_utilisation > 0.0]
        if self.share is None and not running:
            return None
        cfg = self.config
        why: LimitReason
        if per_hit.ci_high is not None and per_hit.ci_high < 0.0:
            share, why = min(cfg.probe_share, cfg.max_share), "demand"
        elif not running:
            share, why = cfg.max_share, "capacity"   # no lent replica runs it this period
        else:
            share = cfg.max_share
            why = "max" if _filled(running, share) else "demand"
        self.share = share
        return PrecomputeTarget(share=share, limited_by=why)

    @property
    def state(self) -> PrecomputeShareState:
        return PrecomputeShareState(share=self.share)


def _filled(running: list[WindowStats], share: float) -> bool:
    """Whether the lent pools use what the share allows (else they ran out of jobs)."""
    return all(w.utilisation + w.precompute_utilisation >= FILLED * share for w in running)
