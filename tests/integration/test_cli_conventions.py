"""`surplus worker` configured with no flag at all: its options from SURPLUS_WORKER_* and a
settings file, its log lines one JSON object each (SURPLUS_LOG_FORMAT=json)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.integration.test_worker_cli import TINY_TOML


def test_worker_runs_from_environment_and_settings_file_and_logs_json(tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(TINY_TOML)
    settings = tmp_path / "surplus.toml"
    settings.write_text('[worker]\npool = "eu2/rank/baseline/cpu/opportunistic"\nport = 0\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SURPLUS_")}
    env.update(SURPLUS_SETTINGS=str(settings), SURPLUS_WORKER_CONFIG=str(config),
               SURPLUS_WORKER_KAFKA="false", SURPLUS_WORKER_LOGLEVEL="info",
               SURPLUS_LOG_FORMAT="json")
    proc = subprocess.Popen([sys.executable, "-m", "surplus.cli", "worker"], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert re.search(r"ready on http://127\.0\.0\.1:\d+", line), line + proc.stderr.read()
        assert "pool eu2/rank/baseline/cpu/opportunistic" in line and "kafka off" in line
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
        records = [json.loads(raw) for raw in proc.stderr.read().splitlines() if raw.strip()]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    messages = [r["message"] for r in records if r["logger"] == "surplus.worker"]
    assert any("serving" in m for m in messages) and any("shutting down" in m for m in messages)
    assert all(r["level"] in {"INFO", "WARNING"} for r in records)
