"""Signed control messages on a real broker: forgeries refused, a key rotated with none lost.

A control plane (its own process), a worker (torch, in process) and a ranking client hold one
key directory. Forged notices, capacity events, targets and overrides, produced by hand to
the real topics (no signature, the wrong key, an unknown key id, a tampered body), are all
refused by every receiver, counted by reason and dead-lettered; none is applied. Then a key is
rotated while everything runs (add k2, sign with k2, retire k1): messages signed with k1 that
are still in flight, and k1's targets on the compacted topic, are taken while both keys are
held, so no genuine message is refused.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from schemas.clock import wall_ms
from schemas.codec import decode, encode
from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    DeadLetter,
    Event,
    OperatorOverride,
    PreemptionNotice,
)
from schemas.kafka_config import KafkaSettings
from schemas.signing import ACTIVE_FILE, KEY_ID_HEADER, Keyring, KeySource, SignedEvent
from surplus.localkafka import free_port
from tests.integration.fleet import scrape
from tests.integration.harness import Proc, TopicReader, publish
from tests.integration.test_control_plane import _config
from tests.integration.worker_support import notice, running_worker, targets, tiny_config
from workers.api import NOTICE_PATH
from workers.capacity.direct import DirectNotices
from workers.client.client import RankingClient
from workers.client.config import ClientConfig
from workers.runtime import keywatch

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

REGION = "eu1"
POOL = f"{REGION}/rank/baseline/cpu/opportunistic"
RELOAD_S = 0.3
#: Long enough for every holder to have re-read the directory (several reload periods).
SETTLE_S = 1.5
FORGERIES = ("no_signature", "wrong_key", "unknown_key_id", "tampered")
REASON = {"no_signature": "unsigned", "wrong_key": "bad_signature",
          "unknown_key_id": "unknown_key", "tampered": "bad_signature"}


def _key_dir(tmp_path: Path) -> Path:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "k1").write_text("first-secret-of-this-run\n")
    return keys


def _control_plane(kafka: KafkaSettings, tmp_path: Path, keys: Path, port: int) -> Proc:
    return Proc(["control-plane", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix,
                 "--config", str(_config(tmp_path)), "--app-id", f"{kafka.prefix}cp-signed",
                 "--partitions", "2", "--data-dir", str(tmp_path / "state"),
                 "--metrics-port", str(port), "--loglevel", "warning",
                 "--signing-key-file", str(keys)],
                tmp_path / "control.log", env={"SURPLUS_CONTROL_SIGNING_RELOAD_S": str(RELOAD_S)})


def _grant(event_id: str) -> CapacityEvent:
    now = wall_ms()
    return CapacityEvent(event_id=event_id, ts_ms=now, region=REGION, pool_id=POOL,
                         kind="grant", accelerator="cpu", accelerator_units=1.0, cpu_units=2.0,
                         expires_at_ms=now + 600_000)


def _override(reason: str) -> OperatorOverride:
    return OperatorOverride(scope=REGION, issued_at_ms=wall_ms(), ttl_ms=600_000,
                            reason=reason, by="ci", max_extra=10_000)


def _forge(event: SignedEvent, how: str, genuine: Keyring) -> SignedEvent:
    if how == "no_signature":
        return event
    if how == "wrong_key":
        return Keyring({genuine.signing_id: b"an attacker's guess"}, genuine.signing_id).sign(
            event)
    if how == "unknown_key_id":
        return Keyring({"k-attacker": b"an attacker's own key"}, "k-attacker").sign(event)
    signed = genuine.sign(event)   # tampered: a genuine signature over other content
    if isinstance(signed, PreemptionNotice):   # reclaimed at once, not in 30 s
        return msgspec.structs.replace(signed, deadline_ms=signed.ts_ms)
    if isinstance(signed, CapacityEvent):
        return msgspec.structs.replace(signed, accelerator_units=800.0)
    if isinstance(signed, ControlTargets):
        return msgspec.structs.replace(signed, rma=msgspec.structs.replace(
            signed.rma, extra_candidates=10_000))
    assert isinstance(signed, OperatorOverride)
    return msgspec.structs.replace(signed, kill=True, max_extra=None)


def _until(what: Callable[[], bool], timeout_s: float, why: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, why
        time.sleep(0.1)


async def _until_async(what: Callable[[], bool], timeout_s: float,
                       why: str | Callable[[], str]) -> None:
    """Wait for ``what``; on timeout fail with ``why`` (called then, when it is a function, so
    it tells the state at the timeout, not at the start) and every thread's stack."""
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() >= deadline:
            reason = why() if callable(why) else why
            raise AssertionError(f"{reason}\n{_threads()}")
        await asyncio.sleep(0.1)


