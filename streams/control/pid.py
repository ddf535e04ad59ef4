"""A PID controller in one file, with time passed in and its whole state restorable.

Sign convention (read this before tuning): ``error = setpoint - measurement``. With latency as
the measurement, error is *positive while latency is below the setpoint*, so positive gains
raise the output (more optional work) when there is room and lower it when latency climbs.

What the plain textbook PID lacks, and why each piece is here:

- Derivative on measurement: ``d = -kd * d(measurement)/dt``, so moving the setpoint does not
  kick the output; only the plant moving does.
- Anti-windup, two ways: the integral is clamped (to ``integral_min/max``, else to the output
  limits in force), and the integral does not grow while the output is already pinned at a
  limit (or held back by the step limit) in the direction the error pushes: it grows only until
  the output meets that limit. Otherwise a long stretch of "room available but capped" would
  store up a burst for later.
- ``max_step`` bounds how far one update may move the output (``max_step_down`` may allow
  faster cuts than raises). Hard limits win over the step limit: if the ceiling drops, the
  output drops with it at once.
- ``limit_high`` lets the caller lower the ceiling for one update (a budget that changes every
  period) without building a new controller.
- Manual mode and bumpless hand-back, and a ``state`` that restores exactly, so a restarted
  control plane continues where it stopped.
"""

from __future__ import annotations

import math

import msgspec


class PidConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Gains, setpoint and limits. Output units are whatever the caller actuates."""

    kp: float = 1.0
    ki: float = 0.0
    kd: float = 0.0
    setpoint: float = 0.0
    out_min: float = 0.0
    out_max: float = 1.0
    max_step: float | None = None
    """Largest change of the output per update (None: unbounded)."""
    max_step_down: float | None = None
    """Largest decrease per update; None means ``max_step`` bounds decreases too."""
    integral_min: float | None = None
    """Lower clamp of the integral term; None: the output lower limit."""
    integral_max: float | None = None
    """Upper clamp of the integral term; None: the output upper limit in force."""

    def __post_init__(self) -> None:
        if self.out_min > self.out_max:
            raise ValueError(f"out_min {self.out_min} exceeds out_max {self.out_max}")
        for name in ("max_step", "max_step_down"):
            step = getattr(self, name)
            if step is not None and not step > 0:
                raise ValueError(f"{name} must be > 0 or None, got {step}")
        lo, hi = self.integral_min, self.integral_max
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"integral_min {lo} exceeds integral_max {hi}")


class PidState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Everything a PID needs to continue exactly after a restart (JSON-encodable)."""

    integral: float = 0.0
    last_measurement: float | None = None
    last_output: float = 0.0
    manual: bool = False


def _clamp(value: float, lo: float, hi: float) -> float:
    return lo if value < lo else hi if value > hi else value


