"""`surplus bench fleet`'s pure parts (percentiles, the lag verdict, delays after a window's
close, scope names) and how the CLI sizes the fleet."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from bench.fleet_load import Shape
from bench.fleet_verdicts import (
    after_close_delays,
    consumed_at,
    keeps_up,
    percentile,
    region_names,
    slope,
)
from schemas.topics import scope_partition


def test_percentile_interpolates_between_order_statistics() -> None:
    assert percentile([], 0.99) is None
    assert percentile([3.0], 0.5) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.5) == pytest.approx(2.5)
    assert percentile(list(range(101)), 0.99) == pytest.approx(99.0)
    assert percentile([1.0, 2.0], 1.5) == 2.0


def test_slope_is_the_least_squares_trend() -> None:
    assert slope([]) == 0.0 and slope([(1.0, 5.0), (1.0, 9.0)]) == 0.0
    assert slope([(t, 3.0 * t + 1.0) for t in range(10)]) == pytest.approx(3.0)


def test_a_flat_lag_keeps_up_and_a_growing_one_does_not() -> None:
    flat = [(float(t), 100.0 + (t % 3) * 50) for t in range(30)]
    assert keeps_up(flat, in_rate=1000.0)["keeps_up"] is True
    # takes 90% of a 1,000 messages/s input: the lag grows 100/s
    growing = [(float(t), 100.0 * t) for t in range(30)]
    verdict = keeps_up(growing, in_rate=1000.0)
    assert verdict["keeps_up"] is False and verdict["lag_slope_per_s"] == pytest.approx(100.0)
    # a backlog that drains keeps up once it ends under the bound ...
    draining = [(float(t), max(0.0, 20_000.0 - 1000.0 * t)) for t in range(30)]
    assert keeps_up(draining, in_rate=1000.0)["keeps_up"] is True
    # ... but a flat lag far over it (minutes of input behind) does not
    assert keeps_up([(float(t), 1e6) for t in range(30)], in_rate=1000.0)["keeps_up"] is False
    assert keeps_up(flat[:3], in_rate=1000.0)["keeps_up"] is False


def test_delays_run_from_a_window_close_to_the_first_targets_after_it_was_counted() -> None:
    closes = [1.0, 2.0, 3.0]
    counts = [(1.1, 10.0), (2.4, 20.0), (3.2, 25.0), (3.6, 30.0)]
    assert consumed_at(counts, 20.0) == 2.4 and consumed_at(counts, 31.0) is None
    targets = {"a": [1.5, 2.5, 3.7], "b": [1.05, 3.0]}
    delays, missed = after_close_delays(closes, 10, counts, targets, since_s=0.0, until_s=10.0)
    # a: 1.5-1, 2.5-2, 3.7-3; b: windows 0 and 1 (counted at 1.1 and 2.4) first at 3.0,
    # window 2 (counted at 3.6) never: it missed
    assert sorted(delays) == pytest.approx([0.5, 0.5, 0.7, 1.0, 2.0])
    assert missed == 1
    delays, missed = after_close_delays(closes, 10, counts, targets, since_s=1.5, until_s=2.5)
    assert sorted(delays) == pytest.approx([0.5, 1.0]) and missed == 0


def test_scopes_land_on_partitions_of_their_own_while_there_are_enough() -> None:
    names = region_names(8, 8)
    assert len(set(names)) == 8
    assert {scope_partition(n, 8) for n in names} == set(range(8))
    assert len(set(region_names(6, 3))) == 6


def test_the_events_a_second_a_shape_asks_for() -> None:
    shape = Shape(replicas=100, rps=10_000.0, sample=0.01, regions=4, partitions=4, clients=10)
    assert shape.logged_share == pytest.approx(0.01 + 0.99 * 0.01)
    # a report a replica a second, and a decision record and a label a logged request
    assert shape.events_per_s() == pytest.approx(100 + 2 * 10_000 * shape.logged_share)


def test_the_cli_sizes_the_fleet_and_refuses_sizes_for_other_benchmarks(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import contextlib

    import bench.common
    from surplus import bench_cmd
    from surplus.cli import app

    seen: list[dict[str, Any]] = []

    def fake_run_one(bench: bench_cmd.Bench, bootstrap: str | None,
                     timeout_s: float) -> dict[str, Any]:
        seen.append(bench.kwargs)
        return {"bench": bench.name, "ok": True, "value": 1.0, "meets_target": None,
                "target": "", "seconds": 0.0, "result": {"bench": bench.name}}

    monkeypatch.setattr(bench_cmd, "run_one", fake_run_one)
    monkeypatch.setattr(bench.common, "broker",
                        lambda _: contextlib.nullcontext("127.0.0.1:9"))
    runner = CliRunner()
    result = runner.invoke(app, ["bench", "fleet", "--replicas", "50", "--rps", "700",
                                 "--sample", "0.01", "--processes", "3", "--seconds", "12",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert seen == [{"replicas": 50, "rps": 700.0, "sample": 0.01, "processes": 3,
                     "seconds": 12.0}]
    result = runner.invoke(app, ["bench", "fleet", "--out", str(tmp_path)])
    assert result.exit_code == 0 and seen[-1] == next(
        b.kwargs for b in bench_cmd.BENCHES if b.name == "fleet")
    result = runner.invoke(app, ["bench", "ingest", "--replicas", "5", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "fleet" in result.output
