"""Lint of the Grafana dashboards: what provisioning and on-call rely on, checked without Grafana."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.observability import DASHBOARDS, ROOT, load_dashboard, metric_names, panels

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
DATA_PANELS = {"timeseries", "stat", "bargauge", "gauge", "table", "heatmap", "barchart", "piechart"}
HOSTS = re.compile(r"localhost|127\.0\.0\.1|:8400|bleedwatch:\d+")
FIXED_TARGET = re.compile(r"\b(?:instance|job)\s*=~?\s*\"(?!\$)")

dashboards = pytest.mark.parametrize("path", DASHBOARDS, ids=[p.name for p in DASHBOARDS])


def test_the_three_dashboards_exist_with_stable_unique_uids() -> None:
    uids = [load_dashboard(p)["uid"] for p in DASHBOARDS]
    assert sorted(uids) == ["bleedwatch-health", "bleedwatch-leaks", "bleedwatch-overview"]
    titles = [load_dashboard(p)["title"] for p in DASHBOARDS]
    assert len(set(titles)) == len(titles)


@dashboards
def test_schema_essentials(path: Path) -> None:
    d = load_dashboard(path)
    assert re.fullmatch(r"bleedwatch-[a-z0-9-]{1,29}", d["uid"])
    assert d.get("id") is None, "provisioned dashboards carry no database id"
    assert d["title"].startswith("bleedwatch / ")
    assert d.get("description")
    assert isinstance(d["schemaVersion"], int)
    assert d["schemaVersion"] >= 36
    assert "bleedwatch" in d["tags"]
    assert d["time"]["from"].startswith("now-")
    assert "__inputs" not in d, "an export for sharing, not a provisioned dashboard"


@dashboards
def test_datasource_is_a_template_variable_everywhere(path: Path) -> None:
    d = load_dashboard(path)
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE, var["name"]
    for panel in panels(d):
        if panel["type"] in ("row", "text"):
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]


@dashboards
def test_panels_have_unique_ids_a_place_a_description_and_a_unit(path: Path) -> None:
    d = load_dashboard(path)
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for panel in panels(d):
        pos = panel["gridPos"]
        assert pos["x"] >= 0
        assert pos["w"] >= 1
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        assert pos["h"] >= 1
        assert panel.get("title"), panel["id"]
        if panel["type"] in ("row", "text"):
            continue
        assert panel["type"] in DATA_PANELS, panel["type"]
        assert panel.get("description"), panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        refs = [t["refId"] for t in panel["targets"]]
        assert refs
        assert len(refs) == len(set(refs)), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


def _selectors(expr: str) -> list[tuple[str, str]]:
    return re.findall(r"\b(bleedwatch_\w+|up)(\{[^}]*\})?", expr)


@dashboards
def test_every_query_is_filtered_by_job_and_instance_and_names_no_host(path: Path) -> None:
    d = load_dashboard(path)
    assert not HOSTS.search(json.dumps(d)), "a host name is hard-coded"
    for panel in panels(d):
        for target in panel.get("targets", []):
            assert not FIXED_TARGET.search(target["expr"]), f"{panel['title']}: a fixed job or instance"
            for name, labels in _selectors(target["expr"]):
                assert '$job"' in labels, f'{panel["title"]}: {name} without job=~"$job"'
                assert '$instance"' in labels, f'{panel["title"]}: {name} without instance=~"$instance"'


def test_leak_drill_down_has_the_views_the_incident_needed() -> None:
    d = load_dashboard(ROOT / "dashboards" / "bleedwatch-leaks.json")
    used = {name for p in panels(d) for t in p.get("targets", []) for name in metric_names(t["expr"])}
    for needed in (
        "bleedwatch_findings_by_model_total",
        "bleedwatch_finding_prompt_tokens_bucket",
        "bleedwatch_exchange_prompt_tokens_bucket",
        "bleedwatch_findings_by_node_total",
    ):
        assert needed in used
    # Deployment and node are opt-in: the dashboard says so.
    assert "BLEEDWATCH_METRICS_NODE_LABELS" in d["description"]
    bucket_panels = [p for p in panels(d) if any(t.get("format") == "heatmap" for t in p.get("targets", []))]
    assert len(bucket_panels) == 2


def test_grafana_provisioning_loads_this_directory_with_the_default_datasource() -> None:
    provider = yaml.safe_load((ROOT / "dashboards/provisioning/dashboards/bleedwatch.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/etc/grafana/dashboards/bleedwatch"
    datasources = yaml.safe_load((ROOT / "dashboards/provisioning/datasources/prometheus.yml").read_text())
    (prometheus,) = datasources["datasources"]
    assert (prometheus["type"], prometheus["isDefault"]) == ("prometheus", True)
    compose: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "./dashboards:/etc/grafana/dashboards/bleedwatch:ro" in compose["services"]["grafana"]["volumes"]
