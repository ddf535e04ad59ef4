"""A run directory -> ``summary.json``, four PNG plots and ``report.html``.

Reads only files the run left behind (``run.json``, the event log, the load generator's files,
the workers' metrics scraped at the end), so ``surplus demo --report DIR`` rebuilds the same
report later. The numbers of record are in ``summary.json``; plots are for people.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from streams.replay_report import html_page
from surplus import localkafka
from surplus.demo import analysis, plots, reactions
from surplus.demo.analysis import Recorded, Requests, RunInfo
from surplus.demo.slices import Sample, busy_share

EVENT_LOG = "events.jsonl.zst"
SLICES = "slices.jsonl"
"""The opportunistic replicas' CPU slices' usage counters, sampled about once a second."""
BROKER_GC_LOG = "logs/kafka-gc.log"
"""The embedded broker's collector log, kept from its data directory when the run ends."""
#: Every precompute job checked against the answers at the end (`precompute_audit`).
PRECOMPUTE_AUDIT = "precompute_audit.json"
ATTRIBUTION = "Arrivals: Azure LLM inference trace 2023, Microsoft Azure Public Dataset, CC BY 4.0."


def build(out: Path) -> dict[str, Any]:
    """Write summary.json, the plots and report.html into ``out``; return the summary."""
    info = RunInfo.read(out / "run.json")
    log = out / EVENT_LOG
    recorded = analysis.read_log(log, info) if log.is_file() else None
    requests = (analysis.read_requests(out / "loadgen" / "requests.csv")
                if (out / "loadgen" / "requests.csv").is_file() else None)
    loadgen = _json(out / "loadgen" / "loadgen.json")
    metrics = _json(out / "worker_metrics.json") or {}
    samples = analysis.read_slices(out / SLICES)
    summary = summarize(info, recorded, requests, loadgen, metrics, samples)
    gc_log = out / BROKER_GC_LOG
    if gc_log.is_file():
        summary.update(broker_pauses(info, localkafka.gc_pauses(gc_log.read_text())))
    summary.update(measured_lift(out, info.region, log, loadgen))
    audit = _json(out / PRECOMPUTE_AUDIT)
    if audit is not None:
        summary["precompute_audit"] = audit
    summary["event_log"] = EVENT_LOG if log.is_file() else None
    summary["replay"] = (f"surplus replay {out / EVENT_LOG} --offline --config "
                         f"{out / 'control.toml'} --out {out / 'replay'}")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    images = plots.draw(out, info, recorded, requests, samples)
    page(out, info, summary, images)
    return summary


def measured_lift(out: Path, region: str, log: Path,
                  loadgen: dict[str, Any] | None) -> dict[str, Any]:
    """The control plane's measured lift against the holdout, per lever, beside the true lift
    the load generator knows, and the join's counts. Measured by the same controller code,
    over the recorded decisions and labels (an offline replay of the run's log with its
    control config: what the live control plane computed, on event time)."""
    from streams.control.config import ControlConfig, load_config
    from streams.eventlog import read_events
    from streams.replay import ControlDriver

    if not log.is_file():
        return {}
    toml = out / "control.toml"
    driver = ControlDriver(load_config(toml) if toml.is_file() else ControlConfig())
    driver.run(read_events(log))
    controller = driver.controllers.get(region)
    true = (loadgen or {}).get("lift_true") or {}
    if controller is None:
        return {}
    measured = controller.estimates.lift()
    counts = controller.join.counts
    levers = ("all", "sbm", "rma") + (("precompute",) if "precompute" in measured else ())
    lift = {lever: {"lift_measured": _round(measured[lever].measured, 6),
                    "lift_ci_low": _round(measured[lever].ci_low, 6),
                    "lift_ci_high": _round(measured[lever].ci_high, 6),
                    "lift_true": true.get(lever)} for lever in levers}
    return {"lift": lift, "lift_counts": controller.estimates.counts(),
            "labels_joined": counts["joined"], "labels_late": counts["late"],
            "labels_orphan": counts["orphan"], "labels_duplicate": counts["duplicate"],
            "decisions_pending": len(controller.join),
            "lift_method": "mean value of treated minus holdout requests, each segment "
                           "against its own holdout (post-stratified, Welch within each, "
                           "95%); sbm: per-segment SNIPS gain times the powerful share; "
                           "precompute: requests that used an answer against those whose "
                           "answer the answer holdout withheld, per segment, times the share "
                           "that used one; rma: the rest"}


