"""The precompute lever's measured lift: visits that used an answer against those whose answer
the answer holdout withheld, segment by segment, and the rest of the lift left to RMA."""

from __future__ import annotations

import numpy as np
import pytest
from msgspec import UNSET

from schemas.contract import ANSWER_VERSION, SUPPLY_VERSION, AnswerUse, RoutingOutcome
from streams.control.config import LabelsConfig, SbmConfig
from streams.control.offpolicy import GainEstimator
from workers.policy.holdout import in_holdout, withholds_answer

#: What an answer adds to a visit, and the share of visits that hold one.
ANSWER_GAIN, HIT_SHARE, WITHHELD = 0.3, 0.5, 0.2


def _record(i: int, segment: str, value: float, *, holdout: bool = False,
            answer: AnswerUse | None = None) -> RoutingOutcome:
    return RoutingOutcome(v=SUPPLY_VERSION if answer is None else ANSWER_VERSION, ts_ms=0,
                          scope="eu1", request_id=f"r{i}", segment=segment, model="baseline",
                          holdout=holdout, value=value,
                          answer=UNSET if answer is None else answer)


def _world(n: int, seed: int) -> tuple[GainEstimator, float]:
    """``n`` joined requests: segment b is worth 1 more; visits with an answer belong to users
    worth 0.5 more (the bias a naive comparison would credit to the lever); optional work
    adds 0.1, a used answer ``ANSWER_GAIN``. Returns the estimator and the true precompute
    lift per treated request."""
    rng = np.random.default_rng(seed)
    est = GainEstimator(SbmConfig(), LabelsConfig(min_labels=20))
    used = treated = 0
    for i in range(n):
        segment = "b" if rng.random() < 0.4 else "a"
        holdout = bool(rng.random() < 0.1)
        value = (1.0 if segment == "b" else 0.0) + rng.normal(0.0, 0.3)
        answer: AnswerUse | None = None
        if not holdout:
            treated += 1
            value += 0.1
            if rng.random() < HIT_SHARE:
                value += 0.5
                answer = "withheld" if rng.random() < WITHHELD else "used"
                if answer == "used":
                    used += 1
                    value += ANSWER_GAIN
        est.observe(_record(i, segment, value, holdout=holdout, answer=answer))
    return est, ANSWER_GAIN * used / treated


def test_the_precompute_lift_compares_used_with_withheld_answers_not_with_other_visits() -> None:
    est, true_lift = _world(6000, 1)
    lift = est.lift()
    per_hit = lift["precompute_per_hit"]
    assert per_hit.ci_low is not None and per_hit.ci_high is not None
    assert per_hit.ci_low <= ANSWER_GAIN <= per_hit.ci_high, per_hit
    pre = lift["precompute"]
    assert pre.measured == pytest.approx(true_lift, abs=0.03)


def test_rma_keeps_what_the_answers_did_not_pay() -> None:
    est, _ = _world(6000, 2)
    lift = est.lift()
    all_, sbm, pre, rma = (lift[k].measured for k in ("all", "sbm", "precompute", "rma"))
    assert None not in (all_, sbm, pre, rma)
    assert rma == pytest.approx(all_ - sbm - pre)   # type: ignore[operator]
    # Optional work's 0.1 is RMA's here; the answers' users' own worth (0.5 a visit with
    # one) is in the lift against the request holdout too, and stays with it.
    assert rma < all_   # type: ignore[operator]


def test_a_scope_without_answers_reports_no_precompute_lift() -> None:
    est = GainEstimator(SbmConfig(), LabelsConfig(min_labels=5))
    for i in range(200):
        est.observe(_record(i, "a", 1.0 + 0.01 * (i % 7), holdout=i % 10 == 0))
    assert "precompute" not in est.lift() and "precompute_per_hit" not in est.lift()


def test_the_answer_lift_survives_a_snapshot() -> None:
    est, _ = _world(2000, 3)
    again = GainEstimator(SbmConfig(), LabelsConfig(min_labels=20), est.state)
    assert again.lift()["precompute"] == est.lift()["precompute"]


def test_an_answer_is_a_v12_field() -> None:
    with pytest.raises(ValueError, match="`answer` is a v12 field"):
        RoutingOutcome(v=SUPPLY_VERSION, ts_ms=0, scope="eu1", request_id="r", segment="a",
                       model="baseline", answer="used")


def test_the_answer_holdout_draws_apart_from_the_request_holdout() -> None:
    ids = [f"r{i}" for i in range(20_000)]
    withheld = [withholds_answer(r, 0.1) for r in ids]
    held_out = [in_holdout(r, 0.1) for r in ids]
    assert sum(withheld) / len(ids) == pytest.approx(0.1, abs=0.01)
    both = sum(w and h for w, h in zip(withheld, held_out, strict=True))
    assert both / len(ids) == pytest.approx(0.01, abs=0.004)   # independent draws
    assert not any(withholds_answer(r, 0.0) for r in ids[:100])


def test_rma_is_not_measured_while_the_answers_share_is_not() -> None:
    est = GainEstimator(SbmConfig(), LabelsConfig(min_labels=20))
    for i in range(400):   # answers used, none withheld yet: what they pay is unknown
        est.observe(_record(i, "a", 1.0 + 0.1 * (i % 3), holdout=i % 8 == 0,
                            answer=None if i % 8 == 0 else "used"))
    lift = est.lift()
    assert lift["all"].measured is not None and lift["precompute"].measured is None
    assert lift["rma"].measured is None and lift["rma_per_extra"].measured is None