class Pid:
    """``update(measurement, dt_s) -> output``; see the module docstring for the conventions."""

    def __init__(self, config: PidConfig, state: PidState | None = None) -> None:
        self.config = config
        self.setpoint = config.setpoint
        if state is None:
            state = PidState(last_output=_clamp(0.0, config.out_min, config.out_max))
        self._integral = state.integral
        self._last_measurement = state.last_measurement
        self._last_output = state.last_output
        self._manual = state.manual
        self._components = (0.0, 0.0, 0.0)

    # -- the control law -------------------------------------------------------------------

    def update(self, measurement: float, dt_s: float, *, limit_high: float | None = None) -> float:
        """One control step. ``limit_high`` lowers the output ceiling for this step only."""
        if not math.isfinite(measurement):
            raise ValueError(f"measurement must be finite, got {measurement}")
        if not (dt_s > 0 and math.isfinite(dt_s)):
            raise ValueError(f"dt_s must be a positive finite number of seconds, got {dt_s}")
        lo, hi = self._limits(limit_high)
        if self._manual:
            self._last_measurement = measurement
            self._last_output = _clamp(self._last_output, lo, hi)
            return self._last_output
        cfg = self.config
        error = self.setpoint - measurement
        p = cfg.kp * error
        d = 0.0
        if cfg.kd and self._last_measurement is not None:
            d = -cfg.kd * (measurement - self._last_measurement) / dt_s
        i_lo, i_hi = self._integral_limits(lo, hi)
        held = _clamp(self._integral, i_lo, i_hi)
        grown = _clamp(held + cfg.ki * error * dt_s, i_lo, i_hi)
        integral = grown
        if error > 0:  # grow only until the output meets its ceiling, never past it
            integral = min(grown, max(held, min(hi, self._step_ceiling()) - p - d))
        elif error < 0:
            integral = max(grown, min(held, max(lo, self._step_floor()) - p - d))
        raw = p + integral + d
        output = _clamp(_clamp(raw, self._step_floor(), self._step_ceiling()), lo, hi)
        self._integral = integral
        self._last_measurement = measurement
        self._last_output = output
        self._components = (p, integral, d)
        return output

    def _limits(self, limit_high: float | None) -> tuple[float, float]:
        lo, hi = self.config.out_min, self.config.out_max
        if limit_high is not None:
            hi = max(lo, min(hi, limit_high))
        return lo, hi

    def _integral_limits(self, lo: float, hi: float) -> tuple[float, float]:
        cfg = self.config
        i_lo = lo if cfg.integral_min is None else cfg.integral_min
        i_hi = hi if cfg.integral_max is None else min(cfg.integral_max, hi)
        return i_lo, max(i_lo, i_hi)

    def _step_ceiling(self) -> float:
        step = self.config.max_step
        return math.inf if step is None else self._last_output + step

    def _step_floor(self) -> float:
        step = self.config.max_step_down
        if step is None:
            step = self.config.max_step
        return -math.inf if step is None else self._last_output - step

    # -- operator and fast-path hooks --------------------------------------------------------

    def set_manual(self, output: float) -> None:
        """Hold ``output`` (clamped to the limits) until ``set_auto``; updates track the plant."""
        self._manual = True
        self._last_output = _clamp(output, self.config.out_min, self.config.out_max)
        self._components = (0.0, 0.0, 0.0)

    def set_auto(self) -> None:
        """Resume control from the held output without a bump.

        The integral is set so that, at the last measurement seen, ``p + i`` equals the held
        output; the next update then moves only by the new error's integral and derivative.
        """
        if not self._manual:
            return
        self._manual = False
        self.move_to(self._last_output)

    def move_to(self, output: float) -> float:
        """Set the output (clamped to the limits) and carry on from it without a bump: the
        integral is set so that, at the last measurement seen, ``p + i`` equals it."""
        cfg = self.config
        self._last_output = _clamp(output, cfg.out_min, cfg.out_max)
        p = 0.0
        if self._last_measurement is not None:
            p = cfg.kp * (self.setpoint - self._last_measurement)
        lo, hi = self._integral_limits(cfg.out_min, cfg.out_max)
        self._integral = _clamp(self._last_output - p, lo, hi)
        return self._last_output

    def limit(self, high: float) -> float:
        """Lower the held output to at most ``high`` now (preemption fast path).

        The integral comes down with it, so the next update ramps from the lowered output
        instead of springing back to where it was before the capacity went away.
        """
        high = max(self.config.out_min, high)
        self._last_output = min(self._last_output, high)
        self._integral = min(self._integral, high)
        return self._last_output

    def reset(self) -> None:
        """Forget history; the output returns to the lower limit."""
        self._integral = 0.0
        self._last_measurement = None
        self._last_output = _clamp(0.0, self.config.out_min, self.config.out_max)
        self._manual = False
        self._components = (0.0, 0.0, 0.0)

    # -- inspection ------------------------------------------------------------------------

    @property
    def output(self) -> float:
        return self._last_output

    @property
    def manual(self) -> bool:
        return self._manual

    @property
    def components(self) -> tuple[float, float, float]:
        """(p, i, d) of the last automatic update, for telemetry."""
        return self._components

    @property
    def state(self) -> PidState:
        return PidState(integral=self._integral, last_measurement=self._last_measurement,
                        last_output=self._last_output, manual=self._manual)