def _threads() -> str:
    """Where every thread of this process is: the worker's Kafka threads run in it, and a
    genuine notice once went unread for 60 s on a loaded CI machine with no error logged."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(f"thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame))
                     for ident, frame in sys._current_frames().items())


def _count(samples: dict[str, float], name: str, **labels: str) -> float:
    """The sum of a counter's samples whose labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        if not key.startswith(name + "{") and key != name:
            continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()):
            total += value
    return total


def _refusals(samples: dict[str, float], name: str, label: str) -> dict[str, float]:
    return {reason: _count(samples, name, **{label: reason})
            for reason in ("unsigned", "unknown_key", "bad_signature", "stale_request")}


@pytest.fixture
def plane(kafka: KafkaSettings, tmp_path: Path) -> Iterator[tuple[Path, Proc, str]]:
    keys = _key_dir(tmp_path)
    port = free_port()
    proc = _control_plane(kafka, tmp_path, keys, port)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        _until(lambda: _scrapes(url), 90, "control plane metrics never answered")
        yield keys, proc, url
    finally:
        proc.stop()
    assert "Traceback" not in proc.output(), proc.output()[-3000:]


def _scrapes(url: str) -> bool:
    try:
        scrape(url)
    except OSError:
        return False
    return True


def _worker_config(kafka: KafkaSettings, keys: Path) -> object:
    return tiny_config(kafka={"bootstrap": kafka.bootstrap, "prefix": kafka.prefix},
                       tier="opportunistic", accelerator="cpu", report_interval_s=0.2,
                       targets_signing_key_file=str(keys), signing_reload_s=RELOAD_S)


def _client_config(url: str) -> ClientConfig:
    return ClientConfig(scope=REGION, baseline_urls=[url], catch_up_timeout_s=20.0)


