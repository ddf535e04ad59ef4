"""A scaled-out scope replays to the targets of one reader: the same log through 1, 2 and 4
first-stage shards gives byte-identical targets, windows (as written, 9 significant digits)
and estimates. The windows' float sums (utilisation, busy seconds, capacity, the sketch's
sum) are added in another order when shards split a pool's replicas, so in memory they are
equal to within 1e-12 relative; the counts and every sketch bin, hence every quantile, are
exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.replay import generate_log
from streams.control.config import ControlConfig
from streams.control.windows import WindowStats
from streams.eventlog import read_events
from streams.replay import ControlDriver, replay_offline

FLOATS = ("p50_ms", "p99_ms", "request_rate", "baseline_rate", "optional_done_rate",
          "shed_rate", "utilisation", "capacity_rps", "busy_s", "units_rate",
          "overload_shed_rate")


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shards") / "log.jsonl.zst"
    generate_log(path, workers=60, seconds=120, regions=2)
    return path


def _windows(log: Path, shards: int) -> list[WindowStats]:
    seen: list[WindowStats] = []
    driver = ControlDriver(ControlConfig(), shards=shards,
                           on_tick=lambda ms, c: seen.extend(c.last_windows))
    driver.run(read_events(log))
    return seen


@pytest.mark.parametrize("shards", [1, 2, 4])
def test_shards_replay_to_the_targets_of_one_reader(log: Path, tmp_path: Path,
                                                    shards: int) -> None:
    one = replay_offline(log, ControlConfig(), tmp_path / "one")
    split = replay_offline(log, ControlConfig(), tmp_path / "split", shards=shards)
    assert split["shards"] == shards and split["rejected"] == one["rejected"] == {}
    for name in ("targets.csv", "windows.csv", "estimates.json"):
        assert (tmp_path / "split" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    assert split["scopes"] == one["scopes"]


def test_split_windows_equal_one_readers_within_float_order(log: Path) -> None:
    one, split = _windows(log, 0), _windows(log, 3)
    assert len(one) == len(split) > 40
    for a, b in zip(one, split, strict=True):
        assert (a.pool_id, a.end_ms, a.reports, a.samples, a.units_done) == (
            b.pool_id, b.end_ms, b.reports, b.samples, b.units_done)
        for field in FLOATS:
            assert getattr(b, field) == pytest.approx(getattr(a, field), rel=1e-12), field


def test_a_report_keyed_by_its_replica_is_taken_by_the_shards_only(log: Path) -> None:
    from schemas.contract import WindowReport
    from streams.eventlog import make_event

    events = list(read_events(log))
    first = next(e for e in events if isinstance(e.value, WindowReport))
    rekeyed = [make_event(first.ts, "telemetry", first.value.worker_id, first.value)]
    single, sharded = ControlDriver(ControlConfig()), ControlDriver(ControlConfig(), shards=2)
    single.run(rekeyed)
    sharded.run(rekeyed)
    assert single.rejected == {"key_mismatch": 1} and sharded.rejected == {}
