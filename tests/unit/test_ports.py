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


def test_free_port_hands_out_a_port_once_per_process_though_nothing_bound_it() -> None:
    """A fleet picks its workers', proxies' and metrics ports one call at a time, before any
    listener binds: a second call must not return a port the first one gave."""
    got = [ports.free_port() for _ in range(500)]
    assert len(set(got)) == len(got)


def test_free_port_block_skips_a_block_overlapping_a_given_port(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_given", set())
    bases = iter([25001, 25000, 25010])
    monkeypatch.setattr(ports.random, "randrange", lambda low, high: next(bases))
    monkeypatch.setattr(ports, "port_free", lambda port: True)
    assert ports.free_port_block(1) == 25001
    assert ports.free_port_block(2) == 25010  # 25000-25001 holds the port already given
