"""The worker ranking endpoint's HTTP body shapes, shared by the torch server and the client.

Both sides import these structs, so the JSON on the wire cannot drift between them. Bounds live
in the types (msgspec `Meta`): a decoded request is already known to be small enough to score,
and `decode_request` adds the one cross-field rule (`base_count <= len(candidates)`). Errors are
`schemas.codec.ContractError` whose message names the offending field, like every other decode
in Surplus.

Work split: the first `base_count` candidates are baseline work (never shed); the rest are
optional RMA extra candidates the server may shed, counting them in `optional_shed` with a
`shed_reason`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from schemas.codec import DEFAULT_MAX_BYTES, ContractError
from schemas.contract import ModelKind

API_VERSION = 1
RANK_PATH = "/v1/rank"
#: Where a replica takes a `PreemptionNotice` (JSON) straight from the platform beside it: the
#: capacity agent in its pod, the scheduler that lends it. Kafka carries the same notice to
#: the rest of the fleet; whichever copy comes first stops optional work.
NOTICE_PATH = "/v1/preempt"

MAX_CANDIDATES = 4096
MAX_SPARSE_IDS = 256
MAX_DENSE = 4096
MAX_DEADLINE_MS = 60_000.0

Name = Annotated[str, Meta(min_length=1, max_length=200)]
NonNegInt = Annotated[int, Meta(ge=0)]
NonNegFloat = Annotated[float, Meta(ge=0.0)]
Bounded = Annotated[float, Meta(ge=-1e9, le=1e9)]


class Candidate(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One item to score: its id, sparse feature ids, and the retrieval stage's prior score."""

    id: Annotated[int, Meta(ge=0, le=2**63 - 1)]
    sparse: Annotated[list[Annotated[int, Meta(ge=0, le=2**31 - 1)]],
                      Meta(max_length=MAX_SPARSE_IDS)] = []
    prior: Bounded = 0.0


class RankRequest(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Score `candidates` for one ranking request within `deadline_ms` (a relative budget)."""

    v: int = API_VERSION
    request_id: Name
    segment: Name
    value: Annotated[float, Meta(ge=0.0, le=1e9)]
    deadline_ms: Annotated[float, Meta(gt=0.0, le=MAX_DEADLINE_MS)]
    dense: Annotated[list[Bounded], Meta(max_length=MAX_DENSE)] = []
    candidates: Annotated[list[Candidate], Meta(max_length=MAX_CANDIDATES)]
    base_count: NonNegInt
    gain: Annotated[float, Meta(ge=-1e9, le=1e9)] | None = None
    """What the client expects this request's optional work to add: a replica keeps optional
    work highest gain first and sheds it lowest first (absent: by ``value``). A worker that
    predates the field refuses it (400 naming it): upgrade workers before clients."""

    @property
    def optional_count(self) -> int:
        """How many candidates are optional RMA extra work."""
        return len(self.candidates) - self.base_count


class ServerState(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What the worker tells each caller about its load, so clients can shed on their own."""

    queue_delay_ms: NonNegFloat
    in_flight: NonNegInt
    shedding_level: Annotated[int, Meta(ge=0, le=3)]
    preempted: bool = False


class RankResponse(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Scores for the candidates actually scored, in request order (baseline ones first)."""

    v: int = API_VERSION
    request_id: Name
    model: ModelKind
    scores: Annotated[list[float], Meta(max_length=MAX_CANDIDATES)]
    scored: NonNegInt
    optional_scored: NonNegInt
    optional_shed: NonNegInt
    shed_reason: Annotated[str, Meta(max_length=200)] | None = None
    server: ServerState


_request_decoder = msgspec.json.Decoder(RankRequest, strict=True)
_response_decoder = msgspec.json.Decoder(RankResponse, strict=True)
_encoder = msgspec.json.Encoder()


def _decode(decoder: msgspec.json.Decoder, name: str, payload: bytes | bytearray | memoryview,
            max_bytes: int) -> object:
    if len(payload) > max_bytes:
        raise ContractError(name, f"payload of {len(payload)} bytes exceeds the "
                                  f"{max_bytes}-byte limit")
    try:
        return decoder.decode(payload)
    except msgspec.ValidationError as exc:
        raise ContractError(name, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ContractError(name, f"malformed JSON ({exc})") from None
    except RecursionError:
        raise ContractError(name, "JSON nested too deeply") from None


def decode_request(payload: bytes | bytearray | memoryview,
                   max_bytes: int = DEFAULT_MAX_BYTES) -> RankRequest:
    """Strictly decode a ranking request body; ContractError names the bad field."""
    request = _decode(_request_decoder, "RankRequest", payload, max_bytes)
    assert isinstance(request, RankRequest)
    if request.v != API_VERSION:
        raise ContractError("RankRequest", f"unknown API version {request.v} at `$.v` "
                                           f"(supported: [{API_VERSION}])")
    if request.base_count > len(request.candidates):
        raise ContractError("RankRequest", f"`$.base_count` is {request.base_count} but only "
                                           f"{len(request.candidates)} candidates were sent")
    return request


def decode_response(payload: bytes | bytearray | memoryview,
                    max_bytes: int = DEFAULT_MAX_BYTES) -> RankResponse:
    """Strictly decode a ranking response body; ContractError names the bad field."""
    response = _decode(_response_decoder, "RankResponse", payload, max_bytes)
    assert isinstance(response, RankResponse)
    if response.v != API_VERSION:
        raise ContractError("RankResponse", f"unknown API version {response.v} at `$.v` "
                                            f"(supported: [{API_VERSION}])")
    if response.scored != len(response.scores):
        raise ContractError("RankResponse", f"`$.scored` is {response.scored} but "
                                            f"{len(response.scores)} scores were sent")
    return response


def encode(message: RankRequest | RankResponse) -> bytes:
    """JSON body of a request or response."""
    return _encoder.encode(message)


__all__ = [
    "API_VERSION", "MAX_CANDIDATES", "MAX_DEADLINE_MS", "MAX_DENSE", "MAX_SPARSE_IDS",
    "RANK_PATH", "Candidate", "ContractError", "RankRequest", "RankResponse", "ServerState",
    "decode_request", "decode_response", "encode",
]
