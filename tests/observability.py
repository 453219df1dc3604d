"""What the observability tests share: the dashboards, the alert rules, PromQL expressions in
them, the metric names those expressions use, and the names a /metrics page exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
RULES = ROOT / "dashboards" / "alerts" / "bleedwatch.yml"
RULE_TESTS = ROOT / "dashboards" / "alerts" / "tests" / "bleedwatch_test.yml"
METRICS_DOC = ROOT / "docs" / "metrics.md"

# Series Prometheus makes itself; every other name in an expression must be bleedwatch's.
PROMETHEUS_SERIES = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})
# Grafana's variables, as the real-Prometheus check substitutes them.
GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}

_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"inf", "nan", "atan2"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"(?<![\w.:$])([A-Za-z_:][\w:]*)\b(?!\s*\()")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)\s*$")


def need(binary: str) -> str:
    """The path of ``binary``; the test fails, with what to do, when it is missing."""
    path = shutil.which(binary)
    if path is None:
        import pytest

        pytest.fail(f"{binary} is not installed: run scripts/services (it installs the Debian package prometheus)")
    return path


def run(*args: str | Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    cmd = [str(a) for a in args]  # a binary found by need() and fixed arguments
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def load_dashboard(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those inside rows."""
    out: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_expressions(path: Path) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable of a dashboard."""
    d = load_dashboard(path)
    out = []
    for panel in panels(d):
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append(
                    (f"{path.name}: panel {panel['id']} {panel.get('title')!r} {target['refId']}", target["expr"])
                )
    for var in d.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        match = _LABEL_VALUES.match(query)
        assert match, f"{path.name}: variable {var['name']}: only label_values(selector, label) is supported"
        out.append((f"{path.name}: variable {var['name']}", f"group by ({match.group(2)}) ({match.group(1)})"))
    return out


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def rule_expressions() -> list[tuple[str, str]]:
    return [(f"{RULES.name}: {r.get('alert') or r.get('record')}", r["expr"]) for r in alert_rules()]


def all_expressions() -> list[tuple[str, str]]:
    return [e for path in DASHBOARDS for e in dashboard_expressions(path)] + rule_expressions()


def substitute(expr: str) -> str:
    """Grafana variables replaced: time variables by durations, template variables by match-all."""

    def value(match: re.Match[str]) -> str:
        return GRAFANA_VARIABLES.get(match.group(1), ".+")

    return re.sub(r"\$\{?(\w+)\}?", value, expr)


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (not functions, keywords, labels or durations)."""
    bare = _STRING.sub('""', expr)
    bare = re.sub(r"\{[^}]*\}", " ", bare)
    bare = re.sub(r"\[[^\]]*\]", " ", bare)
    bare = _GROUPING.sub(" ", bare)
    return {name for name in _NAME.findall(bare) if name not in _KEYWORDS}


def exported_names(exposition: str) -> set[str]:
    """Every series name a Prometheus text exposition offers, from TYPE lines and from samples."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":
                names.update(f"{name}_{suffix}" for suffix in ("bucket", "count", "sum"))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def documented_metrics(*, tap: bool = False) -> set[str]:
    """Metric names in the first column of docs/metrics.md's tables: the service's, or with ``tap``
    the tap's (``bleedwatch_tap_*``), which it serves from a registry and a port of its own."""
    names = set(re.findall(r"^\|\s*`(bleedwatch_\w+)`", METRICS_DOC.read_text(), flags=re.MULTILINE))
    return {n for n in names if n.startswith("bleedwatch_tap_") == tap}
