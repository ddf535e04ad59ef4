"""What a served request comes to (``workers.client.result``)."""

from __future__ import annotations

from workers.client.result import VALUE_BOUND, RankingError, bounded_value


def test_an_outcome_value_is_learned_within_its_bound() -> None:
    assert bounded_value(3) == 3.0
    assert bounded_value(1e9) == VALUE_BOUND
    assert bounded_value(-1e9) == -VALUE_BOUND


def test_a_ranking_error_names_its_reason() -> None:
    error = RankingError("http_503")
    assert error.reason == "http_503" and "http_503" in str(error)
