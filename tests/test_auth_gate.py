"""Authentication before work: a request without a valid key costs no body read, no parse and,
for a token that cannot be a key, no query; unknown ids cannot evict known keys; failed keys are
rate-limited per client address; and each route has a body limit sized to its use."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

import service.auth.keys
from service.app import create_app
from service.auth.keys import KeyVerifier, Role
from service.config import Settings
from service.db import make_engine, make_sessionmaker
from service.migrate import upgrade
from tests.conftest import _create_keys

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def running(settings: Settings) -> AsyncIterator[tuple[FastAPI, dict[Role, str]]]:
    if settings.database_url is None:
        upgrade(settings)
    tokens = await _create_keys(settings)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app, tokens


def client(app: FastAPI, address: str = "10.0.0.1") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 1234)), base_url="http://bw.test")


@contextmanager
def counted_queries(engine: AsyncEngine) -> Iterator[list[str]]:
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(engine.sync_engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", count)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


async def test_a_bad_key_is_refused_before_the_body_is_read(settings: Settings) -> None:
    read: list[int] = []

    async def body() -> AsyncIterator[bytes]:
        read.append(1)
        yield b"{not json" * 100_000

    unknown = f"bw_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
    unlimited = settings.model_copy(update={"auth_failures_per_second": 0})
    async with running(unlimited) as (app, tokens), client(app) as http:
        for path in ("/v1/exchanges", "/v1/keys", "/v1/allowlist", "/v1/tenants/purge"):
            for headers in ({"Content-Type": "application/json"}, bearer("bw_x_y"), bearer(unknown)):
                resp = await http.post(path, content=body(), headers=headers)
                assert resp.status_code == 401, (path, resp.text)
                assert resp.json()["error"] == "unauthorized"
                # Declared far over every body limit: still 401, not 413, so the key came first.
                huge = {**headers, "Content-Length": str(10**10)}
                resp = await http.post(path, content=b"", headers=huge)
                assert resp.status_code == 401, (path, resp.text)
        # A key without the role is refused (403) before the body is parsed too.
        resp = await http.post("/v1/exchanges", content=body(), headers=bearer(tokens[Role.READ]))
        assert resp.status_code == 403
        assert read == []
        # The same body with the right key is read, and refused for what it is.
        resp = await http.post("/v1/exchanges", content=body(), headers=bearer(tokens[Role.INGEST]))
        assert resp.status_code == 422
        assert read == [1]


async def test_a_token_that_cannot_be_a_key_costs_no_query(settings: Settings) -> None:
    async with running(settings) as (app, tokens), client(app) as http:
        malformed = [
            "bw_nope_nope",
            "bw__secret",
            "xx_00112233aabb_secret",
            f"bw_{'0' * 64}_secret",
            "bw_00112233aabb_",
            "bw_00112233AABB_secret",
            "bw_00112233aabb_" + "s" * 500,
            "bw_00112233aabb_sec ret",
        ]
        with counted_queries(app.state.deps.engine) as queries:
            for token in malformed:
                assert (await http.get("/v1/findings", headers=bearer(token))).status_code == 401
        assert queries == []
        # A well-formed unknown id costs one query, then none while it is cached as unknown.
        unknown = f"bw_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"
        with counted_queries(app.state.deps.engine) as queries:
            for _ in range(3):
                assert (await http.get("/v1/findings", headers=bearer(unknown))).status_code == 401
        assert len(queries) == 1
        assert (await http.get("/v1/findings", headers=bearer(tokens[Role.READ]))).status_code == 200


async def test_unknown_key_ids_cannot_evict_known_keys(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service.auth.keys, "MAX_UNKNOWN", 200)  # the bound, not its size, is under test
    settings = Settings(database_url=pg_url)
    tokens = await _create_keys(settings)
    engine = make_engine(settings)
    keys = KeyVerifier(make_sessionmaker(engine), cache_seconds=3600)
    for token in tokens.values():
        assert await keys.verify(token) is not None
    for _ in range(service.auth.keys.MAX_UNKNOWN + 1):
        assert await keys.verify(f"bw_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}") is None
    with counted_queries(engine) as queries:
        for role, token in tokens.items():
            caller = await keys.verify(token)
            assert caller is not None
            assert caller.role == role
    assert queries == []  # every known key still cached
    await engine.dispose()


async def test_failed_keys_are_rate_limited_per_client_address(settings: Settings) -> None:
    # A try a minute: still out of tries when a slow, loaded machine has started the second replica.
    limited = settings.model_copy(update={"auth_failures_per_second": 1 / 60, "auth_failures_burst": 3})
    async with running(limited) as (app, tokens), client(app, "10.0.0.7") as attacker:
        good = bearer(tokens[Role.READ])
        assert (await attacker.get("/v1/findings", headers=good)).status_code == 200
        for i in range(3):
            wrong = bearer(f"bw_{secrets.token_hex(6)}_{i}")
            assert (await attacker.get("/v1/findings", headers=wrong)).status_code == 401
        refused = await attacker.get("/v1/findings", headers=bearer(f"bw_{secrets.token_hex(6)}_x"))
        assert refused.status_code == 429
        assert refused.json()["error"] == "rate_limited"
        assert 1 <= int(refused.headers["retry-after"]) <= 60
        with counted_queries(app.state.deps.engine) as queries:
            again = await attacker.get("/v1/findings", headers=bearer(f"bw_{secrets.token_hex(6)}_y"))
        assert again.status_code == 429
        assert queries == []  # out of tries: a new id costs no query
        assert (await attacker.get("/v1/findings")).status_code == 429
        # A key verified here before still works from that address; other addresses are not affected.
        assert (await attacker.get("/v1/findings", headers=good)).status_code == 200
        async with client(app, "10.0.0.8") as neighbour:
            assert (await neighbour.get("/v1/findings", headers=bearer("bw_x_y"))).status_code == 401
        if settings.redis_url is not None:  # replicas share the address's bucket through Redis
            async with running(limited) as (other, _), client(other, "10.0.0.7") as elsewhere:
                wrong = bearer(f"bw_{secrets.token_hex(6)}_z")
                assert (await elsewhere.get("/v1/findings", headers=wrong)).status_code == 429


async def test_each_route_has_a_body_limit_sized_to_its_use(settings: Settings) -> None:
    big = b'{"name": "' + b"x" * (1024 * 1024 + 10) + b'"}'
    async with running(settings) as (app, tokens), client(app) as http:
        admin = bearer(tokens[Role.ADMIN])
        for method, path in (
            ("POST", "/v1/keys"),
            ("PATCH", "/v1/incidents/1"),
            ("PUT", "/v1/deployments/pd-eu-1"),
            ("POST", "/v1/tenants/purge"),
        ):
            resp = await http.request(method, path, content=big, headers=admin)
            assert resp.status_code == 413, (path, resp.text)
            assert "BLEEDWATCH_MAX_OTHER_BODY_BYTES" in resp.json()["detail"]
        for path in ("/v1/allowlist", "/v1/allowlist/1/fingerprints", "/v1/canaries"):
            resp = await http.post(path, content=big, headers=admin)
            assert resp.status_code == 422, (path, resp.text)  # read, and refused for its fields
        ingest = bearer(tokens[Role.INGEST])
        resp = await http.post("/v1/exchanges", content=big, headers=ingest)
        assert resp.status_code == 422