async def test_forged_notices_capacity_targets_and_overrides_are_all_refused_and_dead_lettered(
        kafka: KafkaSettings, plane: tuple[Path, Proc, str]) -> None:
    keys, control, metrics_url = plane
    genuine = KeySource(keys).ring
    config = _worker_config(kafka, keys)
    async with running_worker(config) as (worker, http):  # type: ignore[arg-type]
        url = str(http.make_url("")).rstrip("/")
        async with RankingClient(_client_config(url), kafka, signing_key=KeySource(keys)) \
                as client:
            await _until_async(lambda: worker.readiness()[0], 60, "worker never ready")
            forged: list[tuple[str, Event]] = []
            for i, how in enumerate(FORGERIES):
                forged += [
                    ("preemption", _forge(notice(worker.config.pool, notice_id=f"forged-{how}"),
                                          how, genuine)),
                    ("capacity", _forge(_grant(f"forged-{how}"), how, genuine)),
                    ("targets", _forge(targets(epoch=100 + i, extra=64), how, genuine)),
                    ("overrides", _forge(_override(f"forged {how}"), how, genuine))]
            for logical, event in forged:
                publish(kafka, logical, [(REGION, encode(event))])

            def worker_refused() -> float:
                verdicts = worker.targets.counters
                notices = _count(scrape_worker(), "surplus_worker_preemption_notices_total")
                return sum(verdicts.get(r, 0) for r in REASON.values()) + notices

            def scrape_worker() -> dict[str, float]:
                from prometheus_client import generate_latest
                from prometheus_client.parser import text_string_to_metric_families

                out: dict[str, float] = {}
                text = generate_latest(worker.metrics.registry).decode()
                for family in text_string_to_metric_families(text):
                    for s in family.samples:
                        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                        out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
                return out

            await _until_async(lambda: worker_refused() >= 2 * len(FORGERIES), 30,
                               lambda: f"the worker saw {worker_refused()} of the forgeries")
            await _until_async(
                lambda: sum(client.summary()["targets"].get(r, 0) for r in REASON.values())
                >= len(FORGERIES), 30, lambda: f"client saw {client.summary()['targets']}")
            control_samples: dict[str, float] = {}

            def control_refused() -> float:
                control_samples.update(scrape(metrics_url))
                return _count(control_samples, "surplus_control_rejected_total")

            await _until_async(lambda: control_refused() >= 3 * len(FORGERIES), 60,
                               lambda: f"control plane refused {control_refused()}")

            # None applied. The worker is not preempted and holds no forged targets (their
            # epochs are 100 and up; its telemetry gives the control plane a scope, so it may
            # hold the plane's genuine ones), nor does the client; the control plane
            # dispatched none of them (every event of those topics was refused) and applied
            # no override.
            assert not worker.draining and worker.draining_deadline_ms is None
            for held in (worker.targets.held, client.decider.targets.held):
                assert held is None or held.epoch < 100, held
            worker_samples = scrape_worker()
            want = {"unsigned": 1, "bad_signature": 2, "unknown_key": 1, "stale_request": 0}
            assert _refusals(worker_samples, "surplus_worker_preemption_notices_total",
                             "outcome") == want
            assert _count(worker_samples, "surplus_worker_preemption_notices_total",
                          outcome="applied") == 0
            assert {r: worker.targets.counters.get(r, 0) for r in want} == want
            assert {r: client.summary()["targets"].get(r, 0) for r in want} == want
            for topic in ("capacity", "preemption", "overrides"):
                got = _refusals(control_samples, "surplus_control_rejected_total", "reason")
                per_topic = {r: _count(control_samples, "surplus_control_rejected_total",
                                       topic=topic, reason=r) for r in got}
                assert per_topic == want, (topic, per_topic)
                assert _count(control_samples, "surplus_control_events_total",
                              topic=topic) == len(FORGERIES)
            assert _count(control_samples, "surplus_control_overrides_total") == 0

            # The genuine copy of each passes, so the refusals above were the signatures'.
            publish(kafka, "preemption", [(REGION, genuine.sign(notice(
                worker.config.pool, notice_id="genuine")))])
            # Counted, not read off `draining_deadline_ms`: the control plane's next genuine
            # targets, issued after the notice, resume optional work and clear it again, which
            # on a loaded machine can happen between two looks (CI missed it once so).
            def applied() -> float | None:
                return worker.metrics.registry.get_sample_value(
                    "surplus_worker_preemption_notices_total",
                    {"path": "kafka", "outcome": "applied"})

            def notices() -> dict[str, float]:
                return {k: v for k, v in scrape_worker().items()
                        if k.startswith(("surplus_worker_preemption_notices_total",
                                         "surplus_worker_kafka_"))}

            await _until_async(lambda: applied() == 1, 60,
                               lambda: f"a genuine notice was not applied: {notices()}")

    reader = TopicReader(kafka, "deadletter")
    reader.poll(3.0)
    letters = [decode(DeadLetter, m.value()) for m in reader.messages]
    reader.close()
    by_topic: dict[str, list[str]] = {}
    for letter in letters:
        by_topic.setdefault(letter.source_topic, []).append(letter.reason)
    n = len(FORGERIES)
    # Notices: the control plane's and the worker's; targets: the worker's and the client's.
    expected = {"preemption": 2 * n, "targets": 2 * n, "capacity": n, "overrides": n}
    for logical, count in expected.items():
        reasons = by_topic.get(kafka.topic(logical), [])
        assert len(reasons) == count, (logical, reasons)
        for reason in REASON.values():
            assert any(reason in text for text in reasons), (logical, reason, reasons)
    published = TopicReader(kafka, "targets")
    published.poll(2.0)
    from_plane = [t for t in published.events(ControlTargets) if t.epoch < 100]
    published.close()
    assert all(t.key_id == "k1" and t.reason != "operator" for t in from_plane), from_plane
    assert control.alive()