def _lift_notes(summary: dict[str, Any]) -> list[str]:
    """Measured lift per lever beside the true lift, and the join's counts, as report lines."""
    lift = summary.get("lift")
    if not lift:
        return []
    parts = []
    for lever in ("all", "sbm", "rma", "precompute"):
        if lever not in lift:
            continue
        row = lift.get(lever) or {}
        if row.get("lift_measured") is None:
            parts.append(f"{lever}: not measured yet (true {row.get('lift_true')})")
        else:
            parts.append(f"{lever}: {row['lift_measured']:.4f} [{row['lift_ci_low']:.4f}, "
                         f"{row['lift_ci_high']:.4f}], true {row.get('lift_true')}")
    return [f"Measured lift per treated request against the holdout (95%): {'; '.join(parts)}. "
            f"Labels joined {summary.get('labels_joined')}, late {summary.get('labels_late')}, "
            f"orphan {summary.get('labels_orphan')}."]


def broker_pauses(info: RunInfo, pauses: list[tuple[int, float]]) -> dict[str, Any]:
    """The embedded broker's stop-the-world collections while the load ran: every produce and
    fetch waits them out, preemption notices included (``notice_delivery_p99_ms``)."""
    during = [ms for at, ms in pauses if info.start_ms <= at <= info.end_ms]
    span_ms = max(info.end_ms - info.start_ms, 1)
    return {"broker_gc_pauses": len(during),
            "broker_gc_pause_max_ms": _round(max(during)) if during else None,
            "broker_gc_paused_share": _round(sum(during) / span_ms, 5)}


def _precompute_stop(metrics: dict[str, str], shed_p99_s: float | None) -> dict[str, Any]:
    """The precompute lever's notice-to-stop beside RMA's extras' notice-to-shed (the goal:
    within 1.2x): a slice in service when a notice comes runs to its end, so the lever stops
    up to one slice later than the extras are dropped. Empty where no worker ran it."""
    buckets = reactions.reaction_buckets(metrics, reactions.PRECOMPUTE_STOP)
    stops = int(buckets[-1][1]) if buckets else 0
    if not stops:
        return {}
    p99 = reactions.histogram_quantile(0.99, buckets)
    return {"precompute_stop_p99_ms": None if p99 is None else round(p99 * 1000.0, 3),
            "precompute_stop_reactions": stops,
            "precompute_stop_vs_shed_p99": (None if p99 is None or not shed_p99_s
                                            else round(p99 / shed_p99_s, 3))}


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# -- numbers ------------------------------------------------------------------------------------

