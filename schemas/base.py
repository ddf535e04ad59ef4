"""The contract's building blocks: the bounded scalar types every message uses, the base of
every wire message, and the latency sketch's wire form (`schemas.contract` re-exports them)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct

from schemas.versions import SCHEMA_VERSION, SIGNED_VERSION

NonNegInt = Annotated[int, Meta(ge=0)]
NonNegFloat = Annotated[float, Meta(ge=0.0)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]
TimestampMs = Annotated[int, Meta(ge=0, le=2**53)]
Name = Annotated[str, Meta(min_length=1, max_length=200)]
Tier = Literal["baseline", "opportunistic"]
ModelKind = Literal["baseline", "powerful"]
#: What became of a fresh precompute answer a request held (`RoutingOutcome.answer`).
AnswerUse = Literal["used", "withheld"]
#: A member of the replicas topic: routable (``serving``) or leaving (``draining``).
ReplicaState = Literal["serving", "draining"]
#: A keyring entry's name (`schemas.signing`): a file name in a key directory, so no slash.
KeyId = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
#: A hex HMAC-SHA256 (64 characters; the bound leaves room as targets' always had).
Signature = Annotated[str, Meta(max_length=128)]


def check_signed(event: Event) -> None:
    """A message carrying a key id is v8 or later: an older reader must refuse it by version
    rather than read a signature it cannot check (shared by the four signed types)."""
    if getattr(event, "key_id", UNSET) is not UNSET and event.v < SIGNED_VERSION:
        raise ValueError(f"`key_id` is a v{SIGNED_VERSION} field: a signed message is written "
                         f"as v{SIGNED_VERSION}")


class Event(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every wire message: `v` is the schema version, checked on decode."""

    v: int = SCHEMA_VERSION


class LatencySketch(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Wire form of a DDSketch of latencies in milliseconds (log-spaced bins, relative error).

    `bins[i]` counts values whose bucket key is `offset + i`. Sketches merge exactly when their
    `relative_accuracy` matches; see `schemas.sketch`.
    """

    relative_accuracy: Annotated[float, Meta(gt=0.0, lt=1.0)]
    offset: Annotated[int, Meta(ge=-100_000, le=100_000)]
    bins: Annotated[list[NonNegInt], Meta(max_length=4096)]
    zero_count: NonNegInt = 0
    count: NonNegInt
    sum: NonNegFloat
    min: NonNegFloat
    max: NonNegFloat
