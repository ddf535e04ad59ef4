"""Target state on the receiving side: the only way a worker or client learns how much optional
work it may do, and the place where invariant 2 (fail safe) is enforced.

A receiver holds at most one `ControlTargets` for its scope. Anything it cannot trust — nothing
received yet, a target past its TTL, one from another scope, an unsigned or forged one when a
key is configured, one issued in the future beyond the allowed clock skew, an older epoch, or
values outside the contract's range — leaves it at *baseline only*. Ages and expiry are read on
the sender's clock, through an estimate of the offset between the two (``offset_ms``), so a
receiver whose clock is off by up to ``max_clock_skew_ms`` keeps targets exactly as long.
Values inside the contract but above this receiver's own limits are clamped, and the clamp is
counted.

A target already past its TTL when it arrives is dropped as ``expired`` before its signature is
checked, so it is never refused for its key: a reader that starts after a key's retirement
finds the retired key's last targets still on the compacted topic, genuine and merely old,
and counts them expired rather than dead-lettering them as ``unknown_key``. This is safe
because an expired target is never applied, whoever signed it: a forgery with an old
``issued_at_ms`` is dropped the same way (counted, not dead-lettered), and it teaches the clock
offset nothing unless it also verifies. Only a target that could be applied is judged by its
signature, and refused and dead-lettered when it fails.

`current(now_ms)` is on every request's path, so it is a comparison and a cached object; all the
work happens in `offer`, which runs once per targets message.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import msgspec

from schemas.contract import ControlTargets, SegmentPriority


class LocalLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What this receiver will do at most, whatever the control plane says."""

    max_extra_candidates: int = 256
    max_coverage: float = 1.0
    max_ttl_ms: int = 300_000
    max_clock_skew_ms: int = 5_000
    max_budget_units_per_s: float = 1e9


class TargetVerdict(msgspec.Struct, frozen=True):
    """Whether `offer` applied a target, and why (the counter key it bumped)."""

    accepted: bool
    reason: str


class EffectiveTargets(msgspec.Struct, frozen=True):
    """What may be done right now: the clamped target, or baseline only with the reason."""

    extra_candidates: int
    coverage: float
    budget_units_per_s: float
    segments: dict[str, SegmentPriority]
    epoch: int
    baseline_only: bool
    reason: str
    expires_at_ms: int = 0
    #: Extra candidates a request the powerful model serves may carry
    #: (``ControlTargets.powerful_extra_candidates``; 0 while baseline only).
    powerful_extra_candidates: int = 0
    #: The precompute lever's share of a lent replica (``ControlTargets.precompute``); None
    #: where the targets do not set it: the replica's own ``max_share`` alone applies.
    precompute_share: float | None = None


def baseline_only(reason: str, epoch: int = -1) -> EffectiveTargets:
    """No optional work at all, and why."""
    return EffectiveTargets(extra_candidates=0, coverage=0.0, budget_units_per_s=0.0,
                            segments={}, epoch=epoch, baseline_only=True, reason=reason)


NO_TARGETS = baseline_only("no_targets")

#: Genuine targets the clock offset to their sender is estimated over.
OFFSET_SAMPLES = 64
#: Rejections that say a target may not come from the control plane at all: no clock evidence.
UNAUTHENTIC = frozenset({"wrong_scope", "unsigned", "unknown_key", "bad_signature",
                         "out_of_range"})

ACCEPTED = "applied"
CLAMPED = "clamped"