def summarize(info: RunInfo, rec: Recorded | None, req: Requests | None,
              loadgen: dict[str, Any] | None, metrics: dict[str, str],
              slices: list[tuple[float, Sample]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "scenario": info.scenario, "region": info.region, "duration_s": info.duration_s,
        "load_seconds": round((info.end_ms - info.start_ms) / 1000.0, 3),
        "interrupted": info.interrupted, "kafka": info.kafka,
        "sla_p99_ms": info.sla_p99_ms, "sla_window_s": info.period_ms / 1000.0,
        "phases": [{"name": n, "start_s": round(a, 3), "end_s": round(b, 3)}
                   for n, a, b in info.phases]}
    out.update(_baseline(info, rec, req))
    out.update(_optional(info, rec, loadgen))
    out.update(_levers(info, rec, loadgen, slices or []))
    out.update(_replicas(info, loadgen))
    buckets = reactions.reaction_buckets(metrics)
    p99 = reactions.histogram_quantile(0.99, buckets)
    out["notice_to_shed_p99_ms"] = None if p99 is None else round(p99 * 1000.0, 3)
    out["notice_to_shed_reactions"] = int(buckets[-1][1]) if buckets else 0
    mean = reactions.reaction_mean_s(metrics)
    out["notice_to_shed_mean_ms"] = None if mean is None else round(mean * 1000.0, 3)
    delivery = reactions.histogram_quantile(
        0.99, reactions.reaction_buckets(metrics, reactions.DELIVERY))
    out["notice_delivery_p99_ms"] = None if delivery is None else round(delivery * 1000.0, 3)
    out["notice_paths"] = reactions.notice_paths(metrics)
    out.update(_precompute_stop(metrics, p99))
    out["notice_to_shed_method"] = (
        "PreemptionNotice ts_ms to optional work stopped by its first copy (Kafka or POST "
        "/v1/preempt, see notice_paths), summed over the workers' "
        "surplus_worker_preemption_reaction_seconds histograms, p99 interpolated in its bucket")
    if rec is not None:
        out["events_recorded"] = rec.events
        out["event_log_bad_lines"] = rec.bad_lines
    out["attribution"] = ATTRIBUTION
    return out


def _baseline(info: RunInfo, rec: Recorded | None, req: Requests | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if req is not None:
        out["baseline_requests_total"] = int(req.ok.size)
        out["baseline_requests_failed"] = int((~req.ok).sum())
        out["baseline_failure_reasons"] = req.errors
        served = req.latency_ms[req.ok]
        out["client_latency_p50_ms"] = _round(np.percentile(served, 50) if served.size else None)
        out["client_latency_p99_ms"] = _round(np.percentile(served, 99) if served.size else None)
        _, cy = analysis.client_windows(req, info)
        out["client_ranking_p99_windows_over_sla"] = sum(1 for y in cy if y > info.sla_p99_ms)
        client = analysis.client_sla_windows(req, info)
        out["client_sla_violation_windows"] = sum(w.violated for w in client)
        out["client_windows_judged"] = sum(w.judged for w in client)
        out["client_windows_total"] = len(client)
    if rec is not None:
        windows = analysis.sla_windows(rec.telemetry, info)
        judged = [w for w in windows if w.judged]
        ranking = [w.p99_ms for w in judged if w.p99_ms is not None]
        powerful = [w.powerful_p99_ms for w in judged if w.powerful_p99_ms is not None]
        out["baseline_sla_violation_windows"] = sum(w.violated for w in judged)
        out["baseline_windows_judged"] = len(judged)
        out["baseline_windows_total"] = len(windows)
        out["baseline_windows_unjudged"] = [w.index for w in windows if not w.judged]
        out["baseline_violations_by_path"] = {
            path: sum(path in w.over for w in judged) for path in ("ranking", "powerful")}
        out["baseline_p99_ms_worst_window"] = _round(max(ranking, default=None))
        out["baseline_p99_ms_median_window"] = _round(
            float(np.median(ranking)) if ranking else None)
        out["powerful_p99_ms_worst_window"] = _round(max(powerful, default=None))
        out["deadline_ms"] = info.deadline_ms
        out["baseline_rejected_by_workers"] = rec.telemetry.rejected
        out["sla_method"] = (
            "every control window of the load with a baseline request is judged on every "
            "baseline request whichever path served it (workers' reports): ranking requests' "
            "p99 (all ranking replicas merged, or any ranking pool with min_samples, whichever "
            "is higher) against sla_p99_ms, requests the powerful model served against "
            "deadline_ms; client_* is the same verdict on end-to-end latencies, fallbacks "
            "judged whole against the deadline")
    return out


def _replicas(info: RunInfo, loadgen: dict[str, Any] | None) -> dict[str, Any]:
    """Opportunistic replicas lost and regained, and what their loss cost baseline requests:
    calls retried on another replica (never a failed request, if the invariant holds).

    In the demo only opportunistic replicas come and go (the provisioned ones serve
    throughout), so every retry of a replica that was not there (refused, dropped, not
    ready) is one a reclaimed or not yet serving replica caused: with membership the client
    stops routing to a replica when it says it is draining, before it goes, so the goal is 0.
    """
    changes = [c for _, _, c in info.replica_changes]
    client = (loadgen or {}).get("client") or {}
    decisions = client.get("decisions") or {}
    retries = decisions.get("baseline_retry", {})
    return {"opportunistic_replicas_started": changes.count("started"),
            "opportunistic_replicas_reclaimed": changes.count("reclaimed"),
            "replica_changes": [{"t_s": t, "worker_id": w, "change": c}
                                for t, w, c in info.replica_changes],
            "routing": "membership" if client.get("membership") is not None else "fixed_urls",
            "baseline_retries_on_another_replica": retries,
            "baseline_retries_caused_by_reclaimed_replicas": sum(retries.values())}


def _optional(info: RunInfo, rec: Recorded | None,
              loadgen: dict[str, Any] | None) -> dict[str, Any]:
    shed: dict[str, int] = {}
    done: dict[str, int] = {}
    if rec is not None:
        done = {k: int(v) for k, v in sorted(rec.telemetry.done.items())}
        shed = {f"worker/{k}": int(v) for k, v in sorted(rec.telemetry.shed.items())}
    if loadgen is not None:
        cuts = loadgen.get("client_cuts", {})
        for key in ("rma_shed/overload", "rma_shed/budget"):
            if cuts.get(key):
                shed[f"client/{key}"] = int(cuts[key])
        if cuts.get("sbm_shed/overload"):
            shed["client/sbm_shed/overload"] = int(cuts["sbm_shed/overload"]) * \
                info.base_candidates
    out: dict[str, Any] = {
        "optional_units_done": sum(done.values()), "optional_units_done_by_lever": done,
        "optional_units_shed": sum(shed.values()), "optional_units_shed_by_reason": shed}
    if loadgen is not None:
        fate = loadgen.get("optional_fate", {})
        out["extra_candidates_offered"] = loadgen.get("extra_offered")
        out["extra_candidates_fate"] = fate
        out["extra_candidates_not_targeted"] = sum(
            v for k, v in fate.items() if k.startswith("untargeted/"))
    return out


def _levers(info: RunInfo, rec: Recorded | None, loadgen: dict[str, Any] | None,
            slices: list[tuple[float, Sample]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if loadgen is not None:
        out["incremental_value"] = loadgen.get("incremental_value")
        out["incremental_value_by_lever"] = loadgen.get("incremental_value_by_lever")
        out["precompute"] = _precompute(loadgen)
        out["requests_served_by_powerful_model"] = loadgen.get("served_powerful")
        out["powerful_fallbacks"] = loadgen.get("fell_back")
        requests = max(1, int(loadgen.get("requests", 0)))
        out["extra_candidates_sent_mean"] = round(loadgen.get("extra_sent", 0) / requests, 3)
    if rec is not None:
        series = analysis.targets_series(rec.targets, info)
        end = (info.end_ms - info.start_ms) / 1000.0
        out["coverage_mean"] = round(analysis.time_weighted_mean(series["coverage"], 0.0, end), 4)
        out["extra_candidates_mean"] = round(
            analysis.time_weighted_mean(series["extra_candidates"], 0.0, end), 3)
        out["targets_published"] = len(rec.targets)
        out["targets_by_reason"] = _count(t.reason for t in rec.targets)
        out["preemption_notices"] = len(rec.notices)
        lent = analysis.lent_series(rec.capacity, info)
        out["opportunistic_units_mean"] = round(analysis.time_weighted_mean(lent, 0.0, end), 3)
        reported = analysis.busy_share_lent(rec.telemetry, rec.capacity, info)
        out["opportunistic_busy_share_reported"] = _round(reported)
        out.update(_busy_share(info, slices, reported))
        out["limited_by"] = analysis.limited_by(rec.targets)
    return out


def _precompute(loadgen: dict[str, Any]) -> dict[str, Any] | None:
    """The precompute lever's books: visits that used an answer, the live extras they did
    not send, and the client's jobs and answers (None: the lever was off)."""
    books = loadgen.get("precompute")
    if not books:
        return None
    client = (loadgen.get("client") or {}).get("precompute") or {}
    answers = client.get("answers", {})
    return {**books, "jobs_asked": client.get("asked"),
            "answers_received": answers.get("received"),
            "answer_lookups": {k: answers.get(k, 0) for k in ("hit", "miss", "expired")}}


def _busy_share(info: RunInfo, samples: list[tuple[float, Sample]],
                reported: float | None) -> dict[str, Any]:
    """The opportunistic replicas' busy share while lent: measured by the kernel (CPU time
    their slices used over the slices' quota time) when the run had slices, else the model
    busy time the replicas reported, and the summary says which and why."""
    mode = info.slices.get("mode", "none")
    out: dict[str, Any] = {"cpu_slices": info.slices or {"mode": "none",
                                                         "reason": "not recorded"}}
    share = busy_share(s for _, s in samples)
    if mode != "none" and share.share is not None:
        out["opportunistic_busy_share_lent"] = _round(share.share)
        out["opportunistic_busy_share_by_replica"] = {
            w: _round(v) for w, v in share.by_replica.items()}
        out["opportunistic_cpu_used_s"] = _round(share.used_s, 2)
        out["opportunistic_quota_s"] = _round(share.quota_s, 2)
        out["opportunistic_busy_share_method"] = (
            f"CPU time the opportunistic replicas' {mode} slices used (usage counter) over "
            "their quota time (cores x seconds), from each replica's readiness to its reclaim")
    else:
        out["opportunistic_busy_share_lent"] = _round(reported)
        why = info.slices.get("reason") or "no slice samples were recorded"
        out["opportunistic_busy_share_method"] = (
            f"NO CPU SLICES ({why}): the opportunistic replicas shared the host's cores; this "
            "is the model busy time they reported over the units lent, not a share of a quota")
    return out


def _count(items: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return dict(sorted(counts.items()))


def _round(value: Any, digits: int = 3) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return round(float(value), digits)


# -- the page -----------------------------------------------------------------------------------

HEADLINE = ("baseline_requests_total", "baseline_requests_failed",
            "baseline_sla_violation_windows", "baseline_windows_judged", "sla_p99_ms",
            "baseline_p99_ms_worst_window", "baseline_p99_ms_median_window",
            "optional_units_done", "optional_units_shed", "incremental_value",
            "incremental_value_by_lever", "precompute", "precompute_audit",
            "notice_to_shed_p99_ms",
            "precompute_stop_p99_ms", "precompute_stop_vs_shed_p99",
            "notice_to_shed_mean_ms", "notice_delivery_p99_ms",
            "broker_gc_pause_max_ms", "opportunistic_busy_share_lent",
            "opportunistic_busy_share_method", "client_sla_violation_windows",
            "limited_by", "coverage_mean",
            "extra_candidates_mean",
            "extra_candidates_sent_mean", "requests_served_by_powerful_model",
            "powerful_fallbacks", "preemption_notices", "targets_published",
            "client_latency_p99_ms", "interrupted")


def page(out: Path, info: RunInfo, summary: dict[str, Any], images: list[str]) -> Path:
    table = {"this run": {k: summary.get(k) for k in HEADLINE}}
    phases = "; ".join(f"{p['name']} {p['start_s']:.0f}-{p['end_s']:.0f} s"
                       for p in summary["phases"])
    ok = (summary.get("baseline_requests_failed") == 0
          and summary.get("baseline_sla_violation_windows") == 0
          and (summary.get("optional_units_done") or 0) > 0)
    notes = [
        f"Scenario {info.scenario} ({info.region}), {summary['load_seconds']:.0f} s of load on "
        f"{len(info.replicas)} worker replicas; phases: {phases}.",
        ("Baseline held: no failed baseline request and no ranking window over its SLA, with "
         "optional work done." if ok else
         "Baseline NOT clean in this run: see baseline_requests_failed and "
         "baseline_sla_violation_windows."),
        "Numbers of record and their definitions: summary.json (and surplus/demo/analysis.py). "
        f"Replay the recorded log: {summary['replay']}",
        *_lift_notes(summary),
        ATTRIBUTION]
    return html_page(out / "report.html", "Surplus demo", table, images, notes)
