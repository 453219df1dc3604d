"""Access control: the role matrix of every route (from the app's own routes), API keys, the audit trigger."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from fastapi.routing import APIRoute, iter_route_contexts

from service.app import create_app
from service.auth.deps import ROLES_ATTRIBUTE
from service.auth.keys import Role
from service.config import Settings
from tests.conftest import Api, running_api
from tests.incident_traffic import leak_pair

pytestmark = pytest.mark.anyio


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    """Without the per-address limit on failed keys: these tests call every route without one."""
    async with running_api(settings.model_copy(update={"auth_failures_per_second": 0})) as running:
        yield running


READERS = frozenset({Role.READ, Role.TRIAGE, Role.ADMIN})
ADMIN = frozenset({Role.ADMIN})
INGEST = frozenset({Role.INGEST})
TRIAGE = frozenset({Role.TRIAGE, Role.ADMIN})
# Every API route and the roles that may call it. A new route fails the first test until it is added here.
EXPECTED: dict[tuple[str, str], frozenset[Role]] = {
    ("POST", "/v1/exchanges"): INGEST,
    ("GET", "/v1/findings"): READERS,
    ("GET", "/v1/queue"): READERS,
    ("GET", "/v1/findings/{finding_id}"): READERS,
    ("POST", "/v1/allowlist"): ADMIN,
    ("POST", "/v1/allowlist/{entry_id}/fingerprints"): ADMIN,
    ("GET", "/v1/allowlist"): ADMIN,
    ("DELETE", "/v1/allowlist/{entry_id}"): ADMIN,
    ("POST", "/v1/canaries"): ADMIN,
    ("GET", "/v1/canaries"): ADMIN,
    ("DELETE", "/v1/canaries/{canary_id}"): ADMIN,
    ("PUT", "/v1/deployments/{deployment_id}"): ADMIN,
    ("GET", "/v1/deployments"): READERS,
    ("GET", "/v1/deployments/{deployment_id}"): READERS,
    ("POST", "/v1/signals"): INGEST,
    ("POST", "/v1/sdk/drops"): INGEST,
    ("GET", "/v1/signals"): READERS,
    ("GET", "/v1/incidents"): READERS,
    ("GET", "/v1/incidents/{incident_id}"): READERS,
    ("GET", "/v1/incidents/{incident_id}/impact"): READERS,
    ("PATCH", "/v1/incidents/{incident_id}"): TRIAGE,
    ("PATCH", "/v1/incidents/{incident_id}/findings/{finding_id}"): TRIAGE,
    ("GET", "/v1/audit"): ADMIN,
    ("POST", "/v1/keys"): ADMIN,
    ("GET", "/v1/keys"): ADMIN,
    ("DELETE", "/v1/keys/{key_id}"): ADMIN,
    ("POST", "/v1/tenants/purge"): ADMIN,
}
PUBLIC = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/docs/assets",  # Swagger UI's and ReDoc's files (service/api_docs.py)
    "/redoc",
}
# The responder UI's routes: a session cookie, not a bearer key, and roles checked in the route
# (tests/test_ui.py). Every other one sends a browser without a session to the sign-in page.
UI_OPEN = {("GET", "/ui/signin"), ("POST", "/ui/signin"), ("GET", "/ui/static/ui.css")}
UI = UI_OPEN | {
    ("POST", "/ui/signout"),
    ("GET", "/ui"),
    ("GET", "/ui/incidents/{incident_id}"),
    ("GET", "/ui/incidents/{incident_id}/impact.csv"),
    ("POST", "/ui/incidents/{incident_id}/status"),
    ("POST", "/ui/incidents/{incident_id}/assignee"),
    ("POST", "/ui/incidents/{incident_id}/notes"),
}


def declared_roles(route: APIRoute) -> frozenset[Role] | None:
    pending = list(route.dependant.dependencies)
    while pending:
        dep = pending.pop()
        roles = getattr(dep.call, ROLES_ATTRIBUTE, None)
        if roles is not None:
            return frozenset(roles)
        pending += dep.dependencies
    return None


def api_routes() -> dict[tuple[str, str], tuple[str, APIRoute]]:
    """(method, path template) -> (path template, route), from the app as it serves requests."""
    app = create_app(Settings(redis_url=None, database_url=None))
    out = {}
    for context in iter_route_contexts(app.routes):
        route, path = context.original_route, context.path
        if isinstance(route, APIRoute) and path is not None:
            for method in context.methods or ():
                out[(method, path)] = (path, route)
        else:
            assert path in PUBLIC, f"{path}: not an API route and not public"
    return out


ROUTES = api_routes()


def test_every_route_declares_the_roles_expected_of_it() -> None:
    declared = {k: declared_roles(r) for k, (_, r) in ROUTES.items() if k[1] not in PUBLIC and k not in UI}
    assert declared == EXPECTED
    assert {k for k in ROUTES if k[1] == "/ui" or k[1].startswith("/ui/")} == UI


async def test_every_ui_route_needs_a_session(api: Api) -> None:
    for method, path in sorted(UI - UI_OPEN):
        url, _ = _request(method, *ROUTES[(method, path)])
        resp = await api.client.request(method, url, data={"csrf": "x"} if method == "POST" else None)
        assert (resp.status_code, resp.headers.get("location")) == (303, "/ui/signin"), (method, path)


def _request(method: str, path: str, route: APIRoute) -> tuple[str, dict[str, Any]]:
    for param in route.dependant.path_params:
        path = path.replace("{" + param.name + "}", "1")
    return path, ({"json": {}} if method in ("POST", "PUT", "PATCH") else {})


async def test_every_role_on_every_route(api: Api) -> None:
    """No key: 401. A role the route does not take: 403 before anything else. A role it takes: past auth."""
    for (method, path), roles in sorted(EXPECTED.items()):
        url, kw = _request(method, *ROUTES[(method, path)])
        anonymous = await api.client.request(method, url, **kw)
        assert anonymous.status_code == 401, (method, path)
        assert anonymous.headers["www-authenticate"] == "Bearer"
        for role in Role:
            resp = await api.client.request(method, url, headers=api.headers(role), **kw)
            if role in roles:
                assert resp.status_code not in (401, 403), (method, path, role, resp.text)
            else:
                assert resp.status_code == 403, (method, path, role, resp.text)
                assert resp.json()["detail"].startswith(f"this key has role '{role.value}'")


async def test_keys_api_create_list_revoke_and_last_used(api: Api) -> None:
    admin = api.headers(Role.ADMIN)
    created = await api.client.post("/v1/keys", json={"name": "oncall-2", "role": "read"}, headers=admin)
    assert created.status_code == 201, created.text
    key = created.json()
    token = key["token"]
    assert token.startswith(f"bw_{key['id']}_")
    assert (key["role"], key["tenants"], key["last_used_at"], key["revoked_at"]) == ("read", None, None, None)

    def listed(items: list[dict[str, Any]]) -> dict[str, Any]:
        return next(k for k in items if k["id"] == key["id"])

    wrong = f"bw_{key['id']}_not-the-secret"
    assert (await api.client.get("/v1/findings", headers={"Authorization": f"Bearer {wrong}"})).status_code == 401
    keys = (await api.client.get("/v1/keys", headers=admin)).json()["items"]
    assert listed(keys)["last_used_at"] is None  # a wrong secret is no use of the key
    assert "token" not in listed(keys)
    assert token.removeprefix(f"bw_{key['id']}_") not in str(keys)  # the secret may hold "_" itself
    assert (await api.client.get("/v1/findings", headers={"Authorization": f"Bearer {token}"})).status_code == 200
    keys = (await api.client.get("/v1/keys", headers=admin)).json()["items"]
    assert listed(keys)["last_used_at"] is not None

    revoked = await api.client.delete(f"/v1/keys/{key['id']}", headers=admin)
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None
    assert (await api.client.get("/v1/findings", headers={"Authorization": f"Bearer {token}"})).status_code == 401
    again = await api.client.delete(f"/v1/keys/{key['id']}", headers=admin)
    assert again.status_code == 404
    actions = [e["action"] for e in (await api.client.get("/v1/audit", headers=admin)).json()["items"]]
    assert actions[::-1] == ["keys.create", "keys.list", "findings.list", "keys.list", "keys.revoke"]


async def test_ingest_keys_limited_to_tenants_through_the_api(api: Api) -> None:
    admin = api.headers(Role.ADMIN)
    bad = await api.client.post("/v1/keys", json={"name": "r", "role": "read", "tenants": ["acme"]}, headers=admin)
    assert bad.status_code == 422
    assert "only ingest keys" in bad.json()["detail"]
    made = await api.client.post("/v1/keys", json={"name": "gw", "role": "ingest", "tenants": ["acme"]}, headers=admin)
    assert made.json()["tenants"] == ["acme"]
    gateway = {"Authorization": f"Bearer {made.json()['token']}"}
    exchanges, _ = leak_pair("argparse", "acme", "globex", time.time())
    refused = await api.client.post("/v1/exchanges", json={"exchanges": exchanges[1:]}, headers=gateway)
    assert refused.status_code == 403
    assert "globex" not in refused.text
    # The other tenant's exchange is rejected alone; the key's own tenant's is taken.
    mixed = await api.client.post("/v1/exchanges", json={"exchanges": exchanges}, headers=gateway)
    assert mixed.status_code == 202
    results = [(r["status"], r["error"]) for r in mixed.json()["results"]]
    assert results == [("accepted", None), ("rejected", "forbidden")]
    assert "globex" not in mixed.text


@pytest.mark.parametrize("settings", ["redis+postgres"], indirect=True)
async def test_audit_log_is_append_only_in_postgres(api: Api, settings: Settings) -> None:
    assert (await api.client.get("/v1/findings", headers=api.headers(Role.READ))).status_code == 200
    assert settings.database_url is not None
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        for sql in ("UPDATE audit_log SET key_id = 'someone-else'", "DELETE FROM audit_log"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                conn.execute(sql)
        conn.execute("SET bleedwatch.retention = 'on'")  # as the retention job does (it uses SET LOCAL)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE audit_log SET key_id = 'x'")  # not even the retention job updates
        conn.execute("RESET bleedwatch.retention")
        with conn.transaction():
            conn.execute("SET LOCAL bleedwatch.retention = 'on'")
            deleted = conn.execute("DELETE FROM audit_log").rowcount
        assert deleted == 1