async def test_a_key_rotation_while_running_refuses_no_genuine_message(
        kafka: KafkaSettings, plane: tuple[Path, Proc, str]) -> None:
    keys, control, metrics_url = plane
    issuer = KeySource(keys)          # the scheduler's, the capacity agent's, the operator's
    watcher_stop = threading.Event()
    keywatch.watch(issuer, RELOAD_S, watcher_stop)
    config = _worker_config(kafka, keys)
    sent: list[str] = []

    def send(logical: str, event: SignedEvent) -> None:
        publish(kafka, logical, [(REGION, encode(event))])
        sent.append(f"{logical}:{event.key_id}")

    def control_targets() -> list[ControlTargets]:
        reader = TopicReader(kafka, "targets")
        reader.poll(1.0)
        found = reader.events(ControlTargets)
        reader.close()
        return found

    try:
        async with running_worker(config) as (worker, http):  # type: ignore[arg-type]
            url = str(http.make_url("")).rstrip("/")
            client_keys = KeySource(keys)
            keywatch.watch(client_keys, RELOAD_S, watcher_stop)
            async with RankingClient(_client_config(url), kafka, signing_key=client_keys) \
                    as client:
                # 1. k1 alone signs.
                send("capacity", issuer.sign(_grant("g-k1")))
                send("overrides", issuer.sign(_override("cap during rotation, k1")))
                await _until_async(lambda: worker.targets.held is not None, 60,
                                   "no targets from the control plane under k1")
                assert worker.targets.held is not None
                assert worker.targets.held.key_id == "k1"
                # In flight: signed with k1 now, delivered after the switch.
                in_flight: list[tuple[str, SignedEvent]] = [
                             ("capacity", issuer.sign(_grant("g-k1-late"))),
                             ("preemption", issuer.sign(notice(POOL, ["another-replica"],
                                                               notice_id="n-k1-late"))),
                             ("overrides", issuer.sign(_override("k1, delivered late")))]

                # 2. Add k2 everywhere; k1 still signs.
                (keys / "k2").write_text("second-secret-of-this-run\n")
                (keys / ACTIVE_FILE).write_text("k1\n")
                await asyncio.sleep(SETTLE_S)
                assert worker.keys is not None and worker.keys.ring.key_ids == ("k1", "k2")
                send("preemption", issuer.sign(notice(POOL, ["another-replica"],
                                                      notice_id="n-k1")))

                # 3. Switch signing to k2: the k1 messages in flight land now.
                (keys / ACTIVE_FILE).write_text("k2\n")
                await asyncio.sleep(SETTLE_S)
                assert issuer.ring.signing_id == "k2"
                for logical, event in in_flight:
                    send(logical, event)
                send("capacity", issuer.sign(_grant("g-k2")))
                send("preemption", issuer.sign(notice(POOL, ["another-replica"],
                                                      notice_id="n-k2")))
                await _until_async(
                    lambda: worker.targets.held is not None
                    and worker.targets.held.key_id == "k2", 30,
                    "the control plane did not switch to k2")
                # A client starting now reads k1's targets on the compacted topic first.
                async with RankingClient(_client_config(url), kafka,
                                         signing_key=KeySource(keys)) as late:
                    assert late.decider.targets.held is not None
                    late_verdicts = dict(late.summary()["targets"])

                # 4. Retire k1 once nothing signed with it is in flight.
                (keys / "k1").unlink()
                await asyncio.sleep(SETTLE_S)
                assert worker.keys.ring.key_ids == ("k2",)
                send("capacity", issuer.sign(_grant("g-k2-after")))
                send("overrides", issuer.sign(_override("k2 after k1 retired")))
                epoch = worker.targets.held.epoch
                await _until_async(lambda: worker.targets.held is not None
                                   and worker.targets.held.epoch > epoch + 1, 30,
                                   "targets stopped after k1 was retired")
                await asyncio.sleep(1.0)   # let the last messages reach every receiver
                samples = scrape(metrics_url)
                refused_control = _count(samples, "surplus_control_rejected_total")
                events = _count(samples, "surplus_control_events_total")
                worker_verdicts = dict(worker.targets.counters)
                client_verdicts = dict(client.summary()["targets"])
                plane_targets = control_targets()
    finally:
        watcher_stop.set()

    print(f"rotation: sent {sent}; control plane events {events:.0f}, refused "
          f"{refused_control:.0f}; worker verdicts {worker_verdicts}; client {client_verdicts}; "
          f"late client {late_verdicts}")
    refusals = ("unsigned", "unknown_key", "bad_signature")
    assert refused_control == 0
    assert not any(worker_verdicts.get(r) for r in refusals), worker_verdicts
    assert not any(client_verdicts.get(r) for r in refusals), client_verdicts
    assert not any(late_verdicts.get(r) for r in refusals), late_verdicts
    assert worker_verdicts.get("applied", 0) + worker_verdicts.get("clamped", 0) >= 3
    assert {t.key_id for t in plane_targets} == {"k1", "k2"}
    assert sum(1 for s in sent if s.endswith(":k1")) >= 5
    reader = TopicReader(kafka, "deadletter")
    reader.poll(2.0)
    letters = [decode(DeadLetter, m.value()) for m in reader.messages]
    reader.close()
    assert letters == [], [letter.reason for letter in letters]
    assert control.alive()


