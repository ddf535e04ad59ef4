"""The nemesis's schedule: seeded, within the run, and within what the fleet is built for."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from surplus.chaos.schedule import KINDS, Fault, Fleet, Hold, ScheduleConfig, by_kind, draw


def test_same_seed_same_schedule_and_another_seed_another() -> None:
    assert draw(7, 600) == draw(7, 600)
    assert draw(7, 600) != draw(8, 600)


def test_every_kind_is_drawn_over_a_long_run() -> None:
    counts = by_kind(draw(1, 3600))
    assert set(counts) == set(KINDS)
    assert all(n > 0 for n in counts.values()), counts


def test_faults_start_after_warm_up_and_end_before_cool_down() -> None:
    config = ScheduleConfig(warmup_s=30, cooldown_s=40)
    faults = draw(3, 600, config)
    assert faults
    assert all(f.at_s >= 30 and f.end_s <= 560 for f in faults)
    assert list(faults) == sorted(faults, key=lambda f: f.at_s)


def _overlapping(faults: tuple[Fault, ...], resource: str) -> list[tuple[Fault, Fault]]:
    held = [f for f in faults if resource in f.resources()]
    return [(a, b) for i, a in enumerate(held) for b in held[i + 1:]
            if b.at_s < a.end_s]


@pytest.mark.parametrize("seed", range(20))
def test_one_broker_one_baseline_replica_one_fault_a_process_at_a_time(seed: int) -> None:
    faults = draw(seed, 1800, ScheduleConfig(mean_gap_s=2.0))
    for resource in ("broker", "baseline", "control", "worker:b1", "worker:b2", "worker:p1"):
        assert not _overlapping(faults, resource), resource
    # ... yet faults do overlap (combinations are the point).
    assert any(b.at_s < a.end_s for a, b in itertools.pairwise(faults))


def test_baseline_path_is_a_fault_on_a_baseline_replica() -> None:
    assert Fault(1, "worker_freeze", "b2", 1).on_baseline_path
    assert Fault(1, "net_delay", "b1", 1).on_baseline_path
    assert not Fault(1, "worker_kill", "p1", 1).on_baseline_path
    assert Fault(1, "broker_kill", "2", 1).on_baseline_path   # one host: it takes the cores
    assert Fault(1, "broker_pause", "2", 1).on_baseline_path
    assert not Fault(1, "control_kill", "control", 1).on_baseline_path


def test_weights_leave_kinds_out_and_params_are_in_range() -> None:
    config = ScheduleConfig(weights={k: 0.0 for k in KINDS if k != "clock_jump"},
                            max_jump_ms=1000)
    faults = draw(5, 1200, config)
    assert faults and {f.kind for f in faults} == {"clock_jump"}
    assert all(250 <= abs(int(f.param)) <= 1000 for f in faults)
    assert {f.target for f in faults} <= set(Fleet().workers)


def test_no_brokers_no_broker_faults() -> None:
    faults = draw(5, 1800, fleet=Fleet(brokers=0))
    assert not {f.kind for f in faults} & {"broker_kill", "broker_pause"}


@pytest.mark.parametrize(("raw", "names"), [
    ({"mean_gap": 3}, "mean_gap"),
    ({"weights": {"broker_explode": 1.0}}, "broker_explode"),
    ({"weights": {"net_cut": -1.0}}, "weights.net_cut"),
    ({"holds": {"net_cut": {"min_s": 5, "max_s": 1}}}, "min_s"),
    ({"mean_gap_s": 0}, "mean_gap_s"),
])
def test_bad_config_names_the_key(raw: dict[str, object], names: str) -> None:
    with pytest.raises((msgspec.ValidationError, ValueError), match=names):
        msgspec.convert(raw, ScheduleConfig)


def test_hold_bounds() -> None:
    with pytest.raises(ValueError, match="min_s"):
        Hold(-1.0, 2.0)
