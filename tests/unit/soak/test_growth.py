"""The soak's verdict: what grew after the warm-up fails, naming the process and the measure."""

from __future__ import annotations

from surplus.soak import growth
from surplus.soak.growth import Windows

SPAN = Windows(warmup_s=60.0, end_s=600.0, window_s=60.0)


def _flat(value: float, every_s: float = 5.0, until_s: float = 600.0) -> list[tuple[float, float]]:
    return [(t * every_s, value) for t in range(int(until_s / every_s) + 1)]


def test_flat_measures_pass_and_report_start_end_and_growth() -> None:
    [v] = growth.judge({"loadgen": {"fds": _flat(20)}}, {"loadgen": ["fds"]}, SPAN, 0.10, {})
    assert (v.start, v.end, v.growth, v.ok) == (20, 20, 1.0, True)
    assert v.samples == 109  # from the warm-up on


def test_growth_past_the_bound_fails_naming_process_and_measure() -> None:
    rising = [(t, 100.0 + t / 10) for t, _ in _flat(0)]  # +54 MiB over the judged stretch
    verdicts = growth.judge({"worker-0": {"rss_mib": rising}}, {"worker-0": ["rss_mib"]}, SPAN,
                            0.10, {})
    assert not verdicts[0].ok and verdicts[0].growth is not None and verdicts[0].growth > 1.1
    [line] = growth.failures(verdicts)
    assert line.startswith("worker-0 rss_mib: grew 1.")


def test_the_warm_up_is_not_judged() -> None:
    # threads climb while the process starts, then hold
    climbing = [(t, min(30.0, 10.0 + t)) for t, _ in _flat(0)]
    [v] = growth.judge({"cp": {"threads": climbing}}, {"cp": ["threads"]}, SPAN, 0.10, {})
    assert v.ok and v.start == v.end == 30.0


def test_busy_samples_in_a_window_do_not_decide_a_count() -> None:
    points = _flat(20)
    for i in (-2, -4, -6):  # bursts of connections near the end
        points[i] = (points[i][0], 40.0)
    [v] = growth.judge({"loadgen": {"fds": points}}, {"loadgen": ["fds"]}, SPAN, 0.10, {})
    assert v.ok and v.end == 20


def test_a_count_that_wanders_is_judged_by_its_lowest() -> None:
    # fds of 25 to 28 under a steady load, more often high at the end: still no leak
    wandering = [(t, 25.0 + (i * 7) % 4 + (2 if t > 540 and i % 2 else 0))
                 for i, (t, _) in enumerate(_flat(0))]
    [v] = growth.judge({"loadgen": {"fds": wandering}}, {"loadgen": ["fds"]}, SPAN, 0.10, {})
    assert v.ok and (v.start, v.end) == (25.0, 25.0)


def test_a_leaked_handle_raises_the_lowest_count_and_fails() -> None:
    leaking = [(t, 20.0 + t // 60) for t, _ in _flat(0)]  # one more fd never closed a minute
    [v] = growth.judge({"w": {"fds": leaking}}, {"w": ["fds"]}, SPAN, 0.10, {})
    assert not v.ok and (v.start, v.end) == (21.0, 29.0)


def test_a_count_a_few_handles_higher_is_a_settled_pool_not_a_leak() -> None:
    settled = [(t, 29.0 if t < 120 else 32.0) for t, _ in _flat(0)]
    [v] = growth.judge({"w": {"fds": settled}}, {"w": ["fds"]}, SPAN, 0.10, {})
    assert v.ok and v.growth is not None and v.growth > 1.10


def test_a_pool_that_steps_up_at_a_burst_and_stays_level_is_not_a_leak() -> None:
    # the load generator in a 2.5 min soak: 33 fds, then 38 from a burst on, level after it
    stepped = [(t, 33.0 if t < 300 else 38.0) for t, _ in _flat(0)]
    [v] = growth.judge({"loadgen": {"fds": stepped}}, {"loadgen": ["fds"]}, SPAN, 0.10, {})
    assert v.ok and (v.start, v.end) == (33.0, 38.0)


def test_rss_is_judged_by_its_mean() -> None:
    points = _flat(100.0)
    points[-2] = (points[-2][0], 140.0)  # garbage not yet collected at one sample
    [v] = growth.judge({"w": {"rss_mib": points}}, {"w": ["rss_mib"]}, SPAN, 0.10, {})
    assert v.ok and v.end == 103.077


def test_a_measure_near_zero_is_judged_from_its_floor() -> None:
    lag = [(t, 0.0 if t < 300 else 60.0) for t, _ in _flat(0)]
    [v] = growth.judge({"cp": {"consumer_lag": lag}}, {"cp": ["consumer_lag"]}, SPAN, 0.10,
                       {"consumer_lag": 100.0})
    assert v.ok and v.growth == 0.6
    lag = [(t, 0.0 if t < 300 else 500.0) for t, _ in _flat(0)]
    [v] = growth.judge({"cp": {"consumer_lag": lag}}, {"cp": ["consumer_lag"]}, SPAN, 0.10,
                       {"consumer_lag": 100.0})
    assert not v.ok and v.growth == 5.0 and "at least 100" in v.why


def test_growth_from_zero_without_a_floor_fails() -> None:
    points = [(t, 0.0 if t < 300 else 3.0) for t, _ in _flat(0)]
    [v] = growth.judge({"w": {"consumer_lag": points}}, {"w": ["consumer_lag"]}, SPAN, 0.10, {})
    assert not v.ok and v.growth is None and v.why == "grew from 0 to 3"


def test_a_process_or_measure_never_sampled_fails() -> None:
    verdicts = growth.judge({"w": {"fds": _flat(9, until_s=30)}},
                            {"w": ["fds", "threads"], "broker": ["rss_mib"]}, SPAN, 0.10, {})
    assert [(v.process, v.measure, v.ok, v.why) for v in verdicts] == [
        ("w", "fds", False, "no samples after the warm-up"),
        ("w", "threads", False, "no samples after the warm-up"),
        ("broker", "rss_mib", False, "no samples after the warm-up")]


def test_a_process_gone_before_the_end_fails() -> None:
    [v] = growth.judge({"w": {"fds": _flat(9, until_s=200)}}, {"w": ["fds"]}, SPAN, 0.10, {})
    assert not v.ok and v.why == "no samples at the end"


def test_windows_take_a_quarter_of_the_judged_stretch_and_at_least_three_samples() -> None:
    assert growth.windows(1800, 300, 5) == Windows(300, 1800, 375.0)
    assert growth.windows(150, 60, 2) == Windows(60, 150, 22.5)
    assert growth.windows(80, 60, 5) == Windows(60, 80, 15.0)
    assert Windows(60, 150, 22.5).end == (127.5, 150)