async def test_a_posted_notice_is_taken_only_with_its_request_signed_within_the_window(
        tmp_path: Path) -> None:
    keys = _key_dir(tmp_path)
    ring = KeySource(keys).ring
    config = tiny_config(tier="opportunistic", accelerator="cpu",
                         targets_signing_key_file=str(keys), notice_request_window_s=30.0)
    async with running_worker(config) as (worker, http):
        body = encode(ring.sign(notice(worker.config.pool, notice_id="direct-1")))
        unsigned = encode(notice(worker.config.pool, notice_id="direct-2"))
        now = wall_ms()
        refused = [
            ({}, "unsigned"),
            (Keyring({"k1": b"an attacker's guess"}, "k1").sign_request(body, now),
             "bad_signature"),
            ({**ring.sign_request(body, now), KEY_ID_HEADER: "k9"}, "unknown_key"),
            (ring.sign_request(body, now - 60_000), "stale_request"),   # a replay, later
            (ring.sign_request(body + b" ", now), "bad_signature"),     # another body
            # A signed request carrying a notice its issuer did not sign.
            (ring.sign_request(unsigned, now), "unsigned"),
        ]
        for i, (headers, reason) in enumerate(refused):
            payload = unsigned if i == len(refused) - 1 else body
            resp = await http.post(NOTICE_PATH, data=payload, headers={
                "content-type": "application/json", **headers})
            answer = await resp.json()
            assert (resp.status, answer.get("refused")) == (401, reason), (i, answer)
        assert worker.draining_deadline_ms is None          # none of them was applied

        poster = DirectNotices(keys=KeySource(keys))
        url = str(http.make_url("")).rstrip("/")
        [sent] = poster.send(ring.sign(notice(worker.config.pool, notice_id="direct-3")), [url])
        assert await asyncio.wrap_future(sent) == "applied"
        poster.close()
        assert worker.metrics.registry.get_sample_value("surplus_worker_preemptions_total") == 1
