"""The chart's observability kit (test_chart.py holds its PrometheusRule with default values equal
to the rules file compose's Prometheus loads): its thresholds move with values, the dashboard
ConfigMap carries dashboards/surplus.json unchanged for the Grafana sidecar, and the
ServiceMonitor labels worker series with their pool as compose's scrape config does.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml

from tests.helm.test_chart import CHART, ROOT, _helm, _of

pytestmark = pytest.mark.helm

SCRAPE = ROOT / "infra" / "prometheus" / "prometheus.yml"
DASHBOARD = CHART / "dashboards" / "surplus.json"


def _render(*args: str) -> list[dict[str, Any]]:
    argv = [_helm(), "template", "surplus", str(CHART), "--kube-version", "1.33.0", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _rules(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    [rule] = _of(manifests, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_thresholds_and_durations_come_from_values() -> None:
    rules = _rules(_render(
        "--set", "prometheusRule.alerts.baselineP99OverSla.slaSeconds=0.08",
        "--set", "prometheusRule.alerts.baselineP99OverSla.for=3m",
        "--set", "prometheusRule.alerts.consumerLag.maxMessages=250",
        "--set", "prometheusRule.alerts.targetsStale.maxAgeSeconds=45",
        "--set", "prometheusRule.alerts.preemptionReactionSlow.maxSeconds=0.01",
        "--set", "prometheusRule.alerts.kafkaDown=null",
        "--set", "prometheusRule.runbookBaseUrl=https://docs.example.org/alerts/"))
    sla = rules["SurplusBaselineP99OverSla"]
    assert sla["expr"].endswith("> 0.08") and sla["for"] == "3m"
    assert "over the 80 ms SLA" in sla["annotations"]["summary"]
    assert sla["annotations"]["runbook_url"] == \
        "https://docs.example.org/alerts/#surplusbaselinep99oversla"
    assert rules["SurplusConsumerLag"]["expr"].count("> 250") == 2
    assert "more than 250 messages" in rules["SurplusConsumerLag"]["annotations"]["description"]
    assert "> 45 or" in rules["SurplusTargetsStale"]["expr"]
    assert rules["SurplusPreemptionReactionSlow"]["expr"].endswith("> 0.01")
    assert "SurplusKafkaDown" not in rules and len(rules) == 6


def test_the_dashboard_configmap_is_the_dashboard_file_for_the_grafana_sidecar() -> None:
    [cm] = [m for m in _of(_render(), "ConfigMap") if m["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"] == {"surplus.json": DASHBOARD.read_text().rstrip("\n")}

    moved = _render("--set", "grafanaDashboard.label=dashboards",
                    "--set", "grafanaDashboard.labelValue=surplus",
                    "--set", "grafanaDashboard.namespace=monitoring")
    [cm] = [m for m in _of(moved, "ConfigMap") if m["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["dashboards"] == "surplus"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["namespace"] == "monitoring"

    off = _render("--set", "grafanaDashboard.enabled=false")
    assert not [m for m in _of(off, "ConfigMap") if m["metadata"]["name"].endswith("-dashboard")]


def test_the_servicemonitor_labels_worker_series_with_their_pool_as_compose_does() -> None:
    manifests = _render()
    [monitor] = _of(manifests, "ServiceMonitor")
    [workers] = [e for e in monitor["spec"]["endpoints"] if e["port"] == "http"]
    [relabel] = workers["relabelings"]
    assert relabel["targetLabel"] == "pool"
    services = {s["metadata"]["labels"]["surplus.io/pool"] for s in _of(manifests, "Service")
                if "surplus.io/pool" in s["metadata"]["labels"]}
    # Prometheus relabeling: the regex anchored on both ends, $n as the groups.
    replacement = re.sub(r"\$(\d)", r"\\\1", relabel["replacement"])
    seen = {re.sub(f"^(?:{relabel['regex']})$", replacement, value) for value in services}
    compose = {c["labels"]["pool"] for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]
               if job["job_name"] == "workers" for c in job["static_configs"]}
    assert seen == compose == {"eu1/rank/baseline/cpu/baseline",
                               "eu1/rank/baseline/cpu/opportunistic",
                               "eu1/rank/powerful/cpu/opportunistic"}
