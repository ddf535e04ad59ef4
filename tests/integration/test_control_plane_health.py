"""The control plane's /healthz and /readyz on its metrics port, against a real broker.

Ready once the group has given it its partitions, their state is read back and each has
ticked; not ready once ticks stop (the broker is gone: ticks travel through Kafka) while still
alive; ready again when the broker returns. Uses a broker of its own, which it stops.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from schemas.kafka_config import KafkaSettings
from surplus import localkafka
from surplus.localkafka import free_port
from tests.integration.harness import Proc

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError as exc:  # not listening yet
        return 0, {"error": str(exc)}


def _wait(port: int, path: str, status: int, timeout_s: float, proc: Proc
          ) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    seen: tuple[int, dict[str, Any]] = (0, {})
    while time.monotonic() < deadline:
        assert proc.alive(), f"control plane died: {proc.output()[-3000:]}"
        seen = _probe(port, path)
        if seen[0] == status:
            return seen[1]
        time.sleep(0.25)
    raise AssertionError(f"{path} did not answer {status} within {timeout_s:.0f} s; last: "
                         f"{seen}\n{proc.output()[-2000:]}")


def test_ready_after_assignment_and_ticks_not_ready_while_the_broker_is_gone_alive_throughout(
        own_broker: tuple[KafkaSettings, Path, int], tmp_path: Path) -> None:
    kafka, data_dir, broker_port = own_broker
    config = tmp_path / "control.toml"
    config.write_text("period_s = 1.0\nttl_s = 5.0\n")
    port = free_port()
    proc = Proc(["control-plane", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix,
                 "--config", str(config), "--app-id", f"{kafka.prefix}cp", "--partitions", "2",
                 "--data-dir", str(tmp_path / "state"), "--metrics-port", str(port)],
                tmp_path / "cp.log")
    try:
        ready = _wait(port, "/readyz", 200, 90, proc)
        assert ready == {"status": "ok", "reasons": [], "partitions": [0, 1]}
        assert _probe(port, "/healthz")[0] == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert b"surplus_control_events_total" in resp.read()  # one port for all three

        localkafka.down(data_dir)
        gone = _wait(port, "/readyz", 503, 30, proc)
        assert any("last tick" in reason for reason in gone["reasons"]), gone
        assert _probe(port, "/healthz")[0] == 200  # not ready is not dead: no restart

        localkafka.up(port=broker_port, data_dir=data_dir)
        assert _wait(port, "/readyz", 200, 120, proc)["partitions"] == [0, 1]
    finally:
        proc.stop()
