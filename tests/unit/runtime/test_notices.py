"""The notices a worker makes and checks (``workers.runtime.notices``): its own stop is a signed
notice for it alone, a notice must verify, and one posted straight to the replica must come in
a request its headers sign, within the window, with the clock read only for that."""

from __future__ import annotations

from schemas.codec import encode
from schemas.signing import Keyring, KeySource
from workers.runtime.config import WorkerConfig, load_config
from workers.runtime.notices import notice_refusal, shutdown_notice

KEYS = KeySource.fixed(Keyring.of(b"k" * 32))


def _config() -> WorkerConfig:
    return load_config(None, {"worker_id": "w1", "shutdown_grace_s": 2.0})


def _no_clock() -> int:
    raise AssertionError("the clock is read only for a request posted to the replica")


def test_a_shutdown_notice_names_this_replica_alone_with_the_grace_as_deadline() -> None:
    config = _config()
    notice = shutdown_notice(config, "shutdown-w1-1000", 1_000, None)
    assert notice.replicas == ["w1"] and notice.pool_id == config.pool
    assert (notice.ts_ms, notice.deadline_ms) == (1_000, 3_000)
    assert KEYS.check(notice) == "unsigned"
    assert KEYS.check(shutdown_notice(config, "shutdown-w1-1000", 1_000, KEYS)) is None


def test_without_keys_every_notice_is_acted_on() -> None:
    notice = shutdown_notice(_config(), "n1", 1_000, None)
    assert notice_refusal(None, notice, "http", None, b"", _no_clock, 30_000) is None


def test_by_kafka_the_notice_must_verify() -> None:
    signed = shutdown_notice(_config(), "n1", 1_000, KEYS)
    unsigned = shutdown_notice(_config(), "n1", 1_000, None)
    assert notice_refusal(KEYS, signed, "kafka", None, b"", _no_clock, 30_000) is None
    assert notice_refusal(KEYS, unsigned, "kafka", None, b"", _no_clock, 30_000) == "unsigned"


def test_by_http_the_request_must_be_signed_within_the_window() -> None:
    notice = shutdown_notice(_config(), "n1", 1_000, KEYS)
    body = encode(notice)
    headers = KEYS.ring.sign_request(body, 1_000)
    assert notice_refusal(KEYS, notice, "http", headers, body, lambda: 2_000, 30_000) is None
    assert notice_refusal(KEYS, notice, "http", headers, body, lambda: 60_000,
                          30_000) == "stale_request"
    assert notice_refusal(KEYS, notice, "http", {}, body, lambda: 2_000, 30_000) is not None
