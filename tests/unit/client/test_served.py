"""The served requests a label can still teach the router about (``workers.client.served``)."""

from __future__ import annotations

from workers.client.served import ServedRequests


def test_a_label_reads_its_request_once() -> None:
    served = ServedRequests()
    served.remember("r1", "s", "powerful")
    assert served.pop("r1") == ("s", "powerful")
    assert served.pop("r1") is None


def test_past_the_limit_the_oldest_is_forgotten_first() -> None:
    served = ServedRequests(limit=2)
    for rid in ("r1", "r2", "r3"):
        served.remember(rid, "s", "baseline")
    assert len(served) == 2
    assert served.pop("r1") is None
    assert served.pop("r2") == ("s", "baseline")
