"""Builders for targets used across policy and client tests."""

from __future__ import annotations

from schemas.contract import ControlTargets, RmaTarget, SbmTarget, SegmentPriority

T0 = 1_700_000_000_000


def targets(*, epoch: int = 1, issued_at_ms: int = T0, ttl_ms: int = 30_000,
            scope: str = "eu1", extra: int = 64, budget: float = 5_000.0,
            coverage: float = 0.25,
            segments: dict[str, tuple[float, float]] | None = None,
            powerful_extra: int | None = None) -> ControlTargets:
    """A valid ControlTargets; `segments` maps name -> (gain_mean, gain_std);
    `powerful_extra` caps the extras of powerful requests (a v5 target)."""
    priorities = {name: SegmentPriority(gain_mean=m, gain_std=s, observations=100)
                  for name, (m, s) in (segments or {}).items()}
    return ControlTargets(scope=scope, epoch=epoch, issued_at_ms=issued_at_ms, ttl_ms=ttl_ms,
                          rma=RmaTarget(extra_candidates=extra, budget_units_per_s=budget),
                          sbm=SbmTarget(coverage=coverage, segments=priorities,
                                        extra_candidates=powerful_extra),
                          v=2 if powerful_extra is None else 5)
