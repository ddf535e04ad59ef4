"""`surplus record`: tap the live topics into an event log."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from surplus.cli_common import Bootstrap, Prefix, fail, kafka_settings


def record(
    out: Annotated[Path, typer.Option(
        help="Event log to write (.jsonl, or .jsonl.zst for zstd).")],
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    start: Annotated[str, typer.Option(
        "--from", help="beginning | end | time:<ms or ISO-8601> | offset:<n>.")]
    = "beginning",
    duration: Annotated[float | None, typer.Option(
        help="Stop after this many seconds (default: until Ctrl-C).")] = None,
    stop_at_end: Annotated[bool, typer.Option(
        "--stop-at-end", help="Stop once every partition is caught up.")] = False,
    topics: Annotated[str, typer.Option(
        help="Logical topics to record, comma-separated.")]
    = "telemetry,capacity,preemption,targets,outcomes,overrides,labels,estimates",
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress line.")] = False,
) -> None:
    """Record live topics into an event log (from a time or offset, for a duration)."""
    from streams.eventlog import TOPICS
    from streams.replay_live import LiveError, StartAt, record_log

    try:
        start_at = StartAt.parse(start)
    except ValueError as exc:
        fail(str(exc))
    chosen = tuple(t.strip() for t in topics.split(",") if t.strip())
    unknown = [t for t in chosen if t not in TOPICS]
    if unknown or not chosen:
        fail(f"unknown topics {unknown}; known: {', '.join(TOPICS)}")
    if duration is not None and duration <= 0:
        fail(f"--duration must be > 0, got {duration}")
    settings = kafka_settings(bootstrap, prefix)
    try:
        stats = record_log(settings, out, topics=chosen, start=start_at, duration_s=duration,
                           stop_at_end=stop_at_end, progress=not quiet)
    except (LiveError, OSError, ValueError) as exc:
        fail(str(exc))
    invalid = sum(stats.invalid.values())
    typer.echo(f"recorded {stats.events:,} events from {stats.partitions} partitions "
               f"({invalid} invalid skipped, {stats.out_of_order} out of order) to {out} "
               f"[{stats.stopped}]")
    for reason, n in sorted(stats.invalid.items()):
        typer.echo(f"invalid {n}: {reason}", err=True)
