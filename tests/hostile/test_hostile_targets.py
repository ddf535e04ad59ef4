"""Hostile ControlTargets through Kafka into a running worker process and a ranking client.

Both receivers hold a signing key and local limits. Over the real targets topic they get one
good signed target, then: one above their local limits (applied clamped, counted), one from the
future, one with an older epoch, one unsigned, one with a forged signature, one for another
scope under this scope's key, one long expired, and payloads outside the contract (coverage
above 1, a zero TTL, a string where a number goes, garbage). None of those is applied as sent:
each is dropped or clamped and counted under its reason, undecodable ones reach the dead-letter
topic with the reason and their source offset, and the worker keeps to the clamped target.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import decode, encode
from schemas.contract import ControlTargets, DeadLetter, RmaTarget, SbmTarget
from schemas.kafka_config import KafkaSettings
from schemas.signing import sign
from tests.integration.fleet import REGION, WorkerProc, by_label
from tests.integration.harness import TopicReader
from tests.integration.worker_support import body
from workers.api import Candidate
from workers.client.client import RankingClient
from workers.client.config import ClientConfig
from workers.policy.targets import LocalLimits

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

LOCAL_MAX_EXTRA = 16
KEY = uuid.uuid4().hex.encode()


def _targets(epoch: int, *, extra: int = 8, issued_delta_ms: int = 0, ttl_ms: int = 60_000,
             scope: str = REGION, key: bytes | None = KEY) -> bytes:
    targets = ControlTargets(scope=scope, epoch=epoch,
                             issued_at_ms=wall_ms() + issued_delta_ms,
                             ttl_ms=ttl_ms, rma=RmaTarget(extra_candidates=extra,
                                                          budget_units_per_s=1e6),
                             sbm=SbmTarget(coverage=0.2))
    return encode(sign(targets, key) if key else targets)


def _raw(base_epoch: int, /, **changes: object) -> bytes:
    doc = msgspec.json.decode(_targets(base_epoch))
    for dotted, value in changes.items():
        node = doc
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return msgspec.json.encode(doc)


def _hostile_cases() -> list[tuple[str, bytes, str]]:
    """(case, payload, the verdict it must get, or "deadletter" when it cannot be decoded)."""
    forged = msgspec.json.decode(_targets(14, extra=200))
    forged["rma"]["extra_candidates"] = 10_000  # signature no longer matches the content
    return [
        ("above local limits", _targets(11, extra=5000), "clamped"),
        ("from the future", _targets(12, issued_delta_ms=3_600_000), "from_future"),
        ("older epoch", _targets(5, extra=12), "older_epoch"),
        ("unsigned", _targets(13, extra=12, key=None), "unsigned"),
        ("forged signature", msgspec.json.encode(forged), "bad_signature"),
        ("signed with another key", _targets(15, key=b"attacker"), "bad_signature"),
        ("another scope under this key", _targets(16, scope="us2"), "wrong_scope"),
        ("expired", _targets(17, issued_delta_ms=-3_600_000, ttl_ms=60_000), "expired"),
        ("coverage above 1", _raw(18, sbm__coverage=1.5), "deadletter"),
        ("zero ttl", _raw(19, ttl_ms=0), "deadletter"),
        ("string for a number", _raw(20, rma__extra_candidates="64"), "deadletter"),
        ("negative epoch", _raw(21, epoch=-1), "deadletter"),
        ("garbage", b"\x00\xffnot json", "deadletter"),
        ("deeply nested", b"[" * 50_000 + b"]" * 50_000, "deadletter"),
    ]


def test_hostile_targets_are_dropped_or_clamped_and_counted_end_to_end(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    cases = _hostile_cases()
    key_file = tmp_path / "targets.key"
    key_file.write_bytes(KEY)
    worker = WorkerProc(tmp_path, "w1", kafka=kafka,
                        extra_toml=f"[limits]\nmax_extra_candidates = {LOCAL_MAX_EXTRA}\n",
                        args=["--signing-key-file", str(key_file)])
    producer = kafka_clients.producer(kafka, **{"linger.ms": 0})

    def send(payload: bytes, key: str = REGION) -> None:
        producer.produce(kafka.topic("targets"), key=key, value=payload)
        assert producer.flush(10) == 0

    try:
        worker.wait_ready()
        client_counters = asyncio.run(_client_run(kafka, worker.url, send, cases, worker))
        samples = worker.metrics()
        verdicts = by_label(samples, "surplus_worker_target_verdicts_total", "verdict")
        handled = by_label(samples, "surplus_worker_kafka_messages_total", "outcome")
        status, ready = worker.get("/readyz")
        served = _post(worker.url, body(4, 40))
    finally:
        worker.stop()
    expected: dict[str, int] = {}
    for _, _, verdict in cases:
        expected[verdict] = expected.get(verdict, 0) + 1
    print(f"worker verdicts {verdicts}; messages {handled}; client {client_counters}")

    for verdict, n in expected.items():
        if verdict == "deadletter":
            assert handled.get("deadletter", 0) == n, handled
        else:
            assert verdicts.get(verdict, 0) == n, (verdict, verdicts)
            assert client_counters["targets"].get(verdict, 0) == n, (verdict, client_counters)
    assert client_counters["feed"].get("decode_error", 0) == expected["deadletter"]
    # What is in force is the clamped target, not anything sent after it.
    assert isinstance(ready, dict) and status == 200
    assert samples["surplus_worker_targets_epoch"] == 11
    assert samples["surplus_worker_targets_extra_candidates"] == LOCAL_MAX_EXTRA
    assert served["scored"] >= 4 and served["optional_scored"] <= LOCAL_MAX_EXTRA

    letters = TopicReader(kafka, "deadletter")
    letters.poll(2.0)
    dead = [decode(DeadLetter, m.value()) for m in letters.messages]
    letters.close()
    from_worker = [d for d in dead if d.source_topic == kafka.topic("targets")]
    assert len(from_worker) >= expected["deadletter"], dead
    reasons = " | ".join(d.reason for d in from_worker)
    for fragment in ("$.sbm.coverage", "$.ttl_ms", "$.rma.extra_candidates", "$.epoch",
                     "malformed JSON", "got `array`"):  # typed decoding stops deep input at once
        assert fragment in reasons, (fragment, reasons)
    assert all(d.offset >= 0 and d.partition >= 0 for d in from_worker)


async def _client_run(kafka: KafkaSettings, url: str, send: object, cases: list[
        tuple[str, bytes, str]], worker: WorkerProc) -> dict[str, dict[str, int]]:
    """A ranking client with the same key and limits follows the same topic."""
    config = ClientConfig(scope=REGION, baseline_urls=[url], catch_up_timeout_s=20.0,
                          limits=LocalLimits(max_extra_candidates=LOCAL_MAX_EXTRA))
    async with RankingClient(config, kafka, signing_key=KEY) as client:
        send(_targets(10))  # type: ignore[operator]
        await _until(lambda: client.decider.targets.epoch == 10, 30)
        for _, payload, _ in cases:
            send(payload)  # type: ignore[operator]
        await _until(lambda: sum(client.summary()["targets"].values())
                     + client.summary()["feed"].get("decode_error", 0) >= len(cases) + 1, 30)
        await _until(lambda: _worker_saw(worker) >= len(cases) + 1, 30)
        result = await client.rank(segment="s", value=1.0, candidates=_candidates(40),
                                   base_count=4, dense=[0.1] * 4)
        assert result.response.optional_scored <= LOCAL_MAX_EXTRA
        assert client.decider.targets.epoch == 11
        return {"targets": dict(client.summary()["targets"]),
                "feed": dict(client.summary()["feed"])}


def _post(url: str, payload: bytes) -> dict[str, Any]:
    import json
    import urllib.request

    request = urllib.request.Request(url + "/v1/rank", data=payload,
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        result: dict[str, object] = json.load(resp)
    return result


def _worker_saw(worker: WorkerProc) -> float:
    handled = by_label(worker.metrics(), "surplus_worker_kafka_messages_total", "outcome")
    return sum(handled.values()) - handled.get("other_scope", 0)


def _candidates(n: int) -> list[Candidate]:
    return [Candidate(id=i, sparse=[i % 60, 1, 2], prior=0.1) for i in range(n)]


async def _until(check: object, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)
