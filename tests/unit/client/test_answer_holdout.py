"""The client's answer holdout (`PrecomputeSide.answer`): a request holding a fresh answer uses
it, or, in the holdout's share, is given none and ranked live; its decision record is told
which (`take`), and a request of the request holdout gets no answer and no record of one."""

from __future__ import annotations

from typing import Any

from schemas.kafka_config import KafkaSettings
from schemas.precompute import PrecomputeResult
from workers.client.precompute import USES_HELD, PrecomputeSide
from workers.policy.holdout import in_holdout, withholds_answer

NOW = 1_000_000


def _side(fraction: float = 0.2, holdout: float = 0.01) -> PrecomputeSide:
    producer: Any = None   # nothing here asks for a job
    side = PrecomputeSide("eu1", KafkaSettings(bootstrap="127.0.0.1:9"), producer,
                          lambda: NOW, holdout_fraction=holdout,
                          answer_holdout_fraction=fraction)
    side.answers.add(PrecomputeResult(
        job_key="u1/baseline", scope="eu1", segment="s", model="baseline", pool_id="p",
        worker_id="w", issued_at_ms=NOW - 10, computed_at_ms=NOW - 5,
        expires_at_ms=NOW + 60_000, candidates=30, top_ids=[3, 1], top_scores=[0.9, 0.5]))
    return side


def _ids(keep: Any) -> str:
    return next(f"r{i}" for i in range(100_000) if keep(f"r{i}"))


def test_a_request_uses_its_answer_unless_the_answer_holdout_withholds_it() -> None:
    side = _side()
    used = _ids(lambda r: not in_holdout(r, 0.01) and not withholds_answer(r, 0.2))
    withheld = _ids(lambda r: not in_holdout(r, 0.01) and withholds_answer(r, 0.2))
    assert side.answer("u1/baseline", used) is not None
    assert side.answer("u1/baseline", withheld) is None
    assert (side.take(used), side.take(withheld)) == ("used", "withheld")
    assert side.take(used) is None   # taken once, by its one decision record
    assert side.summary()["answers_withheld"] == 1


def test_a_request_without_an_answer_or_in_the_holdout_records_none() -> None:
    side = _side()
    held_out = _ids(lambda r: in_holdout(r, 0.01))
    other = _ids(lambda r: not in_holdout(r, 0.01))
    assert side.answer("u1/baseline", held_out) is None
    assert side.answer("u2/baseline", other) is None   # no answer for that user
    assert side.take(held_out) is None and side.take(other) is None


def test_the_fates_held_are_bounded() -> None:
    side = _side(0.0, holdout=0.0)
    for i in range(USES_HELD + 10):
        side.answer("u1/baseline", f"x{i}")
    assert side.take("x0") is None and side.take(f"x{USES_HELD + 9}") == "used"
