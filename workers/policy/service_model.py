"""How long a worker's forward passes take: the measurement admission predicts queue waits with.

One concept a module, as concurrency-limits keeps its measurements apart (`limit/measurement/`):
`Admission` owns one and feeds it every batch. Pure: no clock, the caller passes the times.
"""

from __future__ import annotations

from collections.abc import Iterable


class ServiceModel:
    """Forward-pass time as ``overhead + units * per_unit``, fitted by exponentially weighted
    least squares over recent batches.

    Batching amortises the per-pass overhead, so an average cost per row measured on small
    batches would overstate how long a long queue takes to drain (and shed optional work under
    no real overload). While batch sizes barely vary the fit falls back to the weighted ratio
    of time to rows, which one slow small batch cannot swing far.
    """

    def __init__(self, initial_ms_per_unit: float, alpha: float) -> None:
        self.per_unit_ms = initial_ms_per_unit
        self.overhead_ms = 0.0
        self._decay = 1.0 - alpha
        self._w = self._sx = self._sy = self._sxx = self._sxy = 0.0

    def add(self, units: int, elapsed_ms: float) -> None:
        d = self._decay
        self._w = d * self._w + 1.0
        self._sx = d * self._sx + units
        self._sy = d * self._sy + elapsed_ms
        self._sxx = d * self._sxx + units * units
        self._sxy = d * self._sxy + units * elapsed_ms
        mean_x, mean_y = self._sx / self._w, self._sy / self._w
        var = self._sxx / self._w - mean_x * mean_x
        slope = (self._sxy / self._w - mean_x * mean_y) / var if var > 0.01 * mean_x ** 2 else -1
        intercept = mean_y - slope * mean_x
        if slope > 0 and intercept >= 0:
            self.per_unit_ms, self.overhead_ms = slope, intercept
        else:
            self.per_unit_ms, self.overhead_ms = mean_y / mean_x, 0.0

    def calibrate(self, passes: Iterable[tuple[int, float]]) -> None:
        """Forward passes timed before serving (the model's warm-up, on the replica's own
        device and CPU slice) as the first batches. Until the first batch is measured the
        fit otherwise predicts with ``initial_ms_per_unit``, a prior that a lent replica in a
        small slice can exceed tenfold: its first requests were admitted as fitting and ended
        at 150-190 ms of a 100 ms deadline."""
        for units, elapsed_ms in passes:
            if units > 0 and elapsed_ms >= 0:
                self.add(units, elapsed_ms)

    def drain_ms(self, units: int, batch_units: int | None) -> float:
        """How long ``units`` take through passes of at most ``batch_units`` each."""
        if units <= 0:
            return 0.0
        passes = -(-units // batch_units) if batch_units else 1
        return passes * self.overhead_ms + units * self.per_unit_ms
