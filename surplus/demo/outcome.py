"""What a demo run leaves in its output folder for its reader: ``run.json``, the report and
summary built from what is on disk, and the verdict line.

The report is built only from files, never from the run's memory, so a run stopped at any
point (Ctrl-C, a failed start) is reported as far as it went, and an old report is never
mistaken for the new one: a run clears the previous run's outputs before it starts.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from surplus.demo import report
from surplus.demo.analysis import RunInfo
from surplus.demo.options import Ports
from surplus.demo.runinfo import verdict

#: The files of a previous run in the same folder, removed before a run starts.
OUTPUTS = ("summary.json", "report.html", "run.json", report.EVENT_LOG, report.SLICES,
           "worker_metrics.json", report.PRECOMPUTE_AUDIT, "latency.png", "targets.png",
           "capacity.png", "shedding.png")


def clear(out: Path) -> None:
    """Remove a previous run's outputs (files, the load's folder, the processes' logs)."""
    for name in OUTPUTS:
        (out / name).unlink(missing_ok=True)
    shutil.rmtree(out / "loadgen", ignore_errors=True)
    shutil.rmtree(out / "logs", ignore_errors=True)


def endpoints(ports: Ports, prometheus_port: int) -> dict[str, int]:
    """Every process's metrics port by name (Prometheus only when it ran)."""
    p = ports
    return {"control-plane": p.control, "scheduler": p.scheduler, "loadgen": p.loadgen,
            **p.workers, **({"prometheus": prometheus_port} if prometheus_port else {})}


def write(out: Path, info: RunInfo, say: Callable[[str], None]) -> str | None:
    """``run.json``, then the report and the verdict; why the report failed, else None.

    A report problem is returned rather than raised: it must not hide the run's own outcome.
    """
    (out / "run.json").write_text(json.dumps(asdict(info), indent=2) + "\n")
    try:
        summary = report.build(out)
    except Exception as exc:
        say(f"report: could not be built: {type(exc).__name__}: {exc}")
        return f"report failed: {exc}"
    say(verdict(summary))
    say(f"report: {out / 'report.html'}  summary: {out / 'summary.json'}  "
        f"event log: {out / report.EVENT_LOG}")
    return None
