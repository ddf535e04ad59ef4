"""Ports for a run's listeners: each free, below the ephemeral range, and never one twice."""

from __future__ import annotations

import random

import pytest

from surplus.localkafka import ports


def test_free_ports_never_hands_out_one_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's listeners bind only when their processes start, so a port picked twice is
    free both times; the second listener then failed with "address already in use"."""
    picks = iter([25001, 25001, 25002, 25001, 25003])
    monkeypatch.setattr(ports, "free_port", lambda: next(picks))
    assert ports.free_ports(3) == [25001, 25002, 25003]


def test_free_ports_are_below_the_ephemeral_range() -> None:
    random.seed(3)
    got = ports.free_ports(6)
    assert len(set(got)) == 6
    assert all(ports.PRIVATE_PORT_LOW <= p < ports._ephemeral_low() for p in got)