class TargetState:
    """The targets one receiver holds for one scope, with fail-safe expiry and preemption."""

    def __init__(self, scope: str, limits: LocalLimits,
                 verifier: Callable[[ControlTargets], str | None] | None = None) -> None:
        self.scope = scope
        self.limits = limits
        self.verifier = verifier
        self.counters: dict[str, int] = {}
        self.held: ControlTargets | None = None
        self._active = NO_TARGETS
        self._expires_at_ms = -1
        self._expiry_counted = True
        self._preempted_at_ms: int | None = None
        #: Receipt time less issue time of recent accepted targets (clock offset + transit).
        self._lags: deque[int] = deque(maxlen=OFFSET_SAMPLES)

    @property
    def epoch(self) -> int:
        """Epoch of the held target, -1 when none was ever accepted."""
        return -1 if self.held is None else self.held.epoch

    @property
    def preempted(self) -> bool:
        return self._preempted_at_ms is not None

    def offer(self, targets: ControlTargets, now_ms: int) -> TargetVerdict:
        """Apply `targets` if it is trustworthy and newer than what is held; count the verdict."""
        reason = self._rejection(targets, now_ms)
        before = self.offset_ms()
        if self._genuine(targets, reason):  # even a late one: clock evidence
            self._lags.append(now_ms - targets.issued_at_ms)
        if reason is not None:
            return self._count(TargetVerdict(False, reason))
        clamped, was_clamped = self._clamp(targets)
        self.held = clamped
        self._preempted_at_ms = None
        # The smaller of the offsets without and with this target: its own lag may lower the
        # estimate (less transit than before) but never vouch for itself (see offset_ms).
        offset = min(before, self.offset_ms())
        self._expires_at_ms = clamped.issued_at_ms + offset + clamped.ttl_ms
        self._expiry_counted = False
        self._active = EffectiveTargets(
            extra_candidates=clamped.rma.extra_candidates, coverage=clamped.sbm.coverage,
            budget_units_per_s=clamped.rma.budget_units_per_s, segments=clamped.sbm.segments,
            epoch=clamped.epoch, baseline_only=False, reason=CLAMPED if was_clamped else ACCEPTED,
            expires_at_ms=self._expires_at_ms,
            powerful_extra_candidates=clamped.powerful_extra_candidates,
            precompute_share=(None if clamped.precompute is msgspec.UNSET
                              else clamped.precompute.share))
        return self._count(TargetVerdict(True, CLAMPED if was_clamped else ACCEPTED))

    def current(self, now_ms: int) -> EffectiveTargets:
        """What may be done at `now_ms`. Cheap: called on every request."""
        if now_ms < self._expires_at_ms:
            return self._active
        if self.held is None:
            return self._active
        if not self._expiry_counted:
            self._expiry_counted = True
            self._bump("held_expired")
            self._active = baseline_only("expired", self.held.epoch)
        return self._active

    def preempt(self, now_ms: int) -> None:
        """Local fast path: stop optional work now, without waiting for the control loop.

        Holds until a target with a newer epoch, issued after `now_ms`, arrives: a target the
        control plane sent before it knew of the preemption must not switch work back on.
        """
        self._preempted_at_ms = now_ms
        self._bump("preempted")
        self._active = baseline_only("preempted", self.epoch)
        self._expiry_counted = True
        self._expires_at_ms = -1 if self.held is None else 2**62

    def age_ms(self, now_ms: int) -> int | None:
        """How old the held target is on its sender's clock (None when none was accepted):
        what an operator watches to see targets still flowing, read as expiry reads it."""
        if self.held is None:
            return None
        return now_ms - self.offset_ms() - self.held.issued_at_ms

    def offset_ms(self) -> int:
        """How far this receiver's clock runs ahead of the control plane's (negative: behind),
        estimated as NTP's minimum filter does: the smallest lag (receipt less issue time)
        among recent genuine targets (accepted or not: one rejected as expired is evidence
        too) is the one with the least transit, so what remains of it is the offset. Bounded
        by ``max_clock_skew_ms``, the tolerance: within it a skewed clock neither rejects
        targets as from the future nor expires them early.

        Only earlier targets count, never the one being judged: a target read back late at
        start would otherwise vouch for its own freshness. So the first target is judged on
        the raw clocks (0 until there is evidence), and the offset applies from the second."""
        if not self._lags:
            return 0
        bound = self.limits.max_clock_skew_ms
        return max(-bound, min(bound, min(self._lags)))

    def _genuine(self, targets: ControlTargets, reason: str | None) -> bool:
        """Whether `targets` came from the control plane as far as this receiver can tell:
        what its lag may teach the clock offset. An expired one was judged before its
        signature, so the signature is checked here, for the clock only."""
        if reason in UNAUTHENTIC:
            return False
        if reason != "expired":
            return True
        return ((self.verifier is None or self.verifier(targets) is None)
                and _in_range(targets))

    def _expired(self, targets: ControlTargets, now_ms: int) -> bool:
        """Past its TTL (capped by ``max_ttl_ms``) on the sender's clock, read through the
        offset estimated from earlier genuine targets."""
        lag = now_ms - targets.issued_at_ms
        return lag - self.offset_ms() >= min(targets.ttl_ms, self.limits.max_ttl_ms)

    def _rejection(self, targets: ControlTargets, now_ms: int) -> str | None:
        """Why `targets` must not be applied, or None.

        Expiry comes before the signature (see the module docstring): an expired target is
        never applied whoever signed it, so its key is not judged and it is not refused for
        it (a retired key's genuine targets, read back from the compacted topic)."""
        if targets.scope != self.scope:
            return "wrong_scope"
        if self._expired(targets, now_ms):
            return "expired"
        if self.verifier is not None:
            refusal = self.verifier(targets)   # unsigned, unknown_key, bad_signature
            if refusal is not None:
                return refusal
        if not _in_range(targets):
            return "out_of_range"
        if self.held is not None and targets.epoch <= self.held.epoch:
            return "duplicate_epoch" if targets.epoch == self.held.epoch else "older_epoch"
        lag = now_ms - targets.issued_at_ms
        if lag < -self.limits.max_clock_skew_ms:
            return "from_future"
        offset = self.offset_ms()
        # Resuming on a target sent before the preemption is the unsafe mistake, and the
        # estimate errs high (by the least transit seen): so a clock found ahead is not
        # credited here (resuming later, by at most the skew), one found behind is.
        if (self._preempted_at_ms is not None
                and targets.issued_at_ms + min(offset, 0) <= self._preempted_at_ms):
            return "issued_before_preemption"
        return None

    def _clamp(self, targets: ControlTargets) -> tuple[ControlTargets, bool]:
        """`targets` cut down to the local limits, and whether anything was cut."""
        lim = self.limits
        extra = min(targets.rma.extra_candidates, lim.max_extra_candidates)
        budget = min(targets.rma.budget_units_per_s, lim.max_budget_units_per_s)
        coverage = min(targets.sbm.coverage, lim.max_coverage)
        ttl = min(targets.ttl_ms, lim.max_ttl_ms)
        if (extra, budget, coverage, ttl) == (targets.rma.extra_candidates,
                                              targets.rma.budget_units_per_s,
                                              targets.sbm.coverage, targets.ttl_ms):
            return targets, False
        rma = msgspec.structs.replace(targets.rma, extra_candidates=extra,
                                      budget_units_per_s=budget)
        sbm = msgspec.structs.replace(targets.sbm, coverage=coverage)
        return msgspec.structs.replace(targets, rma=rma, sbm=sbm, ttl_ms=ttl), True

    def _count(self, verdict: TargetVerdict) -> TargetVerdict:
        self._bump(verdict.reason)
        return verdict

    def _bump(self, reason: str) -> None:
        self.counters[reason] = self.counters.get(reason, 0) + 1


def _finite_nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0.0


def _in_range(targets: ControlTargets) -> bool:
    """The contract's bounds, rechecked: a struct built in code skips decode-time validation."""
    rma, sbm = targets.rma, targets.sbm
    if not (isinstance(rma.extra_candidates, int) and rma.extra_candidates >= 0):
        return False
    if not (_finite_nonneg(rma.budget_units_per_s) and _finite_nonneg(sbm.coverage)
            and sbm.coverage <= 1.0):
        return False
    if targets.ttl_ms <= 0 or targets.epoch < 0 or targets.issued_at_ms < 0:
        return False
    pre = targets.precompute
    if pre is not msgspec.UNSET and not (_finite_nonneg(pre.share) and pre.share <= 1.0):
        return False
    return all(math.isfinite(p.gain_mean) and _finite_nonneg(p.gain_std)
               for p in sbm.segments.values())
