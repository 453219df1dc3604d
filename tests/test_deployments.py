"""Deployment risk check: serving configs, the rules, the gauges, on every backend."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from service import metrics
from service.auth.keys import Role
from service.cli import main
from service.config import Settings
from service.deployments.rules import RulesError, load_rules, parse_rules, parse_version
from service.deployments.schemas import DeploymentConfig
from service.tools.demo.run import INCIDENT_CONFIG
from service.tools.sim.engine import EngineConfig, Mode
from tests.conftest import Api, running_api

pytestmark = pytest.mark.anyio

# The incident's config, as the demo registers it.
INCIDENT: dict[str, Any] = INCIDENT_CONFIG
SAFE: dict[str, Any] = INCIDENT | {
    "prefill_kv_pool_tokens": 1_048_576,
    "safeguards": {
        "deferred_page_release_prefill": True,
        "deferred_page_release_decode": True,
        "kv_transfer_batch_cap": 32,
        "lb_aborts_on_client_disconnect": False,
    },
}
POOL_RULE = "kv_pool_below_context_length"


async def put(api: Api, deployment: str, body: dict[str, Any], role: Role | None = Role.ADMIN) -> Any:
    return await api.client.put(f"/v1/deployments/{deployment}", json=body, headers=api.headers(role))


def gauge(text: str, rule: str) -> float:
    match = re.search(rf'^bleedwatch_deployment_risk_violations\{{rule="{rule}"\}} (\S+)$', text, re.M)
    assert match, f"no gauge for {rule}"
    return float(match.group(1))


async def scrape(api: Api) -> str:
    return (await api.client.get("/metrics")).text


async def test_the_incidents_config_is_flagged(api: Api) -> None:
    resp = await put(api, "pd-prod-1m", INCIDENT)
    assert resp.status_code == 201
    body = resp.json()
    assert body["at_risk"] is True
    rules = {v["rule"]: v for v in body["violations"]}
    assert set(rules) == {
        POOL_RULE,
        "page_release_not_deferred",
        "kv_transfer_batches_uncapped",
        "lb_aborts_mid_transfer",
    }
    assert rules[POOL_RULE]["severity"] == "critical"
    assert "681,280" in rules[POOL_RULE]["detail"]
    assert "1,048,576" in rules[POOL_RULE]["detail"]
    assert "prefill" in rules[POOL_RULE]["detail"]
    assert "decode" not in rules[POOL_RULE]["detail"]  # the decode pool is large enough
    assert body["updated_by"]
    assert body["created_at"] == body["updated_at"]


async def test_pool_rule_fires_and_clears_with_the_gauge(api: Api) -> None:
    small = {**SAFE, "context_length": 4_000, "prefill_kv_pool_tokens": 2_000, "decode_kv_pool_tokens": 4_000}
    assert gauge(await scrape(api), POOL_RULE) == 0
    resp = await put(api, "sim-a", small)
    assert resp.status_code == 201
    assert [v["rule"] for v in resp.json()["violations"]] == [POOL_RULE]
    await put(api, "sim-b", small | {"decode_kv_pool_tokens": 3_999})
    text = await scrape(api)
    assert gauge(text, POOL_RULE) == 2
    assert gauge(text, "lb_aborts_mid_transfer") == 0
    assert "bleedwatch_deployments 2.0" in text
    assert "bleedwatch_deployments_at_risk 2.0" in text
    detail = (await api.client.get("/v1/deployments/sim-b", headers=api.headers(Role.READ))).json()
    assert "decode KV pool holds 3,999" in detail["violations"][0]["detail"]

    fixed = await put(api, "sim-a", small | {"prefill_kv_pool_tokens": 4_000})
    assert fixed.status_code == 200
    assert fixed.json()["violations"] == []
    assert fixed.json()["at_risk"] is False
    assert fixed.json()["created_at"] < fixed.json()["updated_at"]
    assert gauge(await scrape(api), POOL_RULE) == 1
    await put(api, "sim-b", small | {"prefill_kv_pool_tokens": 4_000})
    text = await scrape(api)
    assert gauge(text, POOL_RULE) == 0
    assert "bleedwatch_deployments_at_risk 0.0" in text
    assert "sim-a" not in text  # no deployment id is ever a label


async def test_the_gauges_are_rebuilt_from_the_database_at_start(settings: Settings) -> None:
    async with running_api(settings) as api:
        await put(api, "pd-prod-1m", INCIDENT)
    metrics.DEPLOYMENT_RISK_VIOLATIONS.labels(POOL_RULE).set(0)  # what a fresh process has
    metrics.DEPLOYMENTS.set(0)
    async with running_api(settings) as replica:  # a restart, or another replica on the same database
        text = await scrape(replica)
        assert gauge(text, POOL_RULE) == 1
        assert gauge(text, "kv_transfer_batches_uncapped") == 1
        assert "bleedwatch_deployments 1.0" in text


async def test_the_simulators_builds(api: Api) -> None:
    buggy = (await put(api, "sim-pd-1", EngineConfig().deployment_config())).json()
    assert {v["rule"] for v in buggy["violations"]} == {
        POOL_RULE,
        "page_release_not_deferred",
        "kv_transfer_batches_uncapped",
        "lb_aborts_mid_transfer",
        "engine_version_below_isolation_fix",
    }
    fixed = (await put(api, "sim-pd-1", EngineConfig(mode=Mode.FIXED).deployment_config())).json()
    assert [v["rule"] for v in fixed["violations"]] == [POOL_RULE]  # refuses now, still cannot serve the context


async def test_list_filters_and_pages(api: Api) -> None:
    for name in ("d-1", "d-2", "d-3"):
        await put(api, name, SAFE)
    await put(api, "d-4", INCIDENT)
    read = api.headers(Role.READ)
    everything = (await api.client.get("/v1/deployments", headers=read)).json()
    assert [d["id"] for d in everything["items"]] == ["d-1", "d-2", "d-3", "d-4"]
    assert everything["next_cursor"] is None
    risky = (await api.client.get("/v1/deployments", params={"at_risk": "true"}, headers=read)).json()
    assert [d["id"] for d in risky["items"]] == ["d-4"]
    by_rule = await api.client.get("/v1/deployments", params={"rule": "lb_aborts_mid_transfer"}, headers=read)
    assert [d["id"] for d in by_rule.json()["items"]] == ["d-4"]
    typo = await api.client.get("/v1/deployments", params={"rule": "kv_pool_below_context"}, headers=read)
    assert typo.status_code == 404  # not an empty list, which would read as nothing at risk
    assert "kv_pool_below_context_length" in typo.json()["detail"]
    safe = (await api.client.get("/v1/deployments", params={"at_risk": "false"}, headers=read)).json()
    assert [d["id"] for d in safe["items"]] == ["d-1", "d-2", "d-3"]
    pages, cursor = [], None
    while True:
        params = {"limit": "3"} | ({"cursor": cursor} if cursor else {})
        page = (await api.client.get("/v1/deployments", params=params, headers=read)).json()
        pages.append([d["id"] for d in page["items"]])
        if (cursor := page["next_cursor"]) is None:
            break
    assert pages == [["d-1", "d-2", "d-3"], ["d-4"]]
    bad = await api.client.get("/v1/deployments", params={"cursor": "no/pe"}, headers=read)
    assert bad.status_code == 422  # not a deployment id: outside the cursor's schema pattern
    missing = await api.client.get("/v1/deployments/nope", headers=read)
    assert missing.json() == {"error": "not_found", "detail": "no deployment nope"}


async def test_bad_configs_are_refused_with_the_field(api: Api) -> None:
    cases = [
        ({k: v for k, v in SAFE.items() if k != "context_length"}, "context_length"),
        (SAFE | {"context_length": 0}, "context_length"),
        (SAFE | {"prefill_kv_pool_tokens": -1}, "prefill_kv_pool_tokens"),
        (SAFE | {"engine": "sg lang"}, "engine"),
        (SAFE | {"extra": 1}, "extra"),
        (SAFE | {"safeguards": {"kv_transfer_batch_cap": 0}}, "safeguards.kv_transfer_batch_cap"),
        (SAFE | {"safeguards": {"zeroing": True}}, "safeguards.zeroing"),
    ]
    for body, field in cases:
        resp = await put(api, "d", body)
        assert resp.status_code == 422, body
        assert resp.json()["error"] == "invalid"
        assert field in resp.json()["detail"]
    # Safeguards not declared count as missing.
    undeclared = (await put(api, "d", SAFE | {"safeguards": {}})).json()
    assert {v["rule"] for v in undeclared["violations"]} == {
        "page_release_not_deferred",
        "kv_transfer_batches_uncapped",
        "lb_aborts_mid_transfer",
    }
    assert "not declared" in undeclared["violations"][0]["detail"]
    colocated = (await put(api, "c", SAFE | {"disaggregated": False, "safeguards": {}})).json()
    assert colocated["violations"] == []  # the transfer safeguards only concern disaggregated serving


async def test_roles(api: Api) -> None:
    for role, status in ((None, 401), (Role.INGEST, 403), (Role.READ, 403), (Role.TRIAGE, 403), (Role.ADMIN, 201)):
        assert (await put(api, "r", SAFE, role)).status_code == status, role
    for role, status in ((None, 401), (Role.INGEST, 403), (Role.READ, 200), (Role.TRIAGE, 200), (Role.ADMIN, 200)):
        for path in ("/v1/deployments", "/v1/deployments/r"):
            assert (await api.client.get(path, headers=api.headers(role))).status_code == status, (role, path)
    forbidden = await put(api, "r", SAFE, Role.READ)
    assert forbidden.json()["error"] == "forbidden"


def version(text: str) -> tuple[tuple[int, ...], int]:
    parsed = parse_version(text)
    assert parsed is not None, text
    return parsed


def test_shipped_rules_and_versions() -> None:
    rules = load_rules()
    assert rules.names == [
        POOL_RULE,
        "page_release_not_deferred",
        "kv_transfer_batches_uncapped",
        "lb_aborts_mid_transfer",
        "engine_version_below_isolation_fix",
    ]
    assert all(name in rules.names for name in metrics.DEPLOYMENT_RISK_RULES)
    assert version("0.5.0rc1") < version("0.5") == version("0.5.0") < version("0.5.1")
    assert version("v1.10.0") > version("1.9.9") > version("1.9.9.dev1")
    assert parse_version("as-deployed") is None
    config = DeploymentConfig.model_validate(SAFE | {"engine": "bleedwatch-sim", "engine_version": "weird"})
    (violation,) = rules.evaluate(config)
    assert "cannot be compared" in violation.detail


def test_bad_rules_files_say_what_is_wrong(tmp_path: Path) -> None:
    cases = [
        ("[[rule]\n", "not TOML"),
        ('[[rule]]\nname = "Bad Name"\ncheck = "safeguard_enabled"\n', "lower_snake_case"),
        ('[[rule]]\nname = "x"\ncheck = "zeroing"\n', "check must be one of"),
        ('[[rule]]\nname = "x"\ncheck = "safeguard_enabled"\nfields = ["nope"]\n', "nope not among"),
        ('[[rule]]\nname = "x"\ncheck = "kv_pool_at_least_context"\nroles = ["gpu"]\n', "gpu not among"),
        ('[[rule]]\nname = "x"\ncheck = "engine_min_version"\n[rule.min_versions]\nvllm = "latest"\n', "not a version"),
        ('[[rule]]\nname = "x"\ncheck = "safeguard_at_most"\nfield = "kv_transfer_batch_cap"\nmax = 0\n', "positive"),
        ('[[rule]]\nname = "x"\ncheck = "kv_pool_at_least_context"\ncolour = 1\n', "unknown keys colour"),
        ('[[rule]]\nname = "x"\ncheck = "kv_pool_at_least_context"\n' * 2, "unique"),
    ]
    for text, message in cases:
        with pytest.raises(RulesError, match=message):
            parse_rules(text, "rules.toml")
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path / "missing.toml")


async def test_an_operators_rules_file_replaces_the_shipped_one(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text(
        "[[rule]]\n"
        'name = "vllm_before_isolation_fix"\n'
        'check = "engine_min_version"\n'
        'severity = "critical"\n'
        'summary = "an engine version with a known isolation bug"\n'
        "[rule.min_versions]\n"
        'vllm = "0.9.2"\n'
        "[[rule]]\n"
        'name = "kv_transfer_batches_too_large"\n'
        'check = "safeguard_at_most"\n'
        'field = "kv_transfer_batch_cap"\n'
        "max = 16\n"
    )
    monkeypatch.setattr(settings, "risk_rules_file", rules)  # BLEEDWATCH_RISK_RULES_FILE
    async with running_api(settings) as api:
        body = (await put(api, "v", SAFE | {"engine": "vllm", "engine_version": "0.9.1"})).json()
        assert [(v["rule"], v["detail"]) for v in body["violations"]] == [
            ("vllm_before_isolation_fix", "vllm 0.9.1 is older than 0.9.2, the first version with the fix"),
            ("kv_transfer_batches_too_large", "kv_transfer_batch_cap is 32, above the cap of 16"),
        ]
        newer = copy.deepcopy(SAFE) | {"engine": "vllm", "engine_version": "0.10.0"}
        newer["safeguards"]["kv_transfer_batch_cap"] = 8
        assert (await put(api, "v", newer)).json()["violations"] == []
        assert gauge(await scrape(api), "vllm_before_isolation_fix") == 0
    monkeypatch.setattr(settings, "risk_rules_file", tmp_path / "missing.toml")
    with pytest.raises(RulesError, match="cannot read"):
        async with running_api(settings):
            pass


def test_a_rules_file_that_does_not_load_stops_the_cli_with_what_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "rules.toml"
    bad.write_text('[[rule]]\nname = "Bad"\n')
    monkeypatch.setenv("BLEEDWATCH_RISK_RULES_FILE", str(bad))
    assert main(["serve"]) == 2
    assert capsys.readouterr().err == (
        f"bleedwatch: BLEEDWATCH_RISK_RULES_FILE: {bad}: rule 1: name must be lower_snake_case, at most 64 characters\n"
    )
    monkeypatch.setenv("BLEEDWATCH_RISK_RULES_FILE", str(tmp_path / "missing.toml"))
    assert main(["migrate"]) == 2
    assert "cannot read the rules file" in capsys.readouterr().err
