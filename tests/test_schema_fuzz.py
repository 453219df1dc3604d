"""Schemathesis over the whole OpenAPI document with ``--checks all``, once with each role's key.

The embedded default behind a real loopback server, seeded with an incident, findings and
signals. The CLI (the version pinned in pyproject.toml) runs every phase (coverage, fuzzing,
stateful) and every check: no 5xx, statuses, headers, content types and bodies as declared,
schema-valid requests accepted and schema-violating ones refused, 405 with a matching ``Allow``,
auth not ignored. ``tests/schemathesis.toml`` lists the one exception and why. Bounded:
``MAX_EXAMPLES`` per operation and a fixed seed, so CI runs the same requests every time (about
15 s a role). ``pytest -s`` prints the CLI's report.

The smaller tests below pin down the defects the fuzzer found, so a regression names itself.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.app import create_app
from service.auth.keys import Role
from service.config import Settings
from service.local_server import local_server
from service.migrate import upgrade
from tests.conftest import Api, _create_keys
from tests.incident_traffic import leak_pair

pytestmark = pytest.mark.anyio
MAX_EXAMPLES = 10
SEED = 1
CONFIG = Path(__file__).parent / "schemathesis.toml"


def _seed(url: str, tokens: dict[Role, str]) -> None:
    """An incident with findings and signals, so ids 1 and 2 exist for the generated requests."""
    ingest = {"Authorization": f"Bearer {tokens[Role.INGEST]}"}
    now = time.time()
    # httpx's 5 s default is too short for a fresh app's first batch on a loaded machine (CI's workers).
    with httpx.Client(headers=ingest, timeout=60) as client:
        for text, recipient in (("argparse", "globex"), ("csv", "umbrella")):
            exchanges, _ = leak_pair(text, "acme", recipient, now)
            assert client.post(f"{url}/v1/exchanges", json={"exchanges": exchanges}).status_code == 202
        event = {"kind": "kv_transfer_short", "deployment": "pd-eu-1", "node": "decode-3", "ts": now}
        assert client.post(f"{url}/v1/signals", json={"events": [event]}).status_code == 202


@pytest.mark.parametrize("role", list(Role))
def test_schemathesis_checks_all_with_each_role(tmp_path: Path, role: Role) -> None:
    cli = shutil.which("schemathesis")
    assert cli is not None, "schemathesis is not installed: pip install -e '.[dev]'"
    # Every request of every check counts: no rate limits (a fresh app per role: stateful tests
    # revoke keys and delete what they find).
    config = Settings(
        redis_url=None,
        database_url=None,
        data_dir=tmp_path / "data",
        rate_limit_per_second=0,
        auth_failures_per_second=0,
    )
    upgrade(config)
    tokens = asyncio.run(_create_keys(config))
    with local_server(create_app(config)) as url:
        _seed(url, tokens)
        args = [
            cli,
            "--no-color",
            "--config-file",
            str(CONFIG),
            "run",
            f"{url}/openapi.json",
            "--checks",
            "all",
            "--header",
            f"Authorization: Bearer {tokens[role]}",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            str(SEED),
            "--generation-database",
            "none",
            "--request-timeout",
            "20",
        ]
        result = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-2000:]
    assert "passed" in result.stdout


@pytest.mark.parametrize("settings", ["embedded"], indirect=True)
async def test_405_lists_every_method_of_the_path_in_allow(api: Api) -> None:
    for method, path, allowed in (
        ("OPTIONS", "/v1/allowlist", "GET, POST"),
        ("TRACE", "/v1/keys/0123456789ab", "DELETE"),
        ("PUT", "/v1/incidents/1", "GET, PATCH"),
        ("POST", "/healthz", "GET"),
    ):
        resp = await api.client.request(method, path, headers=api.headers(Role.ADMIN))
        assert resp.status_code == 405, (method, path)
        assert resp.headers["allow"] == allowed
        assert resp.json()["error"] == "method_not_allowed"


@pytest.mark.parametrize("settings", ["embedded"], indirect=True)
async def test_a_body_that_is_not_json_is_the_documented_422(api: Api) -> None:
    admin = api.headers(Role.ADMIN) | {"Content-Type": "application/json"}
    for body in (b"\xff\xfe\x00not utf-8", b"{not json", b""):
        resp = await api.client.post("/v1/keys", content=body, headers=admin)
        assert resp.status_code == 422, body
        assert resp.json()["error"] == "invalid"
    schema = (await api.client.get("/openapi.json")).json()
    assert "422" in schema["paths"]["/v1/keys"]["post"]["responses"]


@pytest.mark.parametrize("settings", ["embedded"], indirect=True)
async def test_every_cursor_the_schema_admits_is_a_position(api: Api) -> None:
    schema = (await api.client.get("/openapi.json")).json()
    read = api.headers(Role.ADMIN)
    cursors = {
        "/v1/findings": "123",
        "/v1/audit": "7",
        "/v1/signals": "1733390000000000.12",
        "/v1/incidents": "-5.0",
        "/v1/deployments": "pd-eu-1",
    }
    for path, cursor in cursors.items():
        (param,) = [p for p in schema["paths"][path]["get"]["parameters"] if p["name"] == "cursor"]
        assert "pattern" in str(param["schema"]), path
        resp = await api.client.get(path, params={"cursor": cursor}, headers=read)
        assert resp.status_code == 200, (path, resp.text)
        bad = await api.client.get(path, params={"cursor": "a/b\x01"}, headers=read)
        assert bad.status_code == 422, path
    for sort in ("opened_at", "severity"):  # one cursor shape, read under either sort
        resp = await api.client.get("/v1/incidents", params={"sort": sort, "cursor": "3.9"}, headers=read)
        assert resp.status_code == 200


@pytest.mark.parametrize("settings", ["embedded"], indirect=True)
async def test_incident_patch_schema_forbids_what_the_api_refuses(api: Api) -> None:
    schema = (await api.client.get("/openapi.json")).json()
    patch: dict[str, Any] = schema["components"]["schemas"]["IncidentPatch"]
    assert "null" not in str(patch["properties"]["status"])
    assert patch["minProperties"] == 1
    triage = api.headers(Role.TRIAGE)
    for body in ({"status": None}, {}):
        resp = await api.client.patch("/v1/incidents/1", json=body, headers=triage)
        assert resp.status_code == 422, body
    resp = await api.client.patch("/v1/incidents/1/findings/1", json={"false_positive": 0}, headers=triage)
    assert resp.status_code == 422  # a boolean, not 0


@pytest.mark.parametrize("settings", ["embedded"], indirect=True)
async def test_numbers_and_times_are_what_the_schema_says(api: Api) -> None:
    read = api.headers(Role.READ)
    assert (await api.client.get("/v1/findings", params={"since": "1e3"}, headers=read)).status_code == 200
    assert (await api.client.get("/v1/findings", params={"since": "10000000001"}, headers=read)).status_code == 422
    drop = {"report_id": "0123456789abcdef", "count": "3"}
    resp = await api.client.post("/v1/sdk/drops", json=drop, headers=api.headers(Role.INGEST))
    assert resp.status_code == 422  # a JSON integer, not a string
    resp = await api.client.post("/v1/sdk/drops", json=drop | {"count": 3.0}, headers=api.headers(Role.INGEST))
    assert resp.status_code == 202  # JSON Schema counts 3.0 as an integer
