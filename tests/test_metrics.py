"""/metrics against docs/metrics.md, naming conventions, bounded labels, and what feeds them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service import metrics
from service.auth.keys import Role
from service.config import Settings
from service.findings.draft import FindingDraft
from service.index.base import Index
from service.index.redis_index import RedisIndex
from service.signals.schemas import SignalKind
from tests.conftest import Api
from tests.observability import documented_metrics, exported_names
from tests.traffic import BOILERPLATE, exchange, words

pytestmark = pytest.mark.anyio

ALLOWED_LABELS = {
    "kind",
    "queue",  # where a dead letter expired: metrics.DEAD_LETTER_QUEUES
    "reason",
    "severity",
    "model",
    "deployment",
    "node",
    "label",
    "rule",
    "backend",
    "method",
    "route",
    "code",
    "target",  # a paging target's name: one per configured target (service/webhooks/targets.py)
}


def _families() -> dict[str, Any]:
    text = generate_latest(REGISTRY).decode()
    return {f.name: f for f in text_string_to_metric_families(text) if f.name.startswith("bleedwatch_")}


def _exported() -> set[str]:
    """Metric names as documented: counters with _total, no _created, no histogram suffixes."""
    names = set()
    for line in generate_latest(REGISTRY).decode().splitlines():
        if line.startswith("# TYPE bleedwatch_"):
            _, _, name, _ = line.split(" ", 3)
            if not name.endswith("_created"):
                names.add(name)
    return names


def test_every_documented_metric_is_exported_and_vice_versa() -> None:
    documented, exported = documented_metrics(), _exported()
    assert documented, "no metric found in docs/metrics.md"
    assert documented - exported == set(), "documented in docs/metrics.md but not exported"
    assert exported - documented == set(), "exported but missing from docs/metrics.md"


def test_names_follow_prometheus_conventions() -> None:
    for name, family in _families().items():
        if family.type == "counter":
            assert not name.endswith("_total")  # the parser strips it; the exposition has it
        else:
            assert not name.endswith("_total"), f"{name}: only counters end in _total"
        for unit in ("_ms", "_milliseconds", "_kb", "_mb", "_minutes", "_hours"):
            assert unit not in name, f"{name}: use base units"


def test_labels_are_bounded_sets_only() -> None:
    for name, family in _families().items():
        for sample in family.samples:
            labels = set(sample.labels) - {"le"}
            assert labels <= ALLOWED_LABELS, f"{name}: unexpected labels {labels - ALLOWED_LABELS}"


def test_known_label_values_exist_before_any_event() -> None:
    body = generate_latest(REGISTRY).decode()
    for severity in metrics.SEVERITIES:
        assert f'bleedwatch_findings_total{{severity="{severity}"}}' in body
        assert f'bleedwatch_open_incidents{{severity="{severity}"}}' in body
    for backend in metrics.BACKENDS:
        assert f'bleedwatch_backend_errors_total{{backend="{backend}"}}' in body
    for kind in metrics.ENGINE_SIGNAL_KINDS:
        assert f'bleedwatch_engine_signals_total{{kind="{kind}"}}' in body
    for queue in metrics.DEAD_LETTER_QUEUES:
        assert f'bleedwatch_dead_letters_expired_total{{queue="{queue}"}}' in body
    assert 'bleedwatch_deployment_risk_violations{rule="kv_pool_below_context_length"}' in body
    for unlabelled in ("bleedwatch_canary_probes_total", "bleedwatch_canary_leaks_total", "bleedwatch_sdk_dropped"):
        assert f"\n{unlabelled}" in body


def test_engine_signal_kinds_match_the_signals_schema() -> None:
    assert set(metrics.ENGINE_SIGNAL_KINDS) == {k.value for k in SignalKind}


def test_label_cap_keeps_the_first_values_and_folds_the_rest() -> None:
    cap = metrics.LabelCap(2)
    assert [cap.admit(m) for m in ("a", "b", "c", "a", "d", "b")] == [True, True, False, True, False, True]


def _draft(model: str, severity: str = "high", **kw: Any) -> FindingDraft:
    values: dict[str, Any] = {
        "key_id": "0" * 16,
        "recipient_tenant": "tenant-b",
        "recipient_request_id": "r-b",
        "source_tenant": "tenant-a",
        "source_request_ids": ["r-a"],
        "response_at": datetime.fromtimestamp(time.time() - 30, UTC),
        "model": model,
        "deployment": "pd-eu-1",
        "node": "decode-3",
        "prompt_tokens": 700_001,
        "response_tokens": 100,
        "matched_fingerprints": 9,
        "longest_run_tokens": 40,
        "score": 0.2,
        "severity": severity,
        "evidence": {"sources": [{"canary": False}]},
    }
    return FindingDraft(**(values | kw))


def _value(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


@pytest.fixture
def caps() -> metrics.Labels:
    return metrics.Labels(metrics.LabelCap(2), metrics.LabelCap(1, enabled=True))


def test_findings_by_model_are_capped_with_overflow_counted(caps: metrics.Labels) -> None:
    prefix = f"capped-{time.monotonic_ns()}"
    overflow = _value("bleedwatch_metric_label_overflow_total", {"label": "model"})
    for i in range(4):
        metrics.record_finding(_draft(f"{prefix}-{i}"), caps)
    by_model = "bleedwatch_findings_by_model_total"
    assert _value(by_model, {"model": f"{prefix}-0", "severity": "high"}) == 1
    assert _value(by_model, {"model": f"{prefix}-1", "severity": "high"}) == 1
    assert REGISTRY.get_sample_value(by_model, {"model": f"{prefix}-2", "severity": "high"}) is None
    assert _value("bleedwatch_metric_label_overflow_total", {"label": "model"}) == overflow + 2
    node_overflow = _value("bleedwatch_metric_label_overflow_total", {"label": "node"})
    metrics.record_finding(_draft(f"{prefix}-0", deployment="pd-us-9", node="decode-1"), caps)
    assert _value("bleedwatch_metric_label_overflow_total", {"label": "node"}) == node_overflow + 1


def test_model_label_can_be_turned_off() -> None:
    labels = metrics.Labels.from_settings(Settings(metrics_model_label=False))
    model = f"off-{time.monotonic_ns()}"
    metrics.record_finding(_draft(model), labels)
    assert REGISTRY.get_sample_value("bleedwatch_findings_by_model_total", {"model": model, "severity": "high"}) is None


def test_the_alert_links_base_is_exported_for_the_rules() -> None:
    """The alert rules build runbook_url and dashboard_url from this series (docs/metrics.md#links-in-alerts)."""
    url = "https://oncall.example.net/bleedwatch"
    metrics.configure(Settings(alert_links_url=url))
    assert REGISTRY.get_sample_value("bleedwatch_alert_links_info", {"base_url": url}) == 1
    with pytest.raises(ValueError, match="alert_links_url"):
        Settings(alert_links_url=url + "/")  # the rules append "/runbooks/...": no double slash


def test_a_finding_feeds_latency_prompt_length_and_canaries(caps: metrics.Labels) -> None:
    latency = _value("bleedwatch_detection_latency_seconds_count")
    long_prompts = _value("bleedwatch_finding_prompt_tokens_bucket", {"le": "786432.0"}) - _value(
        "bleedwatch_finding_prompt_tokens_bucket", {"le": "655360.0"}
    )
    canary_leaks = _value("bleedwatch_canary_leaks_total")
    metrics.record_finding(_draft("m", "critical", evidence={"sources": [{"canary": True}, {"canary": False}]}), caps)
    assert _value("bleedwatch_detection_latency_seconds_count") == latency + 1
    assert (
        _value("bleedwatch_finding_prompt_tokens_bucket", {"le": "786432.0"})
        - _value("bleedwatch_finding_prompt_tokens_bucket", {"le": "655360.0"})
        == long_prompts + 1
    )
    assert _value("bleedwatch_canary_leaks_total") == canary_leaks + 1


async def test_ingest_feeds_metrics_without_tenant_data(
    api: Api, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    source = exchange("tenant-a", "r-a", BOILERPLATE + " " + words("argparse"), words("json", 0, 120), now)
    leak = exchange(
        "tenant-b",
        "r-b",
        BOILERPLATE + " " + words("sqlite3"),
        words("csv", 0, 100) + " " + words("argparse", 60, 100) + " " + words("heapq", 0, 60),
        now + 1,
        prompt_tokens=700_001,
    )
    watched = {
        "prompts": ("bleedwatch_exchange_prompt_tokens_count", {}),
        "lag": ("bleedwatch_exchange_ingest_lag_seconds_count", {}),
        "accepted": ("bleedwatch_http_requests_total", {"method": "POST", "route": "/v1/exchanges", "code": "202"}),
        "redis": ("bleedwatch_backend_round_trips_total", {"backend": "redis"}),
        "database": ("bleedwatch_backend_round_trips_total", {"backend": "database"}),
    }
    before = {key: _value(*series) for key, series in watched.items()}
    monkeypatch.setattr(metrics, "INDEX_STATS", metrics.IndexStatsCache())  # not one refreshed by another app
    headers = api.headers(Role.INGEST)
    resp = await api.client.post("/v1/exchanges", json={"exchanges": [source, leak]}, headers=headers)
    assert resp.status_code == 202, resp.text
    assert resp.json()["findings"] == 1
    body = (await api.client.get("/metrics")).text
    after = {key: _value(*series) for key, series in watched.items()}
    assert after["prompts"] == before["prompts"] + 2
    assert after["lag"] == before["lag"] + 2
    assert after["accepted"] == before["accepted"] + 1
    assert after["database"] > before["database"]
    assert after["redis"] > before["redis"] or settings.embedded
    assert 'bleedwatch_findings_by_model_total{model="m-1m",severity="high"}' in body
    assert _value("bleedwatch_index_items") > 0
    assert _value("bleedwatch_index_memory_bytes") > 0
    assert "\nbleedwatch_index_memory_max_bytes " in body  # Redis maxmemory (tests/test_redis_index.py)
    assert _value("bleedwatch_index_memory_max_bytes") == 0 or not settings.embedded
    assert _value("bleedwatch_index_memory_fullest_ratio") == 0 or not settings.embedded
    assert _value("bleedwatch_retention_seconds") == settings.retention_seconds
    for secret in ("tenant-a", "tenant-b", "r-a", "r-b"):
        assert f'"{secret}"' not in body


async def test_index_stats_are_cached_between_scrapes(index: Index) -> None:
    assert isinstance(index, metrics.ReportsStats)
    stats = await index.stats()
    assert stats.items >= 0
    assert stats.memory_bytes >= 0
    assert stats.memory_max_bytes >= 0
    if not isinstance(index, RedisIndex):
        assert stats.memory_max_bytes == 0  # the in-process index has no limit to alert on
    cache = metrics.IndexStatsCache(max_age_seconds=3600)
    calls = 0

    class Counting:
        async def stats(self) -> metrics.IndexStats:
            nonlocal calls
            calls += 1
            return metrics.IndexStats(7, 8)

    await cache.refresh(Counting())
    await cache.refresh(Counting())
    assert calls == 1
    assert _value("bleedwatch_index_items") == 7


async def test_failing_index_stats_count_as_a_redis_error() -> None:
    class Broken:
        async def stats(self) -> metrics.IndexStats:
            raise ConnectionError("refused")

    errors = _value("bleedwatch_backend_errors_total", {"backend": "redis"})
    await metrics.IndexStatsCache().refresh(Broken())
    assert _value("bleedwatch_backend_errors_total", {"backend": "redis"}) == errors + 1


def test_exported_names_include_histogram_series() -> None:
    names = exported_names(generate_latest(REGISTRY).decode())
    assert "bleedwatch_ingest_duration_seconds_bucket" in names
    assert "bleedwatch_findings_total" in names
    assert "bleedwatch_engine_signals_total" in names


def test_several_workers_export_the_same_series_without_pid_labels(tmp_path: Path) -> None:
    """``bleedwatch serve`` with several workers: prometheus-client's multiprocess mode."""
    code = (
        "from prometheus_client import generate_latest\n"
        "from service import metrics\n"
        "from service.config import Settings\n"
        "metrics.configure(Settings())\n"
        "metrics.http_response('GET', '/metrics', 200)\n"
        "metrics.INDEX_ITEMS.set(1); metrics.INDEX_MEMORY.set(1)\n"
        "metrics.DEPLOYMENTS.set(0); metrics.DEPLOYMENTS_AT_RISK.set(0)\n"
        "print(generate_latest(metrics.registry()).decode())\n"
    )
    env = os.environ | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert "pid=" not in out
    exported = {line.split(" ")[2] for line in out.splitlines() if line.startswith("# TYPE bleedwatch_")}
    # Only labelled metrics whose label values are learnt at run time (models, nodes) or come from
    # configuration (paging targets, none here) may be missing.
    assert documented_metrics() - exported <= {
        "bleedwatch_findings_by_model_total",
        "bleedwatch_findings_by_node_total",
        "bleedwatch_alert_links_info",  # only with BLEEDWATCH_ALERT_LINKS_URL set
        "bleedwatch_webhook_deliveries_total",
        "bleedwatch_webhook_failed_attempts_total",
        "bleedwatch_webhook_given_up_total",
    }
    assert 'bleedwatch_open_incidents{severity="critical"} 0.0' in out
