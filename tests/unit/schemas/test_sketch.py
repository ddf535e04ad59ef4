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


def test_add_many_gives_the_sums_of_one_add_each() -> None:
    from schemas.contract import LatencySketch

    rng = np.random.default_rng(3)
    wires = [to_wire(_sketch_of(rng.lognormal(mean=m, sigma=0.5, size=50)))
             for m in np.linspace(0.5, 4.0, 30)]
    wires.append(LatencySketch(relative_accuracy=0.02, offset=99_999, bins=[5, 1], count=6,
                               sum=1.0, min=0.0, max=1e9))  # clamped past the top
    wires.append(LatencySketch(relative_accuracy=0.02, offset=-99_999, bins=[2], count=2,
                               sum=0.5, min=0.0, max=0.1))  # clamped past the bottom
    wires.append(LatencySketch(relative_accuracy=0.02, offset=0, bins=[], zero_count=4,
                               count=4, sum=0.0, min=0.0, max=0.0))
    one_by_one, at_once = SketchMerger(), SketchMerger()
    for wire in wires:
        one_by_one.add(wire)
    at_once.add_many(wires[:10])
    at_once.add_many(wires[10:])
    at_once.add_many([])
    assert np.array_equal(one_by_one._bins, at_once._bins)
    assert (one_by_one.count, one_by_one.zero_count, one_by_one.sum, one_by_one.max) == (
        at_once.count, at_once.zero_count, at_once.sum, at_once.max)


def test_add_many_refuses_unlike_sketches_before_merging_any() -> None:
    merger = SketchMerger(relative_accuracy=0.02)
    like, other = new_sketch(0.02), new_sketch(0.01)
    like.add(3.0)
    other.add(3.0)
    with pytest.raises(SketchMismatch, match=r"relative_accuracy 0\.01"):
        merger.add_many([to_wire(like), to_wire(other)])
    assert merger.count == 0 and not merger._bins.any()
