"""Per-replica room for extras (``workers.policy.replica_room``): a replica is sent no more
extras than it had room for over the last control period and the one under way."""

from __future__ import annotations

from workers.policy.replica_room import ReplicaRooms


def test_a_replica_heard_from_in_no_period_yet_is_not_capped() -> None:
    rooms = ReplicaRooms()
    rooms.observe("a", 10)
    assert rooms.cap("a") is None
    assert rooms.fit("a", 500) == 500


def test_the_cap_is_the_most_room_the_replica_reported_last_period() -> None:
    rooms = ReplicaRooms()
    for room in (40, 90, 60):
        rooms.observe("a", room)
    rooms.new_period()
    assert rooms.cap("a") == 90
    assert rooms.fit("a", 500) == 90
    assert rooms.fit("a", 30) == 30


def test_more_room_in_the_period_under_way_lifts_the_cap_at_once() -> None:
    rooms = ReplicaRooms()
    rooms.observe("a", 90)
    rooms.new_period()
    rooms.observe("a", 50)
    assert rooms.cap("a") == 90
    rooms.observe("a", 200)
    assert rooms.cap("a") == 200


def test_replicas_are_capped_each_by_their_own_room() -> None:
    rooms = ReplicaRooms()
    rooms.observe("small", 60)
    rooms.observe("large", 120)
    rooms.new_period()
    assert (rooms.fit("small", 256), rooms.fit("large", 256), rooms.fit("new", 256)) == (
        60, 120, 256)


def test_a_replica_silent_for_a_whole_period_is_no_longer_capped() -> None:
    rooms = ReplicaRooms()
    rooms.observe("a", 10)
    rooms.new_period()
    rooms.new_period()
    assert rooms.cap("a") is None


def test_a_response_without_room_leaves_the_cap_as_it_was() -> None:
    rooms = ReplicaRooms()
    rooms.observe("a", 70)
    rooms.new_period()
    rooms.observe("a", None)
    rooms.new_period()
    assert rooms.cap("a") is None
