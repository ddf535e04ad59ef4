"""Client-side shedding of optional work: the millisecond-speed half of invariant 3 on the client.

Every worker response says how loaded the worker is. The client turns that into an *allowance*,
a multiplier in [0, 1] on its optional work (RMA extra candidates and SBM coverage), without
waiting for the control loop:

- cut fast (multiplicative) when servers struggle: queue delay over the bound, a shedding level
  above 0 (a worker's queue grows, or its baseline surges and it holds optional work back), a
  preempted replica, or a failed or timed-out call. A level whose factor is 1 only holds the
  allowance (it stops growing for a cut window). Level 1 cuts by default; the demo scenario
  holds at it (`sim/scenarios/demo.toml` has the figures). Holding was once judged unsafe on
  the demo's two cores, from 40 s runs with one SLA-violation window each; those windows were
  the workers' full garbage collections (``schemas.heap``), seen with and without the hold
  alike. Whether every scenario gains from the hold is not measured yet. Signals arriving
  together (many responses from one overload episode) count as one cut per `cut_window_ms`,
  the deepest of them, like TCP's one cut per round trip, so one bad moment does not zero
  the allowance;
- recover slowly (additive, per second of time) once no cut happened for `cut_window_ms`.

Baseline work is outside its reach: the allowance only scales optional work. Also here, the RMA
helpers: how many extra candidates a request may carry, and a token bucket that keeps this
client within its share of the fleet's extra-work budget.
"""

from __future__ import annotations

import math
from typing import Annotated, Protocol

import msgspec
from msgspec import Meta

from workers.policy.targets import EffectiveTargets

Factor = Annotated[float, Meta(ge=0.0, le=1.0)]


class ServerSignals(Protocol):
    """The load signals a worker response carries (workers.api.ServerState has them)."""

    @property
    def queue_delay_ms(self) -> float: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def shedding_level(self) -> int: ...
    @property
    def preempted(self) -> bool: ...
    @property
    def optional_room(self) -> int | None: ...


class ShedConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How hard and how fast the client backs off optional work, and how slowly it returns."""

    #: Queue delay a worker may report before the client cuts.
    queue_delay_bound_ms: Annotated[float, Meta(gt=0.0)] = 20.0
    #: In-flight requests a worker may report before the client cuts (0: not used).
    max_in_flight: Annotated[int, Meta(ge=0)] = 0
    #: Multiplier applied per cut for: queue delay over bound / in-flight over bound.
    overload_factor: Factor = 0.5
    #: Multipliers for worker shedding levels 1, 2 and 3 (a factor of 1 holds: the allowance
    #: stops growing for a cut window and nothing is cut).
    level_factors: tuple[Factor, Factor, Factor] = (0.8, 0.6, 0.3)
    #: Multiplier when a worker reports it is being preempted.
    preempted_factor: Factor = 0.25
    #: Multiplier on a failed or timed-out call.
    error_factor: Factor = 0.5
    #: Signals within this window after a cut count as one cut (the deepest).
    cut_window_ms: Annotated[int, Meta(ge=0)] = 100
    #: Additive recovery, in allowance per second, after the cut window.
    recover_per_s: Annotated[float, Meta(gt=0.0)] = 0.05
    #: The allowance never falls below this (0 lets optional work stop entirely).
    floor: Factor = 0.0


class ClientShedder:
    """AIMD allowance on optional work, fed by the server state each response carries.

    ``judge_queue_delay=False`` leaves a replica's queue delay to its shedding level: a replica
    that serves whole requests (the powerful pool) queues them up to the deadline they carry,
    far past a ranking queue's bound, and its shedding level already says how near that bound
    it is. Judged against the ranking bound, its normal queue would cut the allowance again
    and again.
    """

    def __init__(self, config: ShedConfig, *, judge_queue_delay: bool = True) -> None:
        self.config = config
        self.judge_queue_delay = judge_queue_delay
        self.counters: dict[str, int] = {}
        self._allowance = 1.0
        self._since_ms: int | None = None
        self._window_start_ms: int | None = None
        self._window_base = 1.0
        self._window_factor = 1.0

    def observe(self, state: ServerSignals | None, now_ms: int, *,
                error: str | None = None) -> None:
        """Feed one response's server state, or `error` ("timeout", "http_503", ...) when the
        call brought none back."""
        if error is not None or state is None:
            self._cut(self.config.error_factor, error or "error", now_ms)
            return
        cfg = self.config
        if state.preempted:
            self._cut(cfg.preempted_factor, "preempted", now_ms)
        if state.shedding_level > 0:
            level = min(state.shedding_level, 3)
            self._cut(cfg.level_factors[level - 1], f"shedding_level_{level}", now_ms)
        if self.judge_queue_delay and state.queue_delay_ms > cfg.queue_delay_bound_ms:
            self._cut(cfg.overload_factor, "queue_delay", now_ms)
        if cfg.max_in_flight and state.in_flight > cfg.max_in_flight:
            self._cut(cfg.overload_factor, "in_flight", now_ms)

    def allowance(self, now_ms: int) -> float:
        """The multiplier on optional work at `now_ms`, in [floor, 1]."""
        since = self._since_ms
        if since is None or now_ms <= since:
            return self._allowance
        cfg = self.config
        start = self._window_start_ms
        if start is not None and now_ms < start + cfg.cut_window_ms:
            return self._allowance
        origin = since if start is None else max(since, start + cfg.cut_window_ms)
        grown = self._allowance + cfg.recover_per_s * (now_ms - origin) / 1000.0
        if grown >= 1.0:
            self._allowance, self._since_ms = 1.0, None
            return 1.0
        self._allowance, self._since_ms, self._window_start_ms = grown, now_ms, None
        return grown

    def _cut(self, factor: float, reason: str, now_ms: int) -> None:
        self.counters[reason] = self.counters.get(reason, 0) + 1
        if factor >= 1.0:
            self._hold(now_ms)
            return
        cfg = self.config
        start = self._window_start_ms
        if start is not None and now_ms < start + cfg.cut_window_ms:
            if factor >= self._window_factor:
                return
            self._window_factor = factor     # deepen this window's cut, do not compound it
        else:
            self._window_base = self.allowance(now_ms)
            self._window_start_ms, self._window_factor = now_ms, factor
            self.counters["cuts"] = self.counters.get("cuts", 0) + 1
        self._allowance = max(self._window_base * self._window_factor, cfg.floor)
        self._since_ms = now_ms

    def _hold(self, now_ms: int) -> None:
        """A signal with a factor of 1: the allowance stops growing for one cut window (a busy
        replica: more would not fit, less is not needed). A cut in that window still cuts."""
        start = self._window_start_ms
        if start is not None and now_ms < start + self.config.cut_window_ms:
            return
        allowance = self.allowance(now_ms)
        if allowance < 1.0:
            self._window_base, self._window_start_ms, self._window_factor = (
                allowance, now_ms, 1.0)
            self._allowance, self._since_ms = allowance, now_ms


def extra_candidates(eff: EffectiveTargets, allowance: float, available_candidates: int) -> int:
    """RMA: extra candidates one request may carry — the target, shrunk by the allowance,
    never more than the caller has beyond its base count."""
    if eff.baseline_only or available_candidates <= 0:
        return 0
    wanted = int(eff.extra_candidates * min(max(allowance, 0.0), 1.0))
    return min(wanted, available_candidates)


class BudgetBucket:
    """Token bucket for RMA extra work: `rate_per_s` units per second, at most `burst` banked.

    One unit is one extra candidate scored. Grants may be partial: a request takes what is left
    rather than nothing, so the budget is spent on as many requests as it covers.
    """

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate_per_s = 0.0
        self.burst = 0.0
        self._tokens = 0.0
        self._last_ms: int | None = None
        self.set_rate(rate_per_s, burst)
        self._tokens = self.burst

    def set_rate(self, rate_per_s: float, burst: float, now_ms: int | None = None) -> None:
        """Change the rate (new targets) keeping the tokens banked, within the new burst.

        With `now_ms`, tokens earned at the old rate until then are banked first, and the new
        rate accrues from `now_ms` on.
        """
        if not (math.isfinite(rate_per_s) and rate_per_s >= 0.0):
            raise ValueError(f"rate_per_s must be finite and >= 0, got {rate_per_s}")
        if not (math.isfinite(burst) and burst >= 0.0):
            raise ValueError(f"burst must be finite and >= 0, got {burst}")
        if now_ms is not None:
            self.available(now_ms)
        self.rate_per_s, self.burst = rate_per_s, burst
        self._tokens = min(self._tokens, burst)

    def available(self, now_ms: int) -> float:
        """Tokens banked at `now_ms` (time never runs backwards here)."""
        last = self._last_ms
        if last is not None and now_ms > last:
            self._tokens = min(self.burst, self._tokens + self.rate_per_s * (now_ms - last) / 1e3)
        if last is None or now_ms > last:
            self._last_ms = now_ms
        return self._tokens

    def take(self, units: int, now_ms: int) -> int:
        """Grant up to `units` whole units at `now_ms`; returns how many were granted."""
        if units <= 0:
            return 0
        granted = min(units, int(self.available(now_ms)))
        self._tokens -= granted
        return granted

