"""The worker ranking endpoint's HTTP body shapes, shared by the torch server and the client.

Both sides import these structs, so the JSON on the wire cannot drift between them. Bounds live
in the types (msgspec `Meta`): a decoded request is already known to be small enough to score,
and `decode_request` adds the one cross-field rule (`base_count <= len(candidates)`). Errors are
`schemas.codec.ContractError` whose message names the offending field, like every other decode
in Surplus. This is the JSON form, for people, curl and tools; `workers.wire` holds the msgpack
form the client sends (the same header, `RankHeader`; candidates as raw numpy columns) and
which of the two a request asked for.

Work split: the first `base_count` candidates are baseline work (never shed); the rest are
optional RMA extra candidates the server may shed, counting them in `optional_shed` with a
`shed_reason`.
"""

from __future__ import annotations

from typing import Annotated, Any

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
FeatureName = Annotated[str, Meta(min_length=1, max_length=64)]
#: A request's named features, each undecoded (`msgspec.Raw`) until its kind is known.
Features = Annotated[dict[FeatureName, msgspec.Raw], Meta(max_length=64)]


class Candidate(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One item to score: its id, sparse feature ids, and the retrieval stage's prior score."""

    id: Annotated[int, Meta(ge=0, le=2**63 - 1)]
    sparse: Annotated[list[Annotated[int, Meta(ge=0, le=2**31 - 1)]],
                      Meta(max_length=MAX_SPARSE_IDS)] = []
    prior: Bounded = 0.0


class RankHeader(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What a ranking request says besides its candidates, in either encoding: JSON
    (`RankRequest`) and msgpack (`workers.wire`) share these fields and their bounds."""

    v: int = API_VERSION
    request_id: Name
    segment: Name
    value: Annotated[float, Meta(ge=0.0, le=1e9)]
    deadline_ms: Annotated[float, Meta(gt=0.0, le=MAX_DEADLINE_MS)]
    base_count: NonNegInt
    gain: Annotated[float, Meta(ge=-1e9, le=1e9)] | None = None
    """What the client expects this request's optional work to add: a replica keeps optional
    work highest gain first and sheds it lowest first (absent: by ``value``). A worker that
    predates the field refuses it (400 naming it): upgrade workers before clients."""
    report_room: bool = False
    """Ask for ``ServerState.optional_room`` in the response. Only a client that asks is sent
    it, so a client that predates the field, which refuses fields it does not know, keeps
    reading a newer worker's responses."""


class RankRequest(RankHeader, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Score `candidates` for one ranking request within `deadline_ms` (a relative budget)."""

    dense: Annotated[list[Bounded], Meta(max_length=MAX_DENSE)] = []
    candidates: Annotated[list[Candidate], Meta(max_length=MAX_CANDIDATES)]
    features: Features = {}
    """The model's named inputs (``[[model.inputs]]``, `workers.features`), each kept as its
    raw JSON until the worker reads it by the kind its spec declares: a list of values for
    the request, one row per candidate, or ``{"values": [...], "offsets": [...]}`` for
    multi-hot ids. ``dense`` and the candidates' ``sparse`` stay the fixed signature's."""

    @property
    def optional_count(self) -> int:
        """How many candidates are optional RMA extra work."""
        return len(self.candidates) - self.base_count


class ServerState(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
                  omit_defaults=True):
    """What the worker tells each caller about its load, so clients can shed on their own."""

    queue_delay_ms: NonNegFloat
    in_flight: NonNegInt
    shedding_level: Annotated[int, Meta(ge=0, le=3)]
    preempted: bool = False
    #: Extra candidates one request could queue under the delay bound now, sent to a request
    #: that asks (``RankHeader.report_room``) to a replica that serves divisible extras. The
    #: client sizes a request's extras to the replica it sends them to
    #: (``workers.policy.replica_room``).
    optional_room: NonNegInt | None = None


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
_msgpack_response_decoder = msgspec.msgpack.Decoder(RankResponse, strict=True)
_encoder = msgspec.json.Encoder()


def decode_strict(decoder: msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any], name: str,
                  payload: bytes | bytearray | memoryview, max_bytes: int) -> Any:
    """Decode with a strict msgspec decoder, JSON or msgpack, turning every way it can fail
    into a ContractError that names `name` and the field (the size bound comes first, so an
    oversized body is never parsed)."""
    encoding = "JSON" if isinstance(decoder, msgspec.json.Decoder) else "msgpack"
    if len(payload) > max_bytes:
        raise ContractError(name, f"payload of {len(payload)} bytes exceeds the "
                                  f"{max_bytes}-byte limit")
    try:
        return decoder.decode(payload)
    except msgspec.ValidationError as exc:
        raise ContractError(name, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ContractError(name, f"malformed {encoding} ({exc})") from None
    except RecursionError:
        raise ContractError(name, f"{encoding} nested too deeply") from None


def check_header(header: RankHeader, candidates: int) -> None:
    """The rules a request's header keeps beyond its types, in either encoding: a known API
    version, and no more baseline candidates than were sent."""
    if header.v != API_VERSION:
        raise ContractError("RankRequest", f"unknown API version {header.v} at `$.v` "
                                           f"(supported: [{API_VERSION}])")
    if header.base_count > candidates:
        raise ContractError("RankRequest", f"`$.base_count` is {header.base_count} but only "
                                           f"{candidates} candidates were sent")


def decode_request(payload: bytes | bytearray | memoryview,
                   max_bytes: int = DEFAULT_MAX_BYTES) -> RankRequest:
    """Strictly decode a JSON ranking request body; ContractError names the bad field."""
    request = decode_strict(_request_decoder, "RankRequest", payload, max_bytes)
    assert isinstance(request, RankRequest)
    check_header(request, len(request.candidates))
    return request


def decode_response(payload: bytes | bytearray | memoryview,
                    max_bytes: int = DEFAULT_MAX_BYTES, *, msgpack: bool = False) -> RankResponse:
    """Strictly decode a ranking response body (JSON, or msgpack with ``msgpack``: the same
    struct either way); ContractError names the bad field."""
    decoder = _msgpack_response_decoder if msgpack else _response_decoder
    response = decode_strict(decoder, "RankResponse", payload, max_bytes)
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
    "RANK_PATH", "Candidate", "ContractError", "Features", "RankHeader", "RankRequest",
    "RankResponse", "ServerState", "check_header", "decode_request", "decode_response",
    "decode_strict", "encode",
]
