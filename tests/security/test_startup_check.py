"""The start-up check tells a cluster that is not there yet from one that refuses us: the first
is not a configuration error (a worker serves baseline until Kafka answers), the second is."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from schemas.kafka_config import KafkaSettings
from surplus import localkafka
from surplus.kafka_check import check
from tests.integration.fleet import TINY_MODEL


def test_unreachable_cluster_is_reported_as_such_not_as_an_error() -> None:
    result = check(KafkaSettings(bootstrap=f"127.0.0.1:{localkafka.free_port()}"), timeout_s=2)
    assert result.outcome == "unreachable" and 1.5 < result.seconds < 5


@pytest.mark.slow
def test_worker_warns_and_serves_baseline_when_kafka_is_not_up_yet(tmp_path: Path) -> None:
    config = tmp_path / "w.toml"
    config.write_text('worker_id = "early"\n' + TINY_MODEL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SURPLUS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "surplus.cli", "worker", "--config", str(config), "--port", "0",
         "--bootstrap", f"127.0.0.1:{localkafka.free_port()}", "--loglevel", "error"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        warning = proc.stderr.readline()
        assert warning.startswith("warning: Kafka at 127.0.0.1:") and "carrying on" in warning
        ready = proc.stdout.readline()
        url = re.search(r"ready on (http://[\d.]+:\d+)", ready)
        assert url, ready
        with urllib.request.urlopen(url.group(1) + "/healthz", timeout=10) as resp:
            assert resp.status == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
