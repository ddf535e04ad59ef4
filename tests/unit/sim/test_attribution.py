"""The truth the simulator keeps to judge the measured lift by (``sim.attribution``): labels
on their way in due order, the truth of those joined, and the true lift per lever."""

from __future__ import annotations

import math

import pytest

from sim.attribution import (
    Attribution,
    LabelQueue,
    PendingLabel,
    Truth,
    add_truth,
    normal_from,
    same_order,
    true_lift,
)


def _label(rid: str, truth: Truth | None = None, segment: str = "a") -> PendingLabel:
    return PendingLabel("eu1", rid, 1.0, segment, "baseline", 0, truth)


def test_labels_come_by_when_due_then_in_the_order_sent() -> None:
    queue = LabelQueue()
    for due, rid in ((20.0, "x"), (10.0, "y"), (20.0, "z")):
        queue.send(due, _label(rid))
    assert [(due, label.request_id) for due, label in queue.due_by(20.0)] == [
        (10.0, "y"), (20.0, "x"), (20.0, "z")]   # due by the bound, inclusive
    assert list(queue.due_by(1e9)) == []


def test_only_joined_labels_with_a_truth_count() -> None:
    attribution = Attribution(0)
    attribution.joined(_label("x", Truth(True, 0.5, 2.0)))
    attribution.joined(_label("y"))   # a holdout request's, or a second copy
    assert attribution.truth == {"eu1": {"a": [0.0, 0.0, 1.0, 0.5, 0.0, 0.0, 2.0, 1.0]
                                         + [0.0] * 4}}


def test_the_true_lift_splits_into_what_routing_added_and_the_rest() -> None:
    truth: dict[str, list[float]] = {}
    add_truth(truth, "a", False, 0.1, 2.0)    # baseline arm: extras only
    add_truth(truth, "a", True, 0.4, 2.0)     # powerful arm: gain and extras
    lift = true_lift(truth)
    assert lift["all"] == pytest.approx(0.25)
    assert lift["sbm"] == pytest.approx(0.15)   # one powerful request of two, 0.3 over baseline
    assert lift["rma"] == pytest.approx(0.10)
    assert true_lift({}) == {"all": None, "sbm": None, "rma": None, "precompute": None}


def test_segment_orders_match_when_ranked_alike_ties_in_the_truth_either_way() -> None:
    assert same_order({"a": 0.1, "b": 0.3}, {"a": 0.0, "b": 0.9})
    assert not same_order({"a": 0.1, "b": 0.3}, {"a": 0.9, "b": 0.0})
    assert same_order({"a": 0.2, "b": 0.2}, {"a": 0.9, "b": 0.0})


def test_box_muller_gives_a_standard_normal() -> None:
    assert normal_from(math.exp(-0.5), 0.0) == pytest.approx(1.0)
    assert normal_from(0.0, 0.0) < 40.0   # a zero draw is clamped, not an error


def test_the_true_precompute_lift_is_used_against_withheld_answers_per_segment() -> None:
    truth: dict[str, list[float]] = {}
    add_truth(truth, "a", False, 0.1, 1.0)                # no answer: extras only
    add_truth(truth, "a", False, 0.9, 1.0, "used")        # the answer's worth
    add_truth(truth, "a", False, 0.3, 1.0, "withheld")    # ranked live instead
    lift = true_lift(truth)
    assert lift["precompute"] == pytest.approx((0.9 - 0.3) / 3)
    assert lift["rma"] == pytest.approx((0.1 + 0.9 + 0.3) / 3 - (0.9 - 0.3) / 3)
