"""A scope's evidence of value (``streams.control.evidence``): decisions joined with their
labels feed the estimates; what never joins is counted and feeds nothing."""

from __future__ import annotations

import msgspec

from schemas.contract import OutcomeLabel
from streams.control.config import ControlConfig
from streams.control.evidence import ValueEvidence
from streams.control.offpolicy import EstimatesState
from tests.unit.control.factories import outcome


def label(request_id: str, value: float, ts_ms: int = 1_000) -> OutcomeLabel:
    return OutcomeLabel(ts_ms=ts_ms, scope="eu1", request_id=request_id, value=value)


def fresh() -> ValueEvidence:
    return ValueEvidence(ControlConfig(), EstimatesState())


def test_a_decision_that_carries_its_value_is_joined_at_once() -> None:
    evidence = fresh()
    evidence.on_decision(outcome("s", "powerful", 1.0), 0)
    assert evidence.join.counts["inline"] == 1
    assert evidence.estimates.state != EstimatesState()


def test_a_label_joins_its_waiting_decision_and_feeds_the_estimates() -> None:
    evidence = fresh()
    waiting = msgspec.structs.replace(outcome("s", "powerful", 0.0, request_id="r1"), value=None)
    evidence.on_decision(waiting, 0)
    assert evidence.estimates.state == EstimatesState()
    evidence.on_label(label("r1", 2.0), 1_000)
    assert evidence.join.counts["joined"] == 1
    assert evidence.estimates.state != EstimatesState()


def test_a_label_without_its_decision_is_an_orphan_and_teaches_nothing() -> None:
    evidence = fresh()
    evidence.on_label(label("nobody", 2.0), 1_000)
    assert evidence.join.counts["orphan"] == 1
    assert evidence.estimates.state == EstimatesState()


def test_the_report_carries_the_scope_epoch_and_join_counts() -> None:
    evidence = fresh()
    evidence.on_label(label("nobody", 2.0), 1_000)
    report = evidence.report("eu1", 5_000, 7, curves_learned=False)
    assert (report.scope, report.epoch) == ("eu1", 7)
