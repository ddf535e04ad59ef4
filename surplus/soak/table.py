"""The soak's summary as a short table for people: a row per process, start -> end (growth)."""

from __future__ import annotations

from typing import Any

COLUMNS = (("rss_mib", "RSS MiB"), ("fds", "fds"), ("threads", "threads"),
           ("consumer_lag", "lag (msgs)"), ("targets_age_s", "targets age s"))


def cell(measure: dict[str, Any] | None) -> str:
    """``start -> end (x growth)``, with a ``!`` where the measure failed; ``-`` if not judged."""
    if measure is None:
        return "-"
    start, end, ratio = measure.get("start"), measure.get("end"), measure.get("growth")
    text = f"{_num(start)} -> {_num(end)}"
    text += f" (x{ratio:.2f})" if ratio is not None else ""
    return text + ("" if measure.get("ok") else " !")


def _num(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


def table(summary: dict[str, Any]) -> str:
    """Every process, every measure; a header line saying what was compared with what."""
    rows = [("process", *(title for _, title in COLUMNS))]
    for name, proc in summary["processes"].items():
        rows.append((name, *(cell(proc["measures"].get(m)) for m, _ in COLUMNS)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"soak: {summary['minutes']:g} min, judged from {summary['warmup_s']:.0f} s "
             f"(first and last {summary['window_s']:.0f} s after the warm-up), "
             f"bound x{1 + summary['bound']:.2f}: " + ("OK" if summary["ok"] else "FAILED")]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    return "\n".join(lines)
