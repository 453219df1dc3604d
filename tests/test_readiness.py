"""/readyz says a database without this version's schema is not ready, and how to fix it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from service import readiness
from service.app import create_app
from service.config import Settings
from service.db import make_engine
from service.index.memory import MemoryIndex
from service.index.window import Window
from service.migrate import upgrade
from tests.conftest import DATABASE_URL, RUN_ID, _with_schema

pytestmark = pytest.mark.anyio

NOT_MIGRATED = "not migrated: run `bleedwatch migrate`"


async def test_readyz_refuses_an_explicit_database_url_until_it_is_migrated(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'explicit.db'}", data_dir=tmp_path)
    app = create_app(settings)  # serve migrates only the embedded default, not an explicit URL
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bleedwatch.test") as client:
            before = await client.get("/readyz")
            upgrade(settings)
            after = await client.get("/readyz")
    assert before.status_code == 503
    assert before.json()["checks"] == {"index": "ok", "database": NOT_MIGRATED}
    assert after.status_code == 200, after.json()


@pytest.fixture
def bare_schema() -> Iterator[str]:
    """A PostgreSQL schema of its own, empty."""
    schema = f"bw_ready_{RUN_ID}"
    admin = psycopg.connect(DATABASE_URL, autocommit=True, connect_timeout=5)
    admin.execute(f'CREATE SCHEMA "{schema}"')
    yield _with_schema(DATABASE_URL, schema)
    admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    admin.close()


async def test_a_schema_behind_this_version_is_not_ready_and_a_newer_one_is(bare_schema: str) -> None:
    settings = Settings(database_url=bare_schema)
    head, _ = readiness._revisions()
    engine = make_engine(settings)
    index = MemoryIndex(Window(3600, 4), 3, 8)

    async def database() -> str:
        return (await readiness.checks(index, engine))["database"]

    try:
        assert await database() == NOT_MIGRATED
        upgrade(settings, "0010")
        assert await database() == f"schema 0010 is behind {head}: run `bleedwatch migrate`"
        upgrade(settings)
        assert await database() == "ok"
        with psycopg.connect(bare_schema, autocommit=True) as conn:  # a rolling upgrade migrated first
            conn.execute("UPDATE alembic_version SET version_num = 'f00d'")
        assert await database() == "ok"  # the replicas still on this version stay in service
    finally:
        await engine.dispose()
