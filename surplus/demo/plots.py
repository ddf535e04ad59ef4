"""The demo's four PNG plots (latency, targets, capacity, shedding), drawn from what a run
recorded: for people, never the numbers of record (``summary.json`` is, see ``report``).
matplotlib is imported only when a plot is drawn, so the summary needs none of it."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from surplus.demo import analysis
from surplus.demo.analysis import Recorded, Requests, RunInfo, Series
from surplus.demo.slices import Sample


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _storms(ax: Any, info: RunInfo, label: bool = True) -> None:
    for i, (a, b) in enumerate(info.storms):
        ax.axvspan(a, b, color="orange", alpha=0.15,
                   label="preemption storm" if label and i == 0 else None)


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    _pyplot().close(fig)
    return path.name


def draw(out: Path, info: RunInfo, rec: Recorded | None, req: Requests | None,
          samples: list[tuple[float, Sample]] | None = None) -> list[str]:
    """Draw every plot a run's records allow into ``out``; the file names, for the page."""
    images: list[str] = []
    if rec is None:
        return images
    images.append(latency_plot(out / "latency.png", info, rec, req))
    images.append(targets_plot(out / "targets.png", info, rec))
    images.append(capacity_plot(out / "capacity.png", info, rec, samples or []))
    images.append(shedding_plot(out / "shedding.png", info, rec,
                                read_lines(out / "loadgen" / "loadgen.jsonl")))
    return images


def latency_plot(path: Path, info: RunInfo, rec: Recorded, req: Requests | None) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.6), dpi=100)
    windows = [w for w in analysis.sla_windows(rec.telemetry, info) if w.p99_ms is not None]
    ax.plot([w.start_s for w in windows], [w.p99_ms for w in windows], drawstyle="steps-post",
            label="ranking pools p99 (worker, worst pool)", color="tab:blue")
    if req is not None:
        cx, cy = analysis.client_windows(req, info)
        ax.plot(cx, cy, drawstyle="steps-post", label="ranking requests p99 (client, end to end)",
                color="tab:green", alpha=0.7)
    px, py = analysis.powerful_p99(rec.telemetry, info)
    if px:
        ax.plot(px, py, drawstyle="steps-post", label="powerful pool p99 (worker)",
                color="tab:purple", alpha=0.6)
    ax.axhline(info.sla_p99_ms, color="crimson", linestyle="--", label="ranking SLA (p99)")
    _storms(ax, info)
    ax.set(title=f"Latency vs SLA ({info.period_ms / 1000:g} s windows)", xlabel="time (s)",
           ylabel="p99 latency (ms)")
    ax.set_xlim(0, info.duration_s)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)


def targets_plot(path: Path, info: RunInfo, rec: Recorded) -> str:
    plt = _pyplot()
    series = analysis.targets_series(rec.targets, info)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 4.4), dpi=100, sharex=True)
    _step(a1, series["extra_candidates"], "RMA extra candidates / request", "tab:blue")
    _step(a2, series["coverage"], "SBM coverage", "tab:purple")
    for ax in (a1, a2):
        _storms(ax, info, label=ax is a1)
        for t in rec.notices:
            ax.axvline((t - info.start_ms) / 1000.0, color="crimson", linewidth=0.8,
                       label="preemption notice" if ax is a1 and t == rec.notices[0] else None)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper left", fontsize=8)
    a1.set(title="Targets over time (ControlTargets on the targets topic)",
           ylabel="candidates")
    a2.set(xlabel="time (s)", ylabel="share of requests")
    a2.set_xlim(0, info.duration_s)
    return _save(fig, path)


def _step(ax: Any, series: Series, label: str, color: str) -> None:
    xs, ys = series
    ax.plot(xs, ys, drawstyle="steps-post", label=label, color=color)


