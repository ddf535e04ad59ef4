"""`surplus replay LOG`: run an event log offline through the control core, or into Kafka."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from surplus.cli_common import Bootstrap, Prefix, fail, kafka_settings

SetOption = Annotated[list[str] | None, typer.Option(
    "--set", help="Override a control setting, e.g. --set rma.kp=0.1 (repeatable).")]


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """``key=value`` pairs from repeated ``--set`` options; a malformed one fails the command."""
    overrides: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail(f"--set expects key=value, got {item!r}")
        overrides[key.strip()] = value.strip()
    return overrides


def control_config(path: Path | None, overrides: dict[str, str]) -> Any:
    """A ControlConfig from an optional TOML file plus overrides; a bad key fails with its name."""
    from streams.control.config import ConfigError, ControlConfig, load_config, with_overrides

    try:
        config = load_config(path) if path else ControlConfig()
        return with_overrides(config, overrides) if overrides else config
    except ConfigError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot read control config {path}: {exc}")


def replay(
    log: Annotated[Path, typer.Argument(help="Event log (.jsonl or .jsonl.zst).")],
    offline: Annotated[bool, typer.Option(
        "--offline", help="Run the control core over the log on a virtual clock.")] = False,
    to_kafka: Annotated[bool, typer.Option(
        "--to-kafka", help="Publish the log into Kafka topics.")] = False,
    out: Annotated[Path | None, typer.Option(
        help="Output directory (offline): targets.csv, windows.csv, summary.json.")] = None,
    config: Annotated[Path | None, typer.Option(
        help="ControlConfig TOML for the offline run.")] = None,
    set_: SetOption = None,
    compare: Annotated[tuple[Path, Path] | None, typer.Option(
        help="Two ControlConfig TOML files to run side by side (offline).")] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Stop at the first bad line instead of counting and skipping it.")]
    = False,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    speed: Annotated[float, typer.Option(
        help="To Kafka: 1 = real time, X = X times faster, 0 = as fast as possible.")] = 1.0,
    rebase: Annotated[bool, typer.Option(
        "--rebase", help="To Kafka: shift all timestamps so the log starts now.")] = False,
    delivery_timeout: Annotated[float, typer.Option(
        help="To Kafka: seconds a message may wait for delivery before it counts as failed.")]
    = 30.0,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress line.")] = False,
    shards: Annotated[int, typer.Option(
        min=0, max=1024,
        help="Offline: pass each scope's reports through this many first-stage shards, as a "
             "scaled-out control plane (stages = 2) does; 0: one reader a scope.")] = 0,
) -> None:
    """Replay an event log: --offline --out DIR, or --to-kafka --bootstrap B --speed X."""
    from streams.eventlog import EventLogError

    if offline == to_kafka:
        fail("choose exactly one of --offline and --to-kafka")
    if not log.is_file():
        fail(f"no such event log: {log}")
    try:
        if to_kafka:
            _to_kafka(log, bootstrap, prefix, speed, rebase, strict, not quiet,
                      delivery_timeout)
        else:
            _offline(log, out, config, parse_sets(set_), compare, strict, not quiet, shards)
    except EventLogError as exc:
        fail(str(exc))


def _offline(log: Path, out: Path | None, config_path: Path | None,
             overrides: dict[str, str], compare: tuple[Path, Path] | None, strict: bool,
             progress: bool, shards: int = 0) -> None:
    from streams.replay import compare_offline, replay_offline

    if out is None:
        fail("--offline needs --out DIR")
    if compare:
        if config_path is not None:
            fail("--compare takes the two configs itself; drop --config")
        if shards:
            fail("--shards replays one config; drop --compare")
        labels = _labels(compare)
        runs = [(label, control_config(path, overrides)) for label, path in zip(labels, compare,
                                                                             strict=True)]
        summary = compare_offline(log, runs, out, strict=strict, progress=progress)
        for label in labels:
            row = summary["table"][label]
            typer.echo(f"{label}: {row['targets']} targets, mean extra candidates "
                       f"{row['mean_extra_candidates']}, mean coverage {row['mean_coverage']}, "
                       f"ranking SLA violation windows {row['ranking_sla_violation_windows']}")
        typer.echo(f"report: {out / 'report.html'}")
        return
    summary = replay_offline(log, control_config(config_path, overrides), out, strict=strict,
                             progress=progress, shards=shards)
    read = summary["read"]
    typer.echo(f"{read['events']:,} events ({read['bad_lines']} bad lines), "
               f"{summary['ticks']:,} ticks, {len(summary['scopes'])} scopes"
               f"{f' through {shards} shards' if shards else ''} -> {out}")


def _labels(paths: tuple[Path, Path]) -> list[str]:
    a, b = paths[0].stem, paths[1].stem
    return [a, b] if a != b else ["a", "b"]


def _to_kafka(log: Path, bootstrap: str | None, prefix: str | None, speed: float,
              rebase: bool, strict: bool, progress: bool, delivery_timeout: float) -> None:
    from streams.replay_live import LiveError, publish_log

    if speed < 0:
        fail(f"--speed must be >= 0, got {speed}")
    if delivery_timeout <= 0:
        fail(f"--delivery-timeout must be > 0, got {delivery_timeout}")
    settings = kafka_settings(bootstrap, prefix)
    try:
        stats = publish_log(log, settings, speed=speed, rebase=rebase, strict=strict,
                            progress=progress, delivery_timeout_s=delivery_timeout)
    except LiveError as exc:
        fail(str(exc))
    if stats.failed:
        fail(f"{stats.failed} of {stats.events} events not delivered to {settings.bootstrap}: "
             f"{stats.first_error}")
    typer.echo(f"published {stats.delivered:,} events ({stats.bad_lines} bad lines skipped) "
               f"to {settings.bootstrap} with prefix {settings.prefix!r} "
               f"in {stats.seconds:.1f}s")
