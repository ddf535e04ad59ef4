"""Each process of a demo run reaches the run's cluster under its prefix, and every one that
reads or writes signed messages is given the run's key directory."""

from __future__ import annotations

import itertools
from pathlib import Path

from schemas.kafka_config import KafkaSettings
from surplus.demo import commands, outcome
from surplus.live import plan

KAFKA = KafkaSettings(bootstrap="127.0.0.1:9092", prefix="run.")
KEYS = Path("/keys")


def _pairs(args: list[str]) -> dict[str, str]:
    return {a: b for a, b in itertools.pairwise(args) if a.startswith("--")}


def test_every_process_reaches_the_run_cluster_and_the_signers_get_its_keys() -> None:
    replica = plan.replicas(plan.load(plan.DEFAULT_SCENARIO, 60.0)[0].regions[0])[0]
    times = commands.timeline(plan.DEFAULT_SCENARIO, 60.0, 1234)
    signed = {
        "control-plane": commands.control_plane(KAFKA, KEYS, config=Path("c.toml"), port=1,
                                                data_dir=Path("d")),
        "worker": commands.worker(KAFKA, KEYS, config=Path("w.toml"), replica=replica, port=2),
        "scheduler": commands.scheduler(times, KAFKA, KEYS, port=3),
        "loadgen": commands.loadgen(times, KAFKA, KEYS, rate=None, out=Path("lg"), port=4),
    }
    for name, args in {**signed, "record": commands.recorder(Path("e"), 5, KAFKA)}.items():
        assert args[0] == name
        assert _pairs(args)["--bootstrap"] == KAFKA.bootstrap
        assert _pairs(args)["--prefix"] == KAFKA.prefix
    for args in signed.values():
        assert _pairs(args)["--signing-key-file"] == str(KEYS)
    assert _pairs(signed["loadgen"])["--start-at-ms"] == "1234"
    assert "--membership" in signed["loadgen"] and "--rate" not in signed["loadgen"]
    assert _pairs(commands.loadgen(times, KAFKA, KEYS, rate=5.0, out=Path("lg"),
                                   port=4))["--rate"] == "5.0"


def test_a_run_clears_the_previous_runs_outputs(tmp_path: Path) -> None:
    for name in outcome.OUTPUTS:
        (tmp_path / name).write_text("old")
    (tmp_path / "loadgen").mkdir()
    (tmp_path / "keep.txt").write_text("mine")
    outcome.clear(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
