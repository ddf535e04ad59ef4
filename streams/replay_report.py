"""Side-by-side reports: PNG plots (matplotlib, Agg backend) and one self-contained HTML page.

Used by ``surplus replay --compare`` (two control settings over one log) and by
``surplus simulate --compare`` (several controllers over one scenario). Plots are for people;
the numbers of record are in the ``summary.json`` written beside them.
"""

from __future__ import annotations

import csv
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Series = tuple[Sequence[float], Sequence[float]]


def line_plot(path: Path, title: str, ylabel: str, series: Mapping[str, Series], *,
              hline: float | None = None, hline_label: str = "SLA",
              xlabel: str = "time (s)") -> Path:
    """One PNG with a line per label (and an optional horizontal reference line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.2), dpi=100)
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), label=label, linewidth=1.2, drawstyle="steps-post")
    if hline is not None:
        ax.axhline(hline, color="crimson", linestyle="--", linewidth=1, label=hline_label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if series or hline is not None:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    return path


def bar_plot(path: Path, title: str, values: Mapping[str, float], ylabel: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3), dpi=100)
    labels = list(values)
    ax.bar(labels, [values[k] for k in labels], color="steelblue")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    return path


def html_page(path: Path, title: str, table: Mapping[str, Mapping[str, Any]],
              images: Sequence[str], notes: Sequence[str] = ()) -> Path:
    """A page with the comparison table (rows: metrics, columns: labels) and the plots."""
    labels = list(table)
    metrics: list[str] = []
    for row in table.values():
        metrics += [k for k in row if k not in metrics]
    head = "".join(f"<th>{html.escape(label)}</th>" for label in labels)
    rows = []
    for metric in metrics:
        cells = "".join(f"<td>{html.escape(_cell(table[label].get(metric)))}</td>"
                        for label in labels)
        rows.append(f"<tr><th>{html.escape(metric)}</th>{cells}</tr>")
    body = "\n".join(f'<p><img src="{html.escape(name)}" alt="{html.escape(name)}"></p>'
                     for name in images)
    extra = "\n".join(f"<p>{html.escape(note)}</p>" for note in notes)
    path.write_text(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f4f4f4}}</style>
</head><body><h1>{html.escape(title)}</h1>
{extra}
<table><tr><th>metric</th>{head}</tr>
{chr(10).join(rows)}
</table>
{body}
</body></html>
""", encoding="utf-8")
    return path


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return "" if value is None else str(value)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _targets_series(rows: list[dict[str, str]], scope: str, column: str,
                    t0: float) -> Series:
    xs, ys = [], []
    for row in rows:
        if row["scope"] == scope and row["source"] == "replay":
            xs.append((int(row["ts_ms"]) - t0) / 1000.0)
            ys.append(float(row[column]))
    return xs, ys


def _p99_series(rows: list[dict[str, str]], scope: str, model: str, t0: float) -> Series:
    worst: dict[int, float] = {}
    for row in rows:
        if (row["scope"] == scope and row["model"] == model and row["enough_samples"] == "1"):
            tick = int(row["tick_ms"])
            worst[tick] = max(worst.get(tick, 0.0), float(row["p99_ms"]))
    ticks = sorted(worst)
    return [(t - t0) / 1000.0 for t in ticks], [worst[t] for t in ticks]


def write_compare_report(out: Path, labels: Sequence[str]) -> Path:
    """Plots and ``report.html`` for ``compare_offline``'s directory layout."""
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    targets = {label: read_csv(out / label / "targets.csv") for label in labels}
    windows = {label: read_csv(out / label / "windows.csv") for label in labels}
    scopes = sorted({scope for run in summary["runs"].values() for scope in run["scopes"]})
    first = [run["first_ts_ms"] for run in summary["runs"].values() if run["first_ts_ms"]]
    t0 = float(min(first)) if first else 0.0
    images: list[str] = []
    any_run = next(iter(summary["runs"].values()))
    rma_sla = any_run["config"]["rma"]["sla_p99_ms"]
    for scope in scopes:
        plots = [
            ("extra_candidates", "extra candidates per request",
             {lb: _targets_series(targets[lb], scope, "extra_candidates", t0) for lb in labels},
             None),
            ("coverage", "SBM coverage",
             {lb: _targets_series(targets[lb], scope, "coverage", t0) for lb in labels}, None),
            ("ranking_p99", "ranking p99 (ms), worst pool",
             {lb: _p99_series(windows[lb], scope, "baseline", t0) for lb in labels}, rma_sla),
        ]
        for name, ylabel, series, hline in plots:
            file = f"{_safe(scope)}_{name}.png"
            line_plot(out / file, f"{scope}: {ylabel}", ylabel, series, hline=hline)
            images.append(file)
    return html_page(out / "report.html", f"Replay of {summary['log']}: "
                     f"{' vs '.join(labels)}", summary["table"], images)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
