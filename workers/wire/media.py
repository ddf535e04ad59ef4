"""Which encoding a ranking body is in, and which one its caller asked for: JSON, the
default, or msgpack (``application/msgpack`` and its two other spellings), from the
Content-Type and Accept headers."""

from __future__ import annotations

from typing import Literal

Encoding = Literal["json", "msgpack"]


JSON_TYPE = "application/json"


MSGPACK_TYPE = "application/msgpack"


CONTENT_TYPES: dict[Encoding, str] = {"json": JSON_TYPE, "msgpack": MSGPACK_TYPE}


#: The Accept a msgpack-speaking client sends: msgpack, or JSON where that is all there is.
ACCEPT_MSGPACK = f"{MSGPACK_TYPE}, {JSON_TYPE};q=0.5"


#: The media types of each encoding (msgpack has three spellings in use), for Content-Type
#: and Accept alike.
_TYPES: dict[str, Encoding] = {
    JSON_TYPE: "json", MSGPACK_TYPE: "msgpack", "application/x-msgpack": "msgpack",
    "application/vnd.msgpack": "msgpack"}


#: A body may also declare a form: ``curl -d`` does when it is told nothing, and no form is a
#: ranking request, so it is read as the JSON it always is.
_READS: dict[str, Encoding] = {**_TYPES, "application/x-www-form-urlencoded": "json"}


def request_encoding(content_type: str | None) -> Encoding | None:
    """The encoding a body declares by its Content-Type (parameters such as ``charset``
    ignored; none declared: JSON), or None for a type the endpoint does not read (a 415)."""
    if content_type is None or not content_type.strip():
        return "json"
    media = content_type.split(";", 1)[0].strip().lower()
    return _READS.get(media)


def response_encoding(accept: str | None) -> Encoding:
    """msgpack when the Accept header names a msgpack type with a q-value above zero and at
    least JSON's; JSON otherwise (no header, ``*/*``, a type we do not serve, nonsense), so
    curl and browsers get what they can show. A range's q-value is its most specific match's."""
    if not accept:
        return "json"
    best: dict[Encoding, tuple[int, float]] = {}  # encoding -> (specificity, q)
    for item in accept.split(","):
        media, *params = (part.strip().lower() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip() == "q":
                try:
                    q = min(max(float(raw), 0.0), 1.0)
                except ValueError:
                    q = 0.0
        for encoding in ("json", "msgpack"):
            specificity = _specificity(media, encoding)
            if specificity and specificity > best.get(encoding, (0, 0.0))[0]:
                best[encoding] = (specificity, q)
    specificity, q_msgpack = best.get("msgpack", (0, 0.0))
    q_json = best.get("json", (0, 0.0))[1]
    named = specificity == 3     # a wildcard alone never asks for msgpack
    return "msgpack" if named and q_msgpack > 0.0 and q_msgpack >= q_json else "json"


def _specificity(media: str, encoding: Encoding) -> int:
    """3: the range names this encoding's type; 2: ``application/*``; 1: ``*/*``; 0: no match."""
    if media == "*/*":
        return 1
    if media == "application/*":
        return 2
    return 3 if _TYPES.get(media) == encoding else 0
