"""Shared fixtures: real Redis and PostgreSQL, isolated per run, and the embedded default.

Every backend-facing test runs against both the embedded default and Redis + PostgreSQL.
A run gets its own PostgreSQL schema (migrated once with Alembic) and its own Redis key
prefix per test, so concurrent runs on one machine never see each other's data; so does each
pytest-xdist worker of a run (scripts/test), since each imports this module with its own RUN_ID.

The index contract and end-to-end tests also run on a real Redis Cluster (``ALL_BACKENDS``):
three masters the session starts on free loopback ports in a temporary directory, the first
time a test asks for one, and tears down at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest
import redis
from fastapi import FastAPI

from service.app import create_app
from service.auth.keys import Role, create_key
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.index.base import Index
from service.index.factory import make_index
from service.local_server import local_server
from service.migrate import upgrade
from tests.redis_servers import RedisClusterServers

REDIS_URL = os.environ.get("BLEEDWATCH_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get("BLEEDWATCH_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
RUN_ID = uuid.uuid4().hex[:10]
_counter = itertools.count()

BACKENDS = ["embedded", "redis+postgres"]
# For the index contract and end-to-end tests: ``pytest.mark.parametrize("settings", ALL_BACKENDS, indirect=True)``.
ALL_BACKENDS = [*BACKENDS, "redis-cluster+postgres"]


def _with_schema(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """asyncio only: the service runs on asyncio, and anyio's own fixture would run every async test
    on trio too wherever trio is installed (selenium, for the UI's browser test, brings it)."""
    return "asyncio"


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    schema = f"bw_test_{RUN_ID}"
    try:
        admin = psycopg.connect(DATABASE_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {DATABASE_URL} ({exc}); start it or set BLEEDWATCH_TEST_DATABASE_URL"
        )
    admin.execute(f'CREATE SCHEMA "{schema}"')
    url = _with_schema(DATABASE_URL, schema)
    upgrade(Settings(database_url=url))
    yield url
    admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    admin.close()


@pytest.fixture(scope="session")
def redis_ok() -> None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis is not reachable at {REDIS_URL} ({exc}); start it or set BLEEDWATCH_TEST_REDIS_URL")


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    cluster = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        cluster.stop()
        pytest.fail(f"could not start a local Redis Cluster ({exc}); redis-server and redis-cli must be installed")
    yield cluster
    cluster.stop()


def _drop_prefix(prefix: str, url: str = REDIS_URL) -> None:
    """Every key of one test's prefix; one key per command, so it works on a cluster node too."""
    client = redis.Redis.from_url(url)
    pipe = client.pipeline(transaction=False)
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        pipe.unlink(key)
        if len(pipe) >= 1000:
            pipe.execute()
    pipe.execute()
    client.close()


def _truncate(url: str) -> None:
    """Empty every table of the run's schema (tests run one at a time within a run, or an xdist worker)."""
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename <> 'alembic_version'"
            )
        ]
        conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")


@pytest.fixture(params=BACKENDS)
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    """Settings for one test on one backend; extra fields via ``@pytest.mark.parametrize`` are not needed."""
    if request.param == "embedded":
        yield Settings(redis_url=None, database_url=None, data_dir=tmp_path / "data")
        return
    url = request.getfixturevalue("pg_url")
    _truncate(url)
    prefix = f"bwt{RUN_ID}{next(_counter)}"
    if request.param == "redis-cluster+postgres":
        cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
        yield Settings(
            redis_url=cluster.url, redis_cluster=True, database_url=url, key_prefix=prefix, data_dir=tmp_path / "data"
        )
        for node in cluster.nodes:
            _drop_prefix(prefix, node.url)
        return
    request.getfixturevalue("redis_ok")
    yield Settings(redis_url=REDIS_URL, database_url=url, key_prefix=prefix, data_dir=tmp_path / "data")
    _drop_prefix(prefix)


@pytest.fixture
async def index(settings: Settings) -> AsyncIterator[Index]:
    idx = make_index(settings)
    yield idx
    await idx.close()


@dataclass
class Api:
    """The app over HTTP (in-process ASGI, lifespan running), with one API key per role."""

    client: httpx.AsyncClient
    tokens: dict[Role, str]
    app: FastAPI

    def headers(self, role: Role | None) -> dict[str, str]:
        return {} if role is None else {"Authorization": f"Bearer {self.tokens[role]}"}

    async def processed(self, timeout_seconds: float = 30.0) -> None:
        """Until every batch accepted so far is processed (answers with respond-async come first)."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            resp = await self.client.get("/v1/queue", headers=self.headers(Role.READ))
            assert resp.status_code == 200, resp.text
            if resp.json()["queued"] == 0:
                return
            assert time.monotonic() < deadline, "batches still queued"
            await asyncio.sleep(0.02)


async def _create_keys(settings: Settings) -> dict[Role, str]:
    engine = make_engine(settings)
    tokens = {}
    async with session_scope(make_sessionmaker(engine)) as session:
        for role in Role:
            _, tokens[role] = await create_key(session, f"test {role.value}", role)
    await engine.dispose()
    return tokens


@asynccontextmanager
async def running_api(settings: Settings) -> AsyncIterator[Api]:
    if settings.database_url is None:
        upgrade(settings)
    tokens = await _create_keys(settings)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bleedwatch.test") as client:
            yield Api(client, tokens, app)


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[Api]:
    async with running_api(settings) as running:
        yield running


@dataclass
class Served:
    """A server on a loopback port, for clients in other processes (an SDK wheel's venv, LiteLLM's)."""

    url: str
    tokens: dict[Role, str]


@pytest.fixture
def served(settings: Settings) -> Iterator[Served]:
    if settings.database_url is None:
        upgrade(settings)
    tokens = asyncio.run(_create_keys(settings))
    with local_server(create_app(settings)) as url:
        yield Served(url, tokens)


def failed_attempts(caplog: pytest.LogCaptureFixture) -> int:
    """The SDK client's POSTs of batches that were not accepted: it logs each (a retry, or the last of its round)."""
    return sum(m.startswith("bleedwatch ingest failed (") for m in caplog.messages)
