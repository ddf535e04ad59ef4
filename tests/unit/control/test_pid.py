from __future__ import annotations

import msgspec
import pytest

from streams.control.pid import Pid, PidConfig, PidState


def pid(**overrides: float | None) -> Pid:
    base: dict[str, float | None] = dict(kp=1.0, ki=0.5, kd=0.0, setpoint=100.0,
                                         out_min=0.0, out_max=50.0)
    base.update(overrides)
    return Pid(PidConfig(**base))  # type: ignore[arg-type]


def test_latency_below_setpoint_raises_output_and_above_lowers_it() -> None:
    c = pid()
    up = c.update(80.0, 1.0)      # error = setpoint - measurement = +20
    assert up > 0
    down = c.update(130.0, 1.0)   # error = -30
    assert down < up


def test_components_sum_to_output_when_unclamped() -> None:
    c = pid(kp=0.1, ki=0.1, kd=0.5, out_min=-100.0)
    c.update(90.0, 1.0)
    out = c.update(95.0, 1.0)
    p, i, d = c.components
    assert p == pytest.approx(0.1 * 5.0)
    assert d == pytest.approx(-0.5 * 5.0)
    assert out == pytest.approx(p + i + d)


def test_setpoint_change_does_not_kick_derivative() -> None:
    c = pid(kp=0.0, ki=0.0, kd=10.0, out_min=-1000.0, out_max=1000.0)
    c.update(50.0, 1.0)
    c.setpoint = 500.0
    out = c.update(50.0, 1.0)
    assert c.components[2] == 0.0
    assert out == 0.0


def test_derivative_opposes_measurement_moves() -> None:
    c = pid(kp=0.0, ki=0.0, kd=2.0, out_min=-1000.0, out_max=1000.0)
    c.update(50.0, 1.0)
    c.update(60.0, 2.0)                # measurement rising 5/s
    assert c.components[2] == pytest.approx(-10.0)


def test_integral_is_clamped_to_output_limit() -> None:
    c = pid(kp=0.0, ki=1.0)
    for _ in range(100):
        c.update(0.0, 1.0)             # error +100 forever
    assert c.state.integral == 50.0
    assert c.output == 50.0


def test_no_windup_while_saturated_so_recovery_is_immediate() -> None:
    c = pid(kp=1.0, ki=1.0)
    for _ in range(50):                # error +100 -> p alone saturates the output
        c.update(0.0, 1.0)
    assert c.output == 50.0
    assert c.state.integral == 0.0     # p already pinned the output: nothing integrated
    out = c.update(120.0, 1.0)         # latency now above setpoint
    assert out == 0.0                  # drops at once, no stored-up integral holding it


def test_integral_grows_only_to_the_ceiling_not_past_it() -> None:
    c = pid(kp=0.0, ki=0.5, out_max=10.0)
    c.update(90.0, 1.0)                # +5
    c.update(90.0, 1.0)                # +5 -> 10 (exactly the ceiling)
    c.update(90.0, 1.0)
    assert c.state.integral == 10.0


def test_dynamic_ceiling_limits_integral_too() -> None:
    c = pid(kp=0.0, ki=1.0)
    for _ in range(20):
        c.update(90.0, 1.0, limit_high=5.0)
    assert c.output == 5.0
    assert c.state.integral == 5.0
    assert c.update(90.0, 1.0) == 15.0     # ceiling lifted: grows from 5, not from a hoard


def test_max_step_bounds_each_update() -> None:
    c = pid(kp=1.0, ki=0.0, max_step=3.0)
    outputs = [c.update(60.0, 1.0) for _ in range(5)]   # wants 40
    assert outputs == [3.0, 6.0, 9.0, 12.0, 15.0]


def test_max_step_down_allows_faster_cuts() -> None:
    c = pid(kp=1.0, ki=0.0, max_step=2.0, max_step_down=10.0,
            integral_min=None, integral_max=None)
    c.set_manual(30.0)
    c.set_auto()
    c.update(100.0, 1.0)
    c.update(100.0, 1.0)
    before = c.output
    after = c.update(200.0, 1.0)
    assert before - after == pytest.approx(10.0)


def test_hard_ceiling_beats_step_limit() -> None:
    c = pid(kp=1.0, ki=0.0, max_step=1.0)
    c.set_manual(20.0)
    c.set_auto()
    assert c.update(80.0, 1.0, limit_high=2.0) == 2.0


def test_integration_waits_behind_step_limit() -> None:
    c = pid(kp=0.0, ki=10.0, max_step=1.0)
    c.update(90.0, 1.0)                # wants +100 of integral, the step allows 1
    assert c.output == 1.0
    assert c.state.integral == 1.0


def test_manual_holds_and_auto_resumes_without_bump() -> None:
    c = pid(kp=0.5, ki=0.1)
    c.update(90.0, 1.0)
    c.set_manual(20.0)
    assert c.update(95.0, 1.0) == 20.0
    assert c.update(95.0, 1.0) == 20.0
    c.set_auto()
    out = c.update(95.0, 1.0)
    assert out == pytest.approx(20.0 + 0.1 * 5.0)   # only the new integral step


def test_manual_output_respects_limits() -> None:
    c = pid()
    c.set_manual(500.0)
    assert c.output == 50.0
    assert c.update(90.0, 1.0, limit_high=5.0) == 5.0


def test_limit_lowers_output_and_integral_so_nothing_springs_back() -> None:
    c = pid(kp=0.0, ki=1.0, max_step=5.0)
    for _ in range(10):
        c.update(95.0, 1.0)
    assert c.output == 50.0
    c.limit(0.0)
    assert c.output == 0.0 and c.state.integral == 0.0
    assert c.update(95.0, 1.0) == 5.0


def test_state_round_trip_is_exact() -> None:
    a = pid(kp=0.3, ki=0.07, kd=0.9, max_step=4.0)
    for m in (70.0, 75.5, 81.25, 93.0):
        a.update(m, 0.7)
    state = msgspec.json.decode(msgspec.json.encode(a.state), type=PidState)
    b = Pid(a.config, state)
    for m in (99.1, 104.3, 88.8, 60.0, 120.0):
        assert a.update(m, 1.3) == b.update(m, 1.3)
        assert a.state == b.state


def test_rejects_nonsense_inputs() -> None:
    c = pid()
    with pytest.raises(ValueError, match="measurement"):
        c.update(float("nan"), 1.0)
    with pytest.raises(ValueError, match="dt_s"):
        c.update(1.0, 0.0)
    with pytest.raises(ValueError, match="out_min"):
        PidConfig(out_min=2.0, out_max=1.0)


def test_move_to_continues_from_the_new_output_without_a_bump() -> None:
    pid = Pid(PidConfig(kp=0.5, ki=0.1, setpoint=50.0, out_min=0.0, out_max=100.0))
    pid.update(40.0, 1.0)
    assert pid.move_to(60.0) == 60.0
    assert pid.update(40.0, 1.0) == pytest.approx(60.0 + 0.1 * 10.0)  # only the new integral
    assert pid.move_to(500.0) == 100.0                                 # limits still hold
