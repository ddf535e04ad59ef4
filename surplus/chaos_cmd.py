"""`surplus chaos`: the fault suite's fleet under a seeded random schedule of faults, with every
request, notice, target and label recorded and invariants checked over the whole history."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surplus.cli_common import fail


def chaos(
    duration: Annotated[float, typer.Option(
        help="Seconds of faults and load after the fleet is up (start-up and the final "
             "read-back come on top).")] = 600.0,
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule: the same seed "
                                           "replays the same schedule.")] = 1,
    out: Annotated[Path | None, typer.Option(
        help="Output directory (default out/chaos/seed-N).")] = None,
    config: Annotated[Path | None, typer.Option(
        help="TOML settings: rate_rps, deadline_ms, ttl_s, sla_p99_ms, window_s, settle_s, "
             "label_share and a [schedule] table (mean_gap_s, warmup_s, cooldown_s, "
             "weights, holds, max_jump_ms, storm_notices).")] = None,
    plan: Annotated[bool, typer.Option(
        "--plan", help="Only print the schedule the seed draws, and exit.")] = False,
) -> None:
    """Run the fleet (three Kafka brokers, a control plane, two baseline workers and a powerful
    one, load through the client library) under a random schedule of faults: brokers killed
    and paused, the control plane killed -9, workers killed and frozen, network delays and
    cuts through toxiproxy, clock jumps, notice storms, duplicated and reordered targets,
    forged messages. Then check the invariants over the recorded history (history.jsonl,
    summary.json in --out); prints the faults by kind and each violation with its window,
    and exits 1 on any violation.
    """
    from surplus.chaos import config as chaos_config
    from surplus.chaos.run import Chaos, ChaosError, Options, report
    from surplus.chaos.schedule import by_kind, draw

    settings = chaos_config.ChaosConfig()
    if config is not None:
        try:
            settings = chaos_config.parse(config.read_text(), str(config))
        except OSError as exc:
            fail(f"cannot read {config}: {exc.strerror}")
        except ValueError as exc:
            fail(str(exc))
    floor = settings.schedule.warmup_s + settings.schedule.cooldown_s
    if duration <= floor:
        fail(f"--duration must be longer than the schedule's warm-up and cool-down "
             f"({floor:g} s), got {duration:g}")
    if plan:
        faults = draw(seed, duration, settings.schedule)
        for fault in faults:
            typer.echo(f"{fault.at_s:8.1f}s {fault.kind:<13} {fault.target:<5} "
                       f"{fault.hold_s:5.1f}s {fault.param}")
        typer.echo(f"faults by kind: {by_kind(faults)}")
        return
    out = out or Path("out/chaos") / f"seed-{seed}"
    try:
        result = Chaos(Options(seed=seed, duration_s=duration, out=out, config=settings),
                       say=typer.echo).run()
    except (ChaosError, AssertionError, OSError) as exc:
        fail(f"chaos run could not go on: {exc}".splitlines()[0])
    report(result, typer.echo)
    if result.summary.get("crashed"):
        typer.echo(f"crashed: {result.summary['crashed']}")
    if result.violations or result.summary.get("crashed"):
        raise typer.Exit(1)
