"""``/docs`` and ``/redoc`` work on an air-gapped network, and the OpenAPI document says how to authenticate."""

from __future__ import annotations

import re

import pytest

from tests.conftest import Api

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("settings", ["embedded"], indirect=True)]

REFERENCE = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|(?:url|spec-url)\s*:\s*["']([^"']+)["']""")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_pages_load_only_local_assets_and_they_are_served(api: Api, page: str) -> None:
    resp = await api.client.get(page)
    assert resp.status_code == 200
    assert "text/html" in resp.headers["content-type"]
    html = resp.text
    assert "https://" not in html  # no CDN, no web fonts: nothing from outside
    assert "http://" not in html
    referenced = {a or b for a, b in REFERENCE.findall(html)}
    assets = {r for r in referenced if r.startswith("/docs/assets/")}
    assert referenced - assets <= {"/openapi.json", "/docs/oauth2-redirect"}, referenced
    scripts = {a for a in assets if a.endswith(".js")}
    assert len(scripts) == 1  # Swagger UI's bundle, or ReDoc's standalone build
    for asset in assets:
        got = await api.client.get(asset)
        assert got.status_code == 200, asset
        assert len(got.content) > 1000, asset
        kind = {"js": "javascript", "css": "text/css", "png": "image/png"}[asset.rsplit(".", 1)[1]]
        assert kind in got.headers["content-type"], asset


async def test_openapi_declares_the_bearer_scheme_on_every_authenticated_route(api: Api) -> None:
    schema = (await api.client.get("/openapi.json")).json()
    bearer = schema["components"]["securitySchemes"]["bearer"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    operations = [(path, op) for path, ops in schema["paths"].items() for op in ops.values()]
    v1 = [op for path, op in operations if path.startswith("/v1/")]
    assert len(v1) > 10
    assert all(op["security"] == [{"bearer": []}] for op in v1)
    assert all("security" not in op for path, op in operations if not path.startswith("/v1/"))  # /healthz, /readyz
