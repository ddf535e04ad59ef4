"""The precompute lever's messages: work the lent capacity does ahead of requests (v11).

A job asks for one request's candidates to be scored before the request comes (a user likely
to arrive soon); the answer is kept on a compacted cache topic under the job's key, so a job
done twice leaves one answer, and a reader counts a key once whoever computed it. Jobs carry
the request body as the ranking endpoint takes it (msgpack columns, `workers.wire`), so a
replica scores a job with the same decode and model as a live request.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from schemas.contract import (
    Event,
    ModelKind,
    Name,
    NonNegInt,
    TimestampMs,
)
from schemas.versions import PRECOMPUTE_VERSION

#: A job's body, at most (msgpack columns; about 24 bytes a candidate with three sparse ids).
MAX_JOB_BODY_BYTES = 512 * 1024
#: The best candidates an answer keeps: what a ranking shows, not every score.
MAX_TOP = 1024
#: The consumer groups that share the jobs, after the topic prefix: one per region and model
#: (``{prefix}precompute.{region}.{model}``), so deployments on one cluster stay apart.
PRECOMPUTE_GROUPS = "precompute."


def group_id(prefix: str, region: str, model: str) -> str:
    """The lent replicas of one model in one region share the jobs; the topic prefix keeps
    deployments on one cluster apart."""
    return f"{prefix}{PRECOMPUTE_GROUPS}{region}.{model}"


def _check_version(event: Event) -> None:
    if event.v < PRECOMPUTE_VERSION:
        raise ValueError(f"{type(event).__name__} is a v{PRECOMPUTE_VERSION} type: it is "
                         f"written as v{PRECOMPUTE_VERSION}")


def _check_span(start_ms: int, end_ms: int, start: str, end: str) -> None:
    if end_ms <= start_ms:
        raise ValueError(f"`{end}` must be after `{start}`: an answer that has expired when "
                         f"it is made is worth nothing")


class PrecomputeJob(Event, frozen=True, kw_only=True):
    """Score one request's candidates ahead of it (precompute topic, keyed by ``job_key``).

    Opportunistic replicas of ``model`` take jobs in one consumer group and commit a job only
    once its answer is on the cache topic, so a job a reclaimed replica held is read again
    by another. Past ``expires_at_ms`` a job is dropped unscored: its user has come or gone.
    """

    v: int = PRECOMPUTE_VERSION
    job_key: Name
    """What the answer is cached under (a user id): a newer job for the key replaces it."""
    scope: Name
    segment: Name
    model: ModelKind
    issued_at_ms: TimestampMs
    expires_at_ms: TimestampMs
    body: Annotated[bytes, Meta(max_length=MAX_JOB_BODY_BYTES)]
    """The candidates, as a msgpack ranking request (``Content-Type: application/msgpack``)."""
    top: Annotated[int, Meta(ge=1, le=MAX_TOP)] = 100

    def __post_init__(self) -> None:
        _check_version(self)
        _check_span(self.issued_at_ms, self.expires_at_ms, "issued_at_ms", "expires_at_ms")


class PrecomputeResult(Event, frozen=True, kw_only=True):
    """One job's answer (cache topic, compacted, keyed by ``job_key``): the best ``top_ids`` by
    score, highest first, and who computed it. Idempotent: the same job scored twice gives
    the same answer under the same key."""

    v: int = PRECOMPUTE_VERSION
    job_key: Name
    scope: Name
    segment: Name
    model: ModelKind
    pool_id: Name
    worker_id: Name
    issued_at_ms: TimestampMs
    computed_at_ms: TimestampMs
    expires_at_ms: TimestampMs
    candidates: NonNegInt
    """Candidates scored; ``top_ids`` keeps the best of them."""
    top_ids: Annotated[list[int], Meta(max_length=MAX_TOP)]
    top_scores: Annotated[list[float], Meta(max_length=MAX_TOP)]

    def __post_init__(self) -> None:
        _check_version(self)
        _check_span(self.issued_at_ms, self.expires_at_ms, "issued_at_ms", "expires_at_ms")
        if len(self.top_ids) != len(self.top_scores):
            raise ValueError(f"`top_ids` has {len(self.top_ids)} entries and `top_scores` "
                             f"{len(self.top_scores)}: each id has its score")


PRECOMPUTE_TYPES: tuple[type[Event], ...] = (PrecomputeJob, PrecomputeResult)
