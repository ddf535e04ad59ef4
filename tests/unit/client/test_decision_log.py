"""What the client logs of a request (``workers.client.decision_log``): a fallback logs the arm
that served it and no extras, a sampled record its inclusion, and a label goes out only when
its decision record did (a holdout request's always)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from msgspec import UNSET

from schemas.contract import ANSWER_VERSION, SAMPLED_VERSION, SUPPLY_VERSION
from workers.client.config import ClientConfig
from workers.client.decision import Decision
from workers.client.decision_log import decision_record, label_logged
from workers.policy.holdout import in_holdout
from workers.policy.sampling import decision_inclusion

REQUEST: Any = SimpleNamespace(request_id="r1", segment="s")
POWERFUL = Decision("powerful", True, 3, "ok", 0.25)


def _config(rate: float = 1.0) -> ClientConfig:
    return ClientConfig(scope="eu1", baseline_urls=["http://b.invalid"], decision_sample=rate,
                        holdout_fraction=0.05)


def test_a_served_request_logs_its_arm_extras_and_exploration() -> None:
    response: Any = SimpleNamespace(model="powerful", optional_scored=2)
    record = decision_record(_config(), REQUEST, response, POWERFUL, None, 0.5, 4, 1.0, 7)
    assert (record.v, record.ts_ms, record.model, record.extra, record.available) == (
        SUPPLY_VERSION, 7, "powerful", 2, 4)
    assert record.explored and record.propensity == 0.25 and record.inclusion is UNSET


def test_a_fallback_logs_the_baseline_arm_with_no_extras_nor_exploration() -> None:
    response: Any = SimpleNamespace(model="baseline", optional_scored=0)
    record = decision_record(_config(), REQUEST, response, POWERFUL, "timeout", None, 4,
                             1.0, 7)
    assert record.model == "baseline" and record.extra == 0 and not record.explored
    assert record.propensity == 0.75


def test_a_sampled_record_carries_its_inclusion() -> None:
    response: Any = SimpleNamespace(model="baseline", optional_scored=1)
    record = decision_record(_config(0.1), REQUEST, response, POWERFUL, None, None, 4, 0.1, 7)
    assert record.v == SAMPLED_VERSION and record.inclusion == 0.1


def test_a_label_is_logged_only_with_its_decision() -> None:
    assert label_logged(_config(), "anything")
    config = _config(0.1)
    ids = [f"r{i}" for i in range(500)]
    assert [r for r in ids if label_logged(config, r)] == [
        r for r in ids if decision_inclusion(r, 0.1, in_holdout(r, 0.05)) is not None]
    assert any(in_holdout(r, 0.05) and decision_inclusion(r, 0.1, False) is None for r in ids)


def test_a_record_says_what_became_of_the_answer_its_request_held() -> None:
    response: Any = SimpleNamespace(model="baseline", optional_scored=0)
    used = decision_record(_config(), REQUEST, response, POWERFUL, None, None, 0, 1.0, 7,
                           "used")
    withheld = decision_record(_config(0.1), REQUEST, response, POWERFUL, None, None, 4, 0.1,
                               7, "withheld")
    assert (used.v, used.answer) == (ANSWER_VERSION, "used")
    assert (withheld.v, withheld.answer, withheld.inclusion) == (ANSWER_VERSION, "withheld",
                                                                 0.1)
    none = decision_record(_config(), REQUEST, response, POWERFUL, None, None, 4, 1.0, 7)
    assert none.answer is UNSET and none.v == SUPPLY_VERSION
