"""The observability kit outside compose: every alert links to a runbook section that exists on the
docs site, and the dashboard names no data source, host or service of its own (its variables do).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import markdown
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "infra" / "prometheus" / "rules" / "surplus.rules.yml"
ALERTS_PAGE = ROOT / "docs" / "alerts.md"
DASHBOARD = ROOT / "infra" / "helm" / "surplus" / "dashboards" / "surplus.json"


def _anchors(page: Path) -> set[str]:
    """The ids mkdocs gives the page's headings (its toc extension, as mkdocs.yml loads it)."""
    md = markdown.Markdown(extensions=["toc", "tables", "admonition"])
    html = md.convert(page.read_text())
    return set(re.findall(r'<h[1-6] id="([^"]+)"', html))


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_every_alert_has_a_runbook_url_whose_anchor_is_on_the_alerts_page() -> None:
    anchors = _anchors(ALERTS_PAGE)
    missing = []
    for rule in _rules():
        url = rule["annotations"].get("runbook_url", "")
        page, _, anchor = url.partition("#")
        if not page.endswith("/alerts/") or anchor not in anchors:
            missing.append(f"{rule['alert']}: {url!r}")
    assert not missing, f"not on docs/alerts.md: {missing} (its sections: {sorted(anchors)})"


def test_the_anchor_check_sees_a_missing_section() -> None:
    anchors = _anchors(ALERTS_PAGE)
    assert "surplustargetsstale" in anchors
    assert "surplusnosuchalert" not in anchors


def _queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def test_the_dashboard_reads_its_data_source_from_a_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    refs = [p["datasource"] for p in board["panels"]]
    refs += [t["datasource"] for p in board["panels"] for t in p.get("targets", [])]
    refs += [v["datasource"] for v in variables.values() if "datasource" in v]
    assert refs and all(r == {"type": "prometheus", "uid": "${datasource}"} for r in refs), refs


def test_every_series_the_dashboard_reads_is_filtered_by_job_and_namespace() -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"job", "namespace"} <= variables
    unfiltered = []
    for title, expr in _queries(board):
        for selector in re.finditer(r"\bsurplus_[a-z0-9_]+(\{[^}]*\})?", expr):
            matchers = selector.group(1) or ""
            if 'job=~"$job"' not in matchers or 'namespace=~"$namespace"' not in matchers:
                unfiltered.append(f"{title}: {selector.group(0)}")
    assert not unfiltered, unfiltered


def test_the_dashboard_names_no_compose_host_or_service() -> None:
    board = json.loads(DASHBOARD.read_text())
    exprs = [expr for _, expr in _queries(board)]
    exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    named = sorted({name for name in compose for expr in exprs
                    if re.search(rf"(?<![a-z_]){re.escape(name)}\b", expr)})
    assert not named, f"the dashboard's queries name compose services {named}: use a label"
    assert '"uid": "prometheus"' not in DASHBOARD.read_text()
