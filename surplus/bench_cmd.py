"""`surplus bench [NAME...]`: benchmarks in bench/, one JSON object each, or all into a table.

`surplus bench shed` (or client, batching, ingest, replay, join, transport, fleet) prints
that benchmark's JSON object (`surplus bench fleet --replicas N --rps R --sample s
--processes K --seconds T` sizes the fleet); `surplus bench` runs all of them and writes one table
(--out/bench.json).

Each benchmark runs in a child process (``python -c`` calling its ``run(...)``) from the
repository root: a fresh interpreter per benchmark, so torch threads, event loops and Faust
state of one cannot skew the next, and a crash is one failed row, not a lost table. The Kafka
benchmarks share one broker: ``$KAFKA_BOOTSTRAP_SERVERS``, or a local one started for the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from schemas.clock import wall_ms
from surplus.cli_common import fail
from surplus.localkafka import REPO_ROOT


@dataclass(frozen=True)
class Bench:
    name: str
    module: str
    kwargs: dict[str, Any]
    kafka: bool = False
    metric: str = ""
    target: str = ""


BENCHES = (
    Bench("client", "client_decision", {"n": 200_000}, metric="decision_us_median",
          target="<= 10 us"),
    Bench("replay", "replay", {"seconds": 600, "workers": 100, "repeat": 3},
          metric="events_per_s", target=">= 200000 events/s"),
    Bench("batching", "batching", {"seconds": 1.5}, metric="batched_vs_unbatched",
          target=">= 3x unbatched"),
    Bench("shed", "preemption", {"notices": 200}, kafka=True,
          metric="notice_to_shed_p99_ms", target="<= 5 ms"),
    Bench("ingest", "ingest", {}, kafka=True, metric="reports_per_s",
          target=">= 20000 reports/s and ratio >= 0.5"),
    Bench("join", "join", {"labels": 200_000}, metric="labels_per_s",
          target=">= 50000 labels/s"),
    Bench("transport", "transport", {"candidates": 2000}, metric="json_vs_msgpack_decode",
          target=">= 5x cheaper per candidate"),
    # A synthetic fleet into the broker, the control plane as real processes (short default;
    # `surplus bench fleet --replicas N --rps R --sample s --processes K --seconds T`).
    Bench("fleet", "fleet", {"replicas": 200, "rps": 2000.0, "sample": 0.1, "processes": 2,
                             "seconds": 30.0}, kafka=True, metric="cpu_us_per_event",
          target="keeps up, targets <= 2 s after close, <= 10 us/event, <= 2x raw"),
    # A worker in front of MLServer (make mlserver) against one scoring in process.
    Bench("oip", "oip", {"notices": 300}, metric="ratio_p99",
          target="<= 1.2x the in-process worker's notice-to-shed p99"),
)


def with_args(bench: Bench, overrides: dict[str, Any]) -> Bench:
    """`bench` with some of its keyword arguments given on the command line."""
    return Bench(bench.name, bench.module, {**bench.kwargs, **overrides}, bench.kafka,
                 bench.metric, bench.target)


def _pick(result: dict[str, Any], dotted: str) -> Any:
    value: Any = result
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def meets(name: str, result: dict[str, Any]) -> bool | None:
    """Whether a result meets its DESIGN.md target (as the benchmark itself judges it)."""
    for key in ("meets_target", "within_target"):
        if key in result:
            return bool(result[key])
    return None


def run_one(bench: Bench, bootstrap: str | None, timeout_s: float) -> dict[str, Any]:
    """One benchmark in a child interpreter; its row of the table."""
    kwargs = dict(bench.kwargs, **({"bootstrap": bootstrap} if bench.kafka else {}))
    code = (f"import json, bench.{bench.module} as b; "
            f"print(json.dumps(b.run(**json.loads({json.dumps(json.dumps(kwargs))}))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    started = time.monotonic()
    row: dict[str, Any] = {"bench": bench.name, "metric": bench.metric, "target": bench.target,
                           "params": bench.kwargs}
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {**row, "ok": False, "error": f"timed out after {timeout_s:.0f}s",
                "seconds": round(time.monotonic() - started, 1)}
    row["seconds"] = round(time.monotonic() - started, 1)
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except ValueError:
        result = None
    if not isinstance(result, dict):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**row, "ok": False, "error": f"exit {proc.returncode}: {tail[0][:300]}"}
    return {**row, "ok": True, "value": _pick(result, bench.metric),
            "meets_target": meets(bench.name, result), "result": result}


def bench(
    names: Annotated[list[str] | None, typer.Argument(
        help="Benchmarks to run: client, shed, batching, ingest, replay, join, transport, "
             "fleet, oip (default: all).")]
    = None,
    out: Annotated[Path, typer.Option(help="Directory for bench.json.")] = Path("out/bench"),
    timeout: Annotated[float, typer.Option(help="Seconds each benchmark may take.")] = 900.0,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Exit 1 when a benchmark misses its target, not only when it fails.")]
    = False,
    replicas: Annotated[int | None, typer.Option(
        min=1, help="fleet: replicas of the synthetic fleet (one WindowReport each a second).")]
    = None,
    rps: Annotated[float | None, typer.Option(min=1.0, help="fleet: the fleet's requests/s.")]
    = None,
    sample: Annotated[float | None, typer.Option(
        min=0.0001, max=1.0, help="fleet: share of decisions logged (the holdout always is).")]
    = None,
    processes: Annotated[int | None, typer.Option(
        min=1, help="fleet: control-plane processes (`surplus control-plane`).")] = None,
    seconds: Annotated[float | None, typer.Option(
        min=5.0, help="fleet: seconds the fleet writes.")] = None,
    regions: Annotated[int | None, typer.Option(
        min=1, help="fleet: scopes the fleet is spread over (default: max(4, 2 x processes)).")]
    = None,
    stages: Annotated[int | None, typer.Option(
        min=1, max=2, help="fleet: 2 runs the control plane in two stages, the reports keyed "
                           "by replica, so one scope spreads over every process.")] = None,
) -> None:
    """Run benchmarks: one prints its JSON object; all write one table (--out/bench.json).

    Client decision, preemption notice to shed, dynamic batching, control-plane ingest,
    offline replay, the label join, the ranking request's decode in msgpack against JSON
    (transport), and a synthetic fleet against control-plane processes (fleet); exits 1 if a
    benchmark failed to run.
    """
    from bench.common import broker

    fleet_args = {k: v for k, v in {"replicas": replicas, "rps": rps, "sample": sample,
                                    "processes": processes, "seconds": seconds,
                                    "regions": regions, "stages": stages}.items()
                  if v is not None}
    chosen = [with_args(b, fleet_args) if b.name == "fleet" else b
              for b in BENCHES if not names or b.name in names]
    unknown = set(names or ()) - {b.name for b in BENCHES}
    if unknown or not chosen:
        fail(f"unknown benchmarks {sorted(unknown)}; known: {', '.join(b.name for b in BENCHES)}")
    if fleet_args and not any(b.name == "fleet" for b in chosen):
        fail(f"--{', --'.join(fleet_args)} size the fleet benchmark: name it (surplus bench fleet)")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with ExitStack() as stack:
        bootstrap = None
        if any(b.kafka for b in chosen):
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="surplus-bench-")))
            bootstrap = stack.enter_context(broker(tmp))
        for b in chosen:
            typer.echo(f"bench {b.name} ...", err=True)
            row = run_one(b, bootstrap, timeout)
            rows.append(row)
            verdict = (f"{row['value']} ({'meets' if row['meets_target'] else 'MISSES'} "
                       f"{row['target']})" if row["ok"] else f"FAILED: {row['error']}")
            typer.echo(f"bench {b.name}: {b.metric} = {verdict} in {row['seconds']}s", err=True)
    table = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
             "created_unix_s": wall_ms() // 1000, "benchmarks": rows}
    (out / "bench.json").write_text(json.dumps(table, indent=2) + "\n")
    if len(rows) == 1 and rows[0]["ok"]:
        typer.echo(json.dumps(rows[0]["result"]))
    typer.echo(f"table: {out / 'bench.json'}", err=True)
    failed = [r["bench"] for r in rows if not r["ok"]]
    missed = [r["bench"] for r in rows if r["ok"] and r["meets_target"] is False]
    if failed:
        fail(f"benchmarks failed to run: {', '.join(failed)}")
    if strict and missed:
        fail(f"benchmarks missed their targets: {', '.join(missed)}")
