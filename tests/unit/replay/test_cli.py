"""`surplus replay`, `simulate` and `record`: results on success, one line on failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from surplus.cli import app
from tests.unit.replay.helpers import write_small_log

runner = CliRunner()


def _fails_with(args: list[str], fragment: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and fragment in lines[0], result.output


def test_replay_offline_writes_its_three_files(tmp_path: Path) -> None:
    write_small_log(tmp_path / "log.jsonl")
    result = runner.invoke(app, ["replay", str(tmp_path / "log.jsonl"), "--offline", "--out",
                                 str(tmp_path / "out"), "--set", "period_s=5", "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["period_s"] == 5.0 and summary["ticks"] == 12
    assert (tmp_path / "out" / "targets.csv").is_file()
    assert (tmp_path / "out" / "windows.csv").is_file()


def test_replay_through_shards_writes_the_targets_one_reader_does(tmp_path: Path) -> None:
    write_small_log(tmp_path / "log.jsonl")
    for out, extra in (("one", []), ("split", ["--shards", "2"])):
        result = runner.invoke(app, ["replay", str(tmp_path / "log.jsonl"), "--offline",
                                     "--out", str(tmp_path / out), "--quiet", *extra])
        assert result.exit_code == 0, result.output
    assert "through 2 shards" in result.output
    assert ((tmp_path / "split" / "targets.csv").read_bytes()
            == (tmp_path / "one" / "targets.csv").read_bytes())
    _fails_with(["replay", str(tmp_path / "log.jsonl"), "--offline", "--out",
                 str(tmp_path / "x"), "--shards", "2", "--compare", str(tmp_path / "log.jsonl"),
                 str(tmp_path / "log.jsonl")], "--shards replays one config")


def test_replay_compare_takes_two_config_files(tmp_path: Path) -> None:
    write_small_log(tmp_path / "log.jsonl")
    (tmp_path / "slow.toml").write_text("period_s = 20.0\n")
    (tmp_path / "fast.toml").write_text("period_s = 5.0\n")
    result = runner.invoke(app, ["replay", str(tmp_path / "log.jsonl"), "--offline", "--out",
                                 str(tmp_path / "cmp"), "--compare", str(tmp_path / "slow.toml"),
                                 str(tmp_path / "fast.toml"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cmp" / "report.html").is_file()
    assert {p.name for p in (tmp_path / "cmp").iterdir() if p.is_dir()} == {"slow", "fast"}


@pytest.mark.parametrize(("args", "fragment"), [
    (["replay", "{log}", "--offline", "--to-kafka"], "exactly one of"),
    (["replay", "{dir}/nope.jsonl", "--offline", "--out", "{dir}/o"], "no such event log"),
    (["replay", "{log}", "--offline"], "--out"),
    (["replay", "{log}", "--offline", "--out", "{dir}/o", "--set", "rma.kq=1"], "rma.kq"),
    (["replay", "{log}", "--offline", "--out", "{dir}/o", "--set", "oops"], "key=value"),
    (["replay", "{bad}", "--offline", "--out", "{dir}/o", "--strict"], ":2: "),
    (["simulate", "preemption_storm", "--out", "{dir}/s", "--controller", "clever"],
     "unknown controller"),
    (["simulate", "no_such_scenario", "--out", "{dir}/s"], "no scenario file"),
    (["record", "--out", "{dir}/r.jsonl", "--from", "yesterday"], "start must be"),
    (["record", "--out", "{dir}/r.jsonl", "--topics", "gossip"], "unknown topics"),
])
def test_failures_exit_1_with_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    log = tmp_path / "log.jsonl"
    write_small_log(log, seconds=5)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(log.read_bytes().split(b"\n", 1)[0] + b"\n{not json}\n")
    _fails_with([a.format(log=log, dir=tmp_path, bad=bad) for a in args], fragment)


def test_simulate_one_controller_and_a_comparison(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", "preemption_storm", "--controller", "pid",
                                 "--out", str(tmp_path / "one"), "--duration", "10", "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["controller"] == "surplus" and summary["duration_s"] == 10.0
    assert (tmp_path / "one" / "events.jsonl.zst").is_file()
    result = runner.invoke(app, ["simulate", "preemption_storm", "--compare", "surplus,off",
                                 "--out", str(tmp_path / "cmp"), "--duration", "10", "--seed",
                                 "3", "--quiet"])
    assert result.exit_code == 0, result.output
    table = json.loads((tmp_path / "cmp" / "summary.json").read_text())["table"]
    assert set(table) == {"surplus", "off"} and table["off"]["incremental_value"] == 0.0


def test_compare_against_the_best_static_setting(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["simulate", "preemption_storm", "--compare",
                                 "surplus,best-static", "--out", str(out), "--duration", "10",
                                 "--static-grid", "extra=0,50 coverage=0", "--jobs", "1",
                                 "--quiet"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    table, best = summary["table"], summary["best_static"]
    assert set(table) == {"surplus", "best-static"}
    assert [(r["extra_candidates"], r["coverage"]) for r in best["sweep"]] == [(0, 0.0),
                                                                                (50, 0.0)]
    setting = table["best-static"]["static_setting"]
    assert (setting["extra_candidates"], setting["coverage"]) == (
        best["chosen"]["extra_candidates"], best["chosen"]["coverage"])
    assert table["best-static"]["incremental_value"] == best["chosen"]["incremental_value"] > 0
    ratio = table["surplus"]["incremental_value"] / table["best-static"]["incremental_value"]
    assert table["surplus"]["value_vs_best_static"] == pytest.approx(ratio, abs=1e-6)
    assert summary["value_vs_best_static"] == {"surplus": table["surplus"][
        "value_vs_best_static"]}
    assert "value_vs_best_static=" in result.output and "static_setting=" in result.output
    page = (out / "report.html").read_text()
    assert "value_vs_best_static" in page and "best-static/sweep/" in page
    _fails_with(["simulate", "preemption_storm", "--compare", "surplus,best-static", "--out",
                 str(tmp_path / "bad"), "--static-grid", "extra=lots"], "--static-grid")
