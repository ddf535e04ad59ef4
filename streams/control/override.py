"""An operator's override applied to the targets the control loop computed (pure).

The loop decides what spare capacity allows; an operator may want less (an incident, a bad
model, a cost ceiling) without restarting anything. ``apply`` takes the loop's levers and the
scope's override and returns the levers to publish:

- ``kill``: baseline only (no extra candidates, no budget, no coverage), both levers limited by
  ``operator``;
- ``freeze``: the targets last issued, held (a preemption still lowers them: the fast path
  never raises optional work, and a freeze must not keep work on capacity that is gone);
- ``max_extra`` / ``max_coverage``: a cap; only a lever the cap lowered says ``operator``.

The precompute lever's share (``precompute``) follows the same kill and freeze: 0 under a
kill, the share last issued under a freeze; no cap names it.

An override applies while it is active (``active``): a ``set`` younger than its TTL on the
clock of the caller (the tick's time live and in replay, so replay gives the same bytes). A
``clear`` or a lapsed TTL applies nothing, and the loop's own targets go out unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from schemas.contract import (
    ControlTargets,
    OperatorOverride,
    PrecomputeTarget,
    RmaTarget,
    SbmTarget,
)


def active(override: OperatorOverride | None, now_ms: int) -> bool:
    """Whether ``override`` applies at ``now_ms``: a set whose TTL has not run out."""
    return (override is not None and override.action == "set"
            and now_ms < override.issued_at_ms + override.ttl_ms)


def baseline_only(sbm: SbmTarget) -> tuple[RmaTarget, SbmTarget]:
    """The levers of a kill: nothing optional, segment priorities kept for the way back."""
    return (RmaTarget(extra_candidates=0, budget_units_per_s=0.0, limited_by="operator"),
            SbmTarget(coverage=0.0, segments=sbm.segments, limited_by="operator"))


def apply(override: OperatorOverride | None, now_ms: int, rma: RmaTarget, sbm: SbmTarget,
          last: ControlTargets | None) -> tuple[RmaTarget, SbmTarget] | None:
    """The levers ``override`` allows, or None when it does not apply (inactive)."""
    if override is None or not active(override, now_ms):
        return None
    if override.kill:
        return baseline_only(sbm)
    if override.freeze:
        if last is None:  # nothing issued to hold: hold nothing
            return baseline_only(sbm)
        rma = msgspec.structs.replace(last.rma, limited_by="operator")
        sbm = msgspec.structs.replace(last.sbm, limited_by="operator")
    cap = override.max_extra
    if cap is not None and rma.extra_candidates > cap:
        rma = msgspec.structs.replace(rma, extra_candidates=cap, limited_by="operator")
    share = override.max_coverage
    if share is not None and sbm.coverage > share:
        sbm = msgspec.structs.replace(sbm, coverage=share, limited_by="operator")
    return rma, sbm


def precompute(override: OperatorOverride | None, now_ms: int,
               share: PrecomputeTarget | None,
               last: ControlTargets | None) -> PrecomputeTarget | None:
    """The precompute share ``override`` allows (the loop's ``share`` when it does not apply;
    None stays None: the lever is off)."""
    if share is None or override is None or not active(override, now_ms):
        return share
    if override.kill:
        return PrecomputeTarget(share=0.0, limited_by="operator")
    if override.freeze:  # hold what was issued; nothing issued: hold nothing, as ``apply``
        held = None if last is None else last.precompute
        return (msgspec.structs.replace(held, limited_by="operator")
                if isinstance(held, PrecomputeTarget)
                else PrecomputeTarget(share=0.0, limited_by="operator"))
    return share


def describe(override: OperatorOverride, when: Callable[[int], str] = str) -> str:
    """One line for logs and ``surplus override list``: what it does, until when (``when``
    spells a time in ms: the CLI shows UTC), by whom and why."""
    if override.action == "clear":
        what = "clear"
    else:
        parts = [name for name in ("kill", "freeze") if getattr(override, name)]
        if override.max_extra is not None:
            parts.append(f"max_extra={override.max_extra}")
        if override.max_coverage is not None:
            parts.append(f"max_coverage={override.max_coverage:g}")
        what = " ".join(parts)
    by = f" by {override.by}" if override.by else ""
    return (f"{override.scope}: {what} until {when(override.issued_at_ms + override.ttl_ms)}"
            f"{by}: {override.reason}")
