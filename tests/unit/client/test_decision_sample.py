"""The client's decision sample (``decision_sample``): records of the requests the hash picks
are published with their inclusion probability, the rest (and their labels) are counted and
not sent; holdout records always go out; a bad rate stops the client naming the key."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from schemas.codec import decode, encode
from schemas.contract import SAMPLED_VERSION, SUPPLY_VERSION, OutcomeLabel, RoutingOutcome
from workers.client.client import RankingClient
from workers.client.config import ClientConfig
from workers.client.decision import Decision
from workers.policy.sampling import decision_inclusion


class Records:
    def __init__(self) -> None:
        self.decisions: list[RoutingOutcome] = []
        self.labels: list[OutcomeLabel] = []

    def decision(self, record: RoutingOutcome) -> None:
        self.decisions.append(record)

    def label(self, label: OutcomeLabel) -> None:
        self.labels.append(label)


def _client(rate: float, holdout: float = 0.0) -> tuple[RankingClient, Records]:
    client = RankingClient(ClientConfig(scope="eu1", baseline_urls=["http://b.invalid"],
                                        decision_sample=rate, holdout_fraction=holdout),
                           clock=lambda: 1_000)
    records = Records()
    client._records = records  # type: ignore[assignment]
    return client, records


def _publish(client: RankingClient, rid: str, holdout: bool = False) -> None:
    request: Any = SimpleNamespace(request_id=rid, segment="s")
    response: Any = SimpleNamespace(model="baseline", optional_scored=2)
    decision = Decision("baseline", False, 2, "ok", 1.0, holdout)
    client._publish(request, response, decision, None, None, 5, None)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_a_bad_rate_is_refused_naming_the_key(bad: float) -> None:
    with pytest.raises(msgspec.ValidationError, match="decision_sample"):
        msgspec.convert({"scope": "eu1", "baseline_urls": ["http://b.invalid"],
                         "decision_sample": bad}, ClientConfig)


def test_sampled_records_carry_their_inclusion_and_the_rest_are_counted() -> None:
    client, records = _client(0.1)
    ids = [f"r{i}" for i in range(2_000)]
    for rid in ids:
        _publish(client, rid)
        client.label(rid, 1.0)
    picked = [r for r in ids if decision_inclusion(r, 0.1, False) is not None]
    assert [d.request_id for d in records.decisions] == picked
    assert [x.request_id for x in records.labels] == picked
    assert all(d.v == SAMPLED_VERSION and d.inclusion == 0.1 for d in records.decisions)
    assert client.decider.counters["outcomes"]["unsampled"] == len(ids) - len(picked)
    assert client.decider.counters["labels"]["unsampled"] == len(ids) - len(picked)
    wire = records.decisions[0]
    assert decode(RoutingOutcome, encode(wire)) == wire


def test_holdout_records_and_full_logging_are_written_as_before() -> None:
    client, records = _client(0.01)
    for i in range(100):
        _publish(client, f"h{i}", holdout=True)
    assert len(records.decisions) == 100
    client, full = _client(1.0)
    _publish(client, "r1")
    for record in (*records.decisions, *full.decisions):
        assert record.v == SUPPLY_VERSION and b"inclusion" not in encode(record)
        assert record.sample_weight == 1.0


def test_a_record_carrying_an_inclusion_is_v9_and_never_a_sampled_holdout() -> None:
    base = {"ts_ms": 1, "scope": "eu1", "request_id": "r", "segment": "s", "model": "baseline"}
    with pytest.raises(ValueError, match="v9"):
        RoutingOutcome(v=SUPPLY_VERSION, inclusion=0.5, **base)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="holdout"):
        RoutingOutcome(v=SAMPLED_VERSION, inclusion=0.5, holdout=True,
                       **base)  # type: ignore[arg-type]
    assert RoutingOutcome(v=SAMPLED_VERSION, inclusion=0.25,
                          **base).sample_weight == 4.0  # type: ignore[arg-type]