def capacity_plot(path: Path, info: RunInfo, rec: Recorded,
                  samples: list[tuple[float, Sample]]) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.6), dpi=100)
    _step(ax, analysis.lent_series(rec.capacity, info), "lent by the scheduler (units)",
          "tab:orange")
    ux, uy = analysis.per_second(rec.telemetry, "used_units", info)
    if samples:
        sx, sy = analysis.slice_busy_per_second(samples, info)
        ax.plot(sx, sy, label="CPU used / quota of the replicas' slices (cgroup)",
                color="tab:red", linewidth=1)
    ax.plot(ux, uy, label="busy share of the opportunistic replicas (reported)",
            color="tab:blue", linewidth=1)
    _, optional = analysis.per_second(rec.telemetry, "optional_units_busy", info)
    ax.plot(ux, optional, label="of which optional work (measured busy time)",
            color="tab:green", linewidth=1)
    _storms(ax, info, label=False)
    ax.set(title="Opportunistic capacity: lent vs used", xlabel="time (s)",
           ylabel="accelerator units")
    ax.set_xlim(0, info.duration_s)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, path)


def shedding_plot(path: Path, info: RunInfo, rec: Recorded, lines: list[dict[str, Any]]) -> str:
    """What became of the optional work on offer, per second, around the first storm: done,
    shed by workers, cut by the client, or not asked for by the targets (and why)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.0), dpi=100)
    lo, hi = 0.0, info.duration_s
    if info.storms:
        a, b = info.storms[0]
        lo, hi = max(0.0, a - 20.0), min(info.duration_s, b + 20.0)
    xs = [float(line["t_s"]) - 1.0 for line in lines]
    keys = sorted({k for line in lines for k in line.get("optional", {})}, key=_fate_order)
    stacks = [[float(line.get("optional", {}).get(k, 0)) for line in lines] for k in keys]
    if xs and keys:
        colors = [_fate_color(k) for k in keys]
        ax.stackplot(xs, stacks, labels=[_fate_label(k) for k in keys], colors=colors,
                     step="post", alpha=0.85)
    reasons = analysis.shed_reasons(rec.telemetry)
    if reasons:
        wx = analysis.per_second(rec.telemetry, reasons[0], info)[0]
        wy = np.sum([analysis.per_second(rec.telemetry, r, info)[1] for r in reasons], axis=0)
        ax.plot(wx, wy, color="black", linewidth=1.0, drawstyle="steps-post",
                label="shed by workers (their own telemetry)")
    for t in rec.notices:
        ax.axvline((t - info.start_ms) / 1000.0, color="crimson", linewidth=0.8)
    _storms(ax, info)
    ax.set(title="Extra candidates on offer per second: done, shed, cut or not targeted",
           xlabel="time (s)", ylabel="candidate rows / s")
    ax.set_xlim(lo, hi)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    return _save(fig, path)


def _fate_order(key: str) -> tuple[int, str]:
    rank = {"done": 0, "worker": 1, "fallback": 2, "lost": 2, "client": 3, "untargeted": 4}
    return rank.get(key.split("/")[0], 5), key


def _fate_label(key: str) -> str:
    kind, _, reason = key.partition("/")
    return {"done": "done", "worker": f"shed by worker: {reason}",
            "client": f"cut by client: {reason}", "fallback": "lost in fallback",
            "lost": "lost", "untargeted": f"not targeted: {reason.replace('_', ' ')}"}.get(
        kind, key)


def _fate_color(key: str) -> str:
    kind, _, reason = key.partition("/")
    if kind == "done":
        return "tab:green"
    if kind == "worker":
        return "tab:red"
    if kind == "client":
        return "tab:orange"
    if kind == "untargeted":
        return {"below_demand": "lightgray", "targets_zero": "darkgray"}.get(reason, "dimgray")
    return "tab:brown"


def read_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    try:
        with path.open() as fh:
            for raw in fh:
                with contextlib.suppress(ValueError):
                    out.append(json.loads(raw))
    except OSError:
        return []
    return out
