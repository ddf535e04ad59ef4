"""Latency sketches: wire round trip, exact merging, and refusal to merge unlike sketches."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.sketch import SketchMerger, SketchMismatch, from_wire, new_sketch, to_wire


def _sketch_of(values: np.ndarray):
    sketch = new_sketch()
    for v in values:
        sketch.add(float(v))
    return sketch


def test_merged_quantiles_match_the_pooled_data_within_relative_accuracy() -> None:
    rng = np.random.default_rng(7)
    parts = [rng.lognormal(mean=m, sigma=0.6, size=2000) for m in (1.0, 2.0, 3.0)]
    merger = SketchMerger()
    for part in parts:
        merger.add(to_wire(_sketch_of(part)))
    pooled = np.concatenate(parts)
    for q in (0.5, 0.9, 0.99):
        exact = float(np.quantile(pooled, q))
        assert merger.quantile(q) == pytest.approx(exact, rel=0.05)
    assert merger.count == pooled.size


def test_wire_round_trip_keeps_quantiles() -> None:
    sketch = _sketch_of(np.linspace(0.5, 500, 1000))
    back = from_wire(to_wire(sketch))
    assert back.count == sketch.count
    assert back.get_quantile_value(0.99) == pytest.approx(sketch.get_quantile_value(0.99),
                                                          rel=1e-6)


def test_merging_sketches_of_different_accuracy_is_refused() -> None:
    merger = SketchMerger(relative_accuracy=0.02)
    other = new_sketch(0.01)
    other.add(3.0)
    with pytest.raises(SketchMismatch, match=r"relative_accuracy 0\.01"):
        merger.add(to_wire(other))


def test_empty_merger_reports_nan_and_zeros_are_counted() -> None:
    merger = SketchMerger()
    assert np.isnan(merger.quantile(0.99))
    sketch = new_sketch()
    sketch.add(0.0)
    sketch.add(0.0)
    sketch.add(10.0)
    merger.add(to_wire(sketch))
    assert merger.quantile(0.5) == 0.0
    assert merger.quantile(1.0) == pytest.approx(10.0, rel=0.03)


def test_hostile_offsets_are_clamped_not_allocated() -> None:
    from schemas.contract import LatencySketch

    merger = SketchMerger()
    merger.add(LatencySketch(relative_accuracy=0.02, offset=99_999, bins=[5], count=5,
                             sum=1.0, min=0.0, max=1e9))
    assert merger.count == 5


def _random_wires(seed: int, n: int = 300):
    from schemas.contract import LatencySketch

    rng = np.random.default_rng(seed)
    wires = [to_wire(_sketch_of(rng.lognormal(mean=rng.uniform(0, 5), sigma=0.8,
                                              size=int(rng.integers(1, 60)))))
             for _ in range(n)]
    # a hostile offset on either side of the tracked range, and an empty sketch
    wires[7] = LatencySketch(relative_accuracy=0.02, offset=99_990, bins=[3, 0, 4], count=7,
                             sum=2.0, min=0.0, max=1e9)
    wires[11] = LatencySketch(relative_accuracy=0.02, offset=-99_999, bins=[2, 2], count=4,
                              sum=0.5, min=0.0, max=0.1)
    wires[13] = LatencySketch(relative_accuracy=0.02, offset=0, bins=[], zero_count=3,
                              count=3, sum=0.0, min=0.0, max=0.0)
    return wires


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_deferred_merge_is_exactly_the_eager_merge(seed: int, monkeypatch) -> None:
    import schemas.sketch as sketch_module

    monkeypatch.setattr(sketch_module, "MAX_DEFERRED", 50)  # settle mid-stream too
    wires = _random_wires(seed)
    eager, deferred = SketchMerger(), SketchMerger()
    for i, wire in enumerate(wires):
        eager.add(wire)
        deferred.defer(wire)
        if i % 97 == 0:
            assert deferred.quantile(0.99) == eager.quantile(0.99)
    for q in (0.0, 0.5, 0.9, 0.99, 1.0):
        assert deferred.quantile(q) == eager.quantile(q)
    assert np.array_equal(deferred._bins, eager._bins)
    assert (deferred.count, deferred.zero_count, deferred.sum, deferred.max) == (
        eager.count, eager.zero_count, eager.sum, eager.max)
    deferred.reset()
    assert deferred.count == 0 and np.isnan(deferred.quantile(0.5))


def test_deferred_merge_refuses_as_add_does_before_changing_anything() -> None:
    from schemas.contract import LatencySketch

    merger = SketchMerger()
    other = new_sketch(0.01)
    other.add(3.0)
    with pytest.raises(SketchMismatch, match=r"relative_accuracy 0\.01"):
        merger.defer(to_wire(other))
    huge = LatencySketch(relative_accuracy=0.02, offset=0, bins=[1, 2**63], count=1, sum=1.0,
                         min=1.0, max=1.0)
    with pytest.raises(Exception) as deferred_error:
        merger.defer(huge)
    with pytest.raises(Exception) as eager_error:
        SketchMerger().add(huge)
    assert type(deferred_error.value) is type(eager_error.value)
    assert merger.count == 0 and np.isnan(merger.quantile(0.5))
