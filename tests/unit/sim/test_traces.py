"""Scenario inputs: arrival traces (the Azure trace included), capacity shapes, outages."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest

from sim.scenario import (
    ArrivalsConfig,
    CapacityConfig,
    ReclaimsConfig,
    ScenarioError,
    StormConfig,
)
from sim.traces import arrival_counts, capacity_shape, lendable, outages, parse_times_s

REPO = Path(__file__).resolve().parents[3]
AZURE = "data/AzureLLMInferenceTrace_conv.csv"   # Azure LLM inference trace 2023, CC BY 4.0


def _rng() -> np.random.Generator:
    return np.random.default_rng(1)


def test_azure_trace_drives_arrivals_at_its_own_rate_exactly() -> None:
    """At the trace's native rate every request of the trace arrives, in its own second."""
    lines = (REPO / AZURE).read_text().splitlines()[1:]
    times = parse_times_s([line.split(",")[0] for line in lines], "%Y-%m-%d %H:%M:%S.%f",
                          REPO / AZURE)
    span_s = float(times.max() - times.min()) + 0.1
    cfg = ArrivalsConfig(kind="trace", path=AZURE, mean_rps=len(lines) / span_s)
    counts = arrival_counts(cfg, steps=int(span_s * 10), step_ms=100, base=REPO, rng=_rng())
    assert abs(int(counts.sum()) - len(lines)) <= 1
    per_s = counts[:len(counts) // 10 * 10].reshape(-1, 10).sum(axis=1)
    recorded = np.bincount((times - times.min()).astype(np.int64))[:len(per_s)]
    assert np.abs(np.cumsum(per_s) - np.cumsum(recorded)).max() <= 1


def test_a_scaled_trace_spreads_each_seconds_copies_over_its_steps() -> None:
    """Scaled 36x, the copies of one recorded request do not arrive in one 100 ms step."""
    cfg = ArrivalsConfig(kind="trace", path=AZURE, mean_rps=200.0)
    counts = arrival_counts(cfg, steps=6000, step_ms=100, base=REPO, rng=_rng())
    per_s = counts.reshape(-1, 10)
    assert (per_s.max(axis=1) - per_s.min(axis=1)).max() <= 1
    assert per_s.sum(axis=1).max() > 2 * per_s.sum(axis=1).mean()   # the bursts stay


def test_a_trace_binned_at_the_step_keeps_each_request_in_its_step() -> None:
    lines = (REPO / AZURE).read_text().splitlines()[1:]
    cfg = ArrivalsConfig(kind="trace", path=AZURE, mean_rps=200.0, bin_s=0.1)
    counts = arrival_counts(cfg, steps=6000, step_ms=100, base=REPO, rng=_rng())
    assert len(lines) > 1000 and (counts == 0).mean() > 0.5   # clumps of copies, gaps between


def test_azure_trace_scales_to_the_target_mean_rate_and_keeps_its_shape() -> None:
    base = arrival_counts(ArrivalsConfig(kind="trace", path=AZURE, mean_rps=5.0), 3600, 1000,
                          REPO, _rng())
    scaled = arrival_counts(ArrivalsConfig(kind="trace", path=AZURE, mean_rps=200.0), 3600,
                            1000, REPO, _rng())
    assert scaled.sum() / 3600 == pytest.approx(200.0, rel=0.05)
    assert np.corrcoef(base, scaled)[0, 1] > 0.95


def test_trace_with_offset_and_repeat_covers_a_longer_scenario() -> None:
    cfg = ArrivalsConfig(kind="trace", path=AZURE, mean_rps=50.0, offset_s=1800.0)
    counts = arrival_counts(cfg, steps=7200, step_ms=1000, base=REPO, rng=_rng())
    assert len(counts) == 7200 and counts[3600:].sum() > 0


def test_rates_csv_is_held_between_rows_and_scaled(tmp_path: Path) -> None:
    (tmp_path / "rates.csv").write_text("t,rate\n0,10\n60,30\n120,10\n")
    cfg = ArrivalsConfig(kind="rates", path="rates.csv", time_column="t", time_format="s",
                         rate_column="rate", mean_rps=100.0)
    counts = arrival_counts(cfg, steps=180, step_ms=1000, base=tmp_path, rng=_rng())
    assert counts[60:120].mean() > 2 * counts[:60].mean()
    assert counts.mean() == pytest.approx(100.0, rel=0.05)


def test_missing_column_names_itself(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("when\n1\n2\n")
    cfg = ArrivalsConfig(kind="trace", path="t.csv", time_column="ts", time_format="s")
    with pytest.raises(ScenarioError, match="no column 'ts'"):
        arrival_counts(cfg, 10, 100, tmp_path, _rng())


def test_diurnal_arrivals_peak_where_asked() -> None:
    cfg = ArrivalsConfig(kind="diurnal", mean_rps=20.0, peak_to_trough=3.0, period_s=86_400.0,
                         peak_at_s=50_400.0)
    counts = arrival_counts(cfg, steps=24 * 60, step_ms=60_000, base=REPO, rng=_rng())
    hourly = counts.reshape(24, 60).sum(axis=1)
    assert int(np.argmax(hourly)) in (13, 14) and int(np.argmin(hourly)) in (1, 2)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_onoff_bursts_peak_at_20_to_30_times_the_mean_over_one_second(seed: int) -> None:
    cfg = ArrivalsConfig(kind="onoff", mean_rps=40.0, peak_to_mean=25.0, on_min_s=1.0,
                         on_max_s=5.0, off_min_s=30.0, pareto_shape=1.5)
    hours = 4
    counts = arrival_counts(cfg, steps=hours * 36_000, step_ms=100, base=REPO,
                            rng=np.random.default_rng(seed))
    per_s = counts.reshape(-1, 10).sum(axis=1)
    assert per_s.mean() == pytest.approx(40.0, rel=0.2)  # heavy tails: a noisy mean
    assert 20.0 <= per_s.max() / per_s.mean() <= 30.0
    assert np.median(per_s) < 0.5 * per_s.mean()  # quiet most of the time, mass in bursts
    bursts = per_s > 10 * per_s.mean()
    assert 20 * hours <= int(np.sum(bursts[1:] & ~bursts[:-1])) <= 100 * hours
    again = arrival_counts(cfg, steps=hours * 36_000, step_ms=100, base=REPO,
                           rng=np.random.default_rng(seed))
    assert np.array_equal(counts, again)  # seeded
    shorter = arrival_counts(cfg, steps=1_200, step_ms=100, base=REPO,
                             rng=np.random.default_rng(seed))
    assert np.array_equal(shorter, counts[:1_200])  # a short run sees the same start


def test_onoff_bursts_that_would_carry_more_than_the_mean_are_refused() -> None:
    cfg = ArrivalsConfig(kind="onoff", mean_rps=40.0, peak_to_mean=30.0, on_min_s=5.0,
                         on_max_s=60.0, off_min_s=10.0)
    with pytest.raises(ScenarioError, match="peak_to_mean"):
        arrival_counts(cfg, 100, 100, REPO, _rng())


def test_onoff_lengths_are_validated_by_name() -> None:
    with pytest.raises(msgspec.ValidationError, match="on_max_s"):
        msgspec.convert({"kind": "onoff", "on_min_s": 2.0, "on_max_s": 1.0}, ArrivalsConfig)


def test_capacity_csv_filters_rows_by_region_and_accelerator(tmp_path: Path) -> None:
    (tmp_path / "cap.csv").write_text(
        "time,region,accelerator,units\n0,eu1,l4,4\n0,us1,l4,9\n0,eu1,a100,7\n10,eu1,l4,1\n")
    cfg = CapacityConfig(kind="csv", path="cap.csv")
    shape = capacity_shape(cfg, 20, 1000, tmp_path, region="eu1", accelerator="l4")
    assert shape[:10].tolist() == [4] * 10 and shape[10:].tolist() == [1] * 10
    (tmp_path / "plain.csv").write_text("time,units\n0,2\n5,3\n")
    plain = capacity_shape(CapacityConfig(kind="csv", path="plain.csv"), 10, 1000, tmp_path,
                           region="any", accelerator="any")
    assert plain.tolist() == [2] * 5 + [3] * 5


def test_steps_and_diurnal_capacity_shapes() -> None:
    steps = capacity_shape(CapacityConfig(kind="steps", replicas=3, steps=[(5.0, 1)]), 10, 1000,
                           REPO, region="r", accelerator="a")
    assert steps.tolist() == [3] * 5 + [1] * 5
    day = capacity_shape(CapacityConfig(kind="diurnal", min_replicas=1, max_replicas=5,
                                        peak_at_s=0.0), 1440, 60_000, REPO, region="r",
                         accelerator="a")
    assert day[0] == 5 and day[720] == 1


def test_storms_and_reclaims_take_their_share_for_their_time() -> None:
    cfg = CapacityConfig(kind="constant", replicas=4,
                         random_reclaims=ReclaimsConfig(rate_per_hour=0.0))
    storm = StormConfig(at_s=10.0, share=1.0, notice_s=1.0, return_after_s=5.0,
                        models=["powerful"])
    found = outages(cfg, [storm], 60_000, region="eu1", model="powerful", rng=_rng())
    assert [(o.start_ms, o.end_ms, o.notice_ms) for o in found] == [(10_000, 15_000, 1000)]
    assert outages(cfg, [storm], 60_000, region="eu1", model="baseline", rng=_rng()) == []
    lent = lendable(np.full(20, 4), found, 1000)
    assert lent.tolist() == [4] * 10 + [0] * 5 + [4] * 5
    reclaims = CapacityConfig(kind="constant", replicas=4, random_reclaims=ReclaimsConfig(
        rate_per_hour=60.0, share=0.5, notice_s=30.0, return_after_s=60.0))
    random = outages(reclaims, [], 3_600_000, region="eu1", model="baseline", rng=_rng())
    assert 30 < len(random) < 100 and all(o.share == 0.5 for o in random)
