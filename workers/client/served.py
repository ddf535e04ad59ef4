"""The served requests a late label can still teach the router about.

A label (`RankingClient.label`) arrives long after its request was served, and the router
learns per segment and model, so the client remembers both for each request it served
without a value at response time. The memory is bounded: past `LABEL_MEMORY` the oldest is
forgotten, and its label still goes to the control plane, only not to the local router.
"""

from __future__ import annotations

from workers.policy.routing import Model

#: Served requests whose segment and model `label` still remembers (for local learning).
LABEL_MEMORY = 100_000


class ServedRequests:
    """Segment and model by request id, oldest forgotten first (dicts keep insertion order)."""

    def __init__(self, limit: int = LABEL_MEMORY) -> None:
        """:param limit: how many requests it remembers."""
        self.limit = limit
        self._by_id: dict[str, tuple[str, Model]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def remember(self, request_id: str, segment: str, model: Model) -> None:
        """Remember a served request, forgetting the oldest one when full."""
        by_id = self._by_id
        if len(by_id) >= self.limit:
            del by_id[next(iter(by_id))]
        by_id[request_id] = (segment, model)

    def pop(self, request_id: str) -> tuple[str, Model] | None:
        """The request's segment and model, forgotten once read (one label a request)."""
        return self._by_id.pop(request_id, None)
