"""Alert rules, their promtool unit tests, runbooks, and the Prometheus and Alertmanager configs."""

from __future__ import annotations

import re

import yaml

from service import metrics
from service.config import Settings
from tests.observability import DASHBOARDS, ROOT, RULE_TESTS, RULES, alert_rules, load_dashboard, need, run

SEVERITIES = {"critical", "warning"}
DASHBOARD_UIDS = {load_dashboard(p)["uid"] for p in DASHBOARDS}
# The base of every link, BLEEDWATCH_ALERT_LINKS_URL as bleedwatch exports it (docs/metrics.md#links-in-alerts).
LINKS = (
    '{{ with query "max by (base_url) (bleedwatch_alert_links_info) or (max by (base_url) '
    '(last_over_time(bleedwatch_alert_links_info[1d])) unless on () bleedwatch_alert_links_info)" }}'
    '{{ . | first | label "base_url" }}{{ end }}'
)


def test_rules_pass_promtool_check() -> None:
    result = run(need("promtool"), "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    result = run(need("promtool"), "test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text())
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            (fires if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = {r["alert"] for r in alert_rules()}
    assert alerts - fires == set(), "alerts never tested firing"
    assert alerts - quiet == set(), "alerts never tested staying quiet"
    assert (fires | quiet) - alerts == set(), "tests of alerts that do not exist"


def test_every_alert_says_how_urgent_what_and_where_the_runbook_is() -> None:
    for rule in alert_rules():
        name = rule["alert"]
        assert re.fullmatch(r"Bleedwatch[A-Z]\w+", name), name
        assert "for" in rule, f"{name}: no for:"
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert annotations.get("summary"), name
        assert annotations.get("description"), name
        url = annotations.get("runbook_url", "")
        match = re.fullmatch(re.escape(LINKS) + r"/runbooks/([a-z-]+\.md)", url)
        assert match, f"{name}: runbook_url {url!r}"
        runbook = ROOT / "docs" / "runbooks" / match.group(1)
        assert runbook.is_file(), f"{name}: {runbook} does not exist"
        assert name in runbook.read_text(), f"{runbook} does not mention {name}"
        dashboard = annotations.get("dashboard_url", "")
        match = re.fullmatch(re.escape(LINKS) + r"/d/([a-z-]+)", dashboard)
        assert match, f"{name}: dashboard_url {dashboard!r}"
        assert match.group(1) in DASHBOARD_UIDS, f"{name}: no dashboard {match.group(1)}"
        assert "model" in annotations["summary"], f"{name}: the summary does not name the model"
        assert "deployment" in annotations["summary"], f"{name}: the summary does not name the deployment"


def test_the_links_come_from_the_one_setting_every_deployment_sets() -> None:
    assert metrics.ALERT_LINKS._name == "bleedwatch_alert_links_info"  # what LINKS queries
    assert "BLEEDWATCH_ALERT_LINKS_URL" in {f"BLEEDWATCH_{n.upper()}" for n in Settings.model_fields}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for service in ("bleedwatch", "bleedwatch-worker"):
        assert "BLEEDWATCH_ALERT_LINKS_URL" in compose["services"][service]["environment"], service
    configmap = ROOT / "deploy" / "kubernetes" / "base" / "configmap.yaml"
    assert "BLEEDWATCH_ALERT_LINKS_URL" in yaml.safe_load(configmap.read_text())["data"]
    assert "BLEEDWATCH_ALERT_LINKS_URL" in (ROOT / ".env.example").read_text()


def test_leak_runbooks_tell_on_call_to_pull_the_model() -> None:
    for page in ("cross-tenant-leak.md", "canary-leak.md"):
        assert "pull the model" in (ROOT / "docs" / "runbooks" / page).read_text().lower(), page


def test_compose_prometheus_config_is_valid_and_loads_the_rules_directory() -> None:
    config = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    result = run(need("promtool"), "check", "config", config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "/etc/prometheus/alerts/*.yml" in yaml.safe_load(config.read_text())["rule_files"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    volumes = compose["services"]["prometheus"]["volumes"]
    assert "./dashboards/alerts:/etc/prometheus/alerts:ro" in volumes
    # The unit tests live one level down, out of the rules glob.
    assert RULE_TESTS.parent != RULES.parent


def test_alertmanager_config_is_valid_and_groups_by_alert_and_severity() -> None:
    config = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
    result = run(need("amtool"), "check-config", config)
    assert result.returncode == 0, result.stdout + result.stderr
    route = yaml.safe_load(config.read_text())["route"]
    assert route["group_by"] == ["alertname", "severity"]
    for severity in SEVERITIES:
        routed = run(
            need("amtool"),
            "config",
            "routes",
            "test",
            f"--config.file={config}",
            "alertname=BleedwatchCrossTenantLeakSuspected",
            f"severity={severity}",
        )
        assert routed.returncode == 0, routed.stdout + routed.stderr
        assert routed.stdout.strip() == "bleedwatch-webhook"
    tree = run(need("amtool"), "config", "routes", "show", f"--config.file={config}")
    assert 'severity="critical"' in tree.stdout, tree.stdout
