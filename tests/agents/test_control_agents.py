"""The control agents under Faust's `test_context()`: events are put straight into each agent;
what the agents publish goes to a real broker and is read back from it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec
import pytest

from schemas.clock import wall_ms
from schemas.codec import decode, encode, encode_telemetry
from schemas.contract import ControlTargets, DeadLetter, PreemptionNotice
from schemas.kafka_config import KafkaSettings
from streams.agents.control import ControlPlane, Tick
from streams.app import create_app
from streams.control.config import ControlConfig
from streams.settings import ControlPlaneSettings
from tests.agents.support import producing
from tests.integration.harness import TopicReader
from tests.integration.test_control_plane import _grant, _reports

pytestmark = pytest.mark.kafka


@pytest.fixture
async def control_plane(kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[ControlPlane]:
    """An app whose agents run under test_context; its producer talks to the real broker."""
    settings = ControlPlaneSettings(app_id="agents", partitions=2, data_dir=tmp_path)
    app = create_app(kafka, settings, ControlConfig(period_s=1.0, ttl_s=5.0))
    app.finalize()
    app.flow_control.resume()
    async with producing(app):
        plane: ControlPlane = app.control_plane  # type: ignore[attr-defined]
        await asyncio.wait_for(plane.changelog.maybe_declare(), timeout=30)
        yield plane


async def test_capacity_reports_and_a_tick_publish_period_targets(
        control_plane: ControlPlane, kafka: KafkaSettings) -> None:
    now = wall_ms()
    async with control_plane.agents["capacity"].test_context() as agent:
        await agent.put(encode(_grant("eu1", now)), key=b"eu1", partition=0)
    async with control_plane.agents["telemetry"].test_context() as agent:
        batch = [report for _, report in _reports("eu1", now, n=4)]
        await agent.put(encode_telemetry(batch), key=b"eu1", partition=0)
    assert control_plane.metrics.reports._value.get() == 4
    async with control_plane.agents["ticks"].test_context() as agent:
        await agent.put(msgspec.json.encode(Tick(wall_ms() + 1000)), partition=0)
        await until(lambda: published(control_plane) == 1)
    await flushed(control_plane)
    reader = TopicReader(kafka, "targets")
    msg = reader.wait_for(lambda m: True, timeout_s=30)
    reader.close()
    targets = decode(ControlTargets, msg.value())
    assert (targets.scope, targets.reason, targets.epoch) == ("eu1", "period", 1)
    assert targets.rma.budget_units_per_s > 0


async def test_preemption_agent_publishes_clamped_targets_at_once(
        control_plane: ControlPlane, kafka: KafkaSettings) -> None:
    now = wall_ms()
    async with control_plane.agents["capacity"].test_context() as agent:
        await agent.put(encode(_grant("eu1", now)), key=b"eu1", partition=1)
    notice = PreemptionNotice(notice_id="n1", ts_ms=now, region="eu1",
                              pool_id="eu1/rank/baseline/a100/opportunistic",
                              deadline_ms=now + 5000)
    async with control_plane.agents["preemption"].test_context() as agent:
        await agent.put(encode(notice), key=b"eu1", partition=1)
        await until(lambda: published(control_plane) == 1)
    await flushed(control_plane)
    reader = TopicReader(kafka, "targets")
    msg = reader.wait_for(lambda m: True, timeout_s=30)
    reader.close()
    targets = decode(ControlTargets, msg.value())
    assert targets.reason == "preemption"
    assert (targets.rma.extra_candidates, targets.sbm.coverage) == (0, 0.0)
    assert control_plane.registry.stored["eu1"].state.epoch == targets.epoch


async def test_garbage_and_lying_keys_are_dead_lettered_and_the_agent_keeps_going(
        control_plane: ControlPlane, kafka: KafkaSettings) -> None:
    now = wall_ms()
    async with control_plane.agents["capacity"].test_context() as agent:
        await agent.put(b"\x00 not json", key=b"eu1", partition=0)
        await agent.put(encode(_grant("us2", now)), key=b"eu1", partition=0)
        await agent.put(encode(_grant("eu1", now)), key=b"eu1", partition=0)
        await until(lambda: dead_lettered(control_plane) == 2)
    await flushed(control_plane)
    reader = TopicReader(kafka, "deadletter")
    deadline = time.monotonic() + 30
    while len(reader.messages) < 2 and time.monotonic() < deadline:
        reader.poll(0.5)
    letters = reader.events(DeadLetter)
    reader.close()
    assert [(letter.offset, letter.source_topic) for letter in letters] == [
        (0, kafka.topic("capacity")), (1, kafka.topic("capacity"))]
    assert "malformed JSON" in letters[0].reason
    assert "does not match scope" in letters[1].reason
    assert control_plane.registry.entries["eu1"].controller.capacity.cpu_units == 64.0


async def flushed(plane: ControlPlane) -> None:
    """Everything the agents sent is on the broker (bounded: a stuck batch fails the test)."""
    await asyncio.wait_for(plane.app.producer.flush(), timeout=30)


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """`put` returns once the agent took the event; its awaits (sends) may still be running."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "agent did not get there in time"
        await asyncio.sleep(0.01)


def published(plane: ControlPlane) -> float:
    return sum(s.value for s in next(iter(plane.metrics.targets.collect())).samples
               if s.name.endswith("_total"))


def dead_lettered(plane: ControlPlane) -> float:
    return sum(s.value for s in next(iter(plane.metrics.rejected.collect())).samples
               if s.name.endswith("_total"))
