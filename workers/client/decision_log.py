"""What the client logs of a request for the control plane to learn from: its decision record
(RoutingOutcome) and whether its label is sent.

Both sides of a join must be sampled alike: with ``decision_sample`` under 1 a request's record
is kept by a hash of its id (`workers.policy.sampling`), holdout requests always, and its label
only when its record was, since a label without its decision joins nothing. A sampled record
carries its inclusion probability (v9) so the control plane can weight it back up, and one
that held a precompute answer says whether it used it or the answer holdout withheld it
(v12).
"""

from __future__ import annotations

from msgspec import UNSET

from schemas.contract import (
    ANSWER_VERSION,
    SAMPLED_VERSION,
    SUPPLY_VERSION,
    AnswerUse,
    RoutingOutcome,
)
from workers.api import RankRequest, RankResponse
from workers.client.config import ClientConfig
from workers.client.decision import Decision, logged_propensity
from workers.policy.holdout import in_holdout
from workers.policy.sampling import decision_inclusion


def decision_record(config: ClientConfig, request: RankRequest, response: RankResponse,
                    decision: Decision, fell_back: str | None, value: float | None,
                    offered: int, inclusion: float, ts_ms: int,
                    answer: AnswerUse | None = None) -> RoutingOutcome:
    """The request's record. A fallback logs no exploration and no extras: the model that
    served it is not the one the router chose, and the baseline call carried none.

    :param offered: the extra candidates the caller had.
    :param inclusion: the probability the record was kept with (`decision_inclusion`).
    :param answer: what became of the precompute answer it held (None: it held none).
    """
    model = response.model
    propensity = logged_propensity(decision.model, decision.propensity, model)
    sampled = inclusion < 1.0
    version = (ANSWER_VERSION if answer is not None
               else SAMPLED_VERSION if sampled else SUPPLY_VERSION)
    return RoutingOutcome(
        v=version, ts_ms=ts_ms,
        scope=config.scope, request_id=request.request_id,
        segment=request.segment, model=model, value=value,
        explored=decision.explored and fell_back is None,
        extra=response.optional_scored if fell_back is None else 0,
        propensity=propensity, holdout=decision.holdout, available=offered,
        inclusion=inclusion if sampled else UNSET,
        answer=UNSET if answer is None else answer)


def label_logged(config: ClientConfig, request_id: str) -> bool:
    """Whether the request's label is sent: its decision record was logged."""
    rate = config.decision_sample
    return not (rate < 1.0 and decision_inclusion(
        request_id, rate, in_holdout(request_id, config.holdout_fraction)) is None)
