"""Why a worker did not serve a request as asked, each error its HTTP status (`server.py`): the
client reads a 503 as "try another replica, or fall back", a 422 as its own mistake, and a 500
as this batch's failure, never the replica's."""

from __future__ import annotations


class RequestError(ValueError):
    """The request cannot be scored as sent (HTTP 422); the message names the field."""


class NotReady(RuntimeError):
    """The worker cannot serve right now: model still loading, or shutting down (HTTP 503)."""


class OptionalShed(RuntimeError):
    """A whole-request optional unit (SBM) was not done (HTTP 503, so the client falls back)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"optional request shed: {reason}")
        self.reason = reason


class ModelFailure(RuntimeError):
    """The model raised on this request's batch (HTTP 500); the worker keeps serving."""
