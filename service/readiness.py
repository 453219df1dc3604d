"""``/readyz`` of ``serve`` and ``work``: the index and the database answer, and the database
holds the schema this version writes.

A replica whose database was never migrated (an explicit ``BLEEDWATCH_DATABASE_URL`` is not
migrated by ``serve``), or is behind this version, would answer 500 on its first write; not
ready, the load balancer keeps traffic on the replicas that work. A schema *newer* than this
version knows is ready: in a rolling upgrade the migration runs first, and the old replicas
still serving must not all drop out at once.
"""

from __future__ import annotations

import functools

import redis.exceptions
import sqlalchemy.exc
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.index.base import Index
from service.migrate import migrations_dir

MIGRATE_HINT = "run `bleedwatch migrate`"


@functools.cache
def _revisions() -> tuple[str, frozenset[str]]:
    """This version's head revision, and every revision it knows."""
    scripts = ScriptDirectory(str(migrations_dir()))
    head = scripts.get_current_head()
    if head is None:
        raise RuntimeError(f"no migrations under {migrations_dir()}")
    return head, frozenset(r.revision for r in scripts.walk_revisions())


def schema_state(version: str | None) -> str:
    """``ok``, or what is wrong with a database at ``version`` (None: never migrated)."""
    head, known = _revisions()
    if version is None:
        return f"not migrated: {MIGRATE_HINT}"
    if version in known and version != head:
        return f"schema {version} is behind {head}: {MIGRATE_HINT}"
    return "ok"


async def checks(index: Index, engine: AsyncEngine) -> dict[str, str]:
    """Per part, ``ok`` or why it is not."""
    out: dict[str, str] = {}
    try:
        await index.ping()
        out["index"] = "ok"
    except (redis.exceptions.RedisError, OSError):
        out["index"] = "unreachable"
    try:
        async with engine.connect() as conn:
            version = await _version(conn)
        out["database"] = schema_state(version)
    except (sqlalchemy.exc.SQLAlchemyError, OSError):
        out["database"] = "unreachable"
    return out


async def _version(conn: AsyncConnection) -> str | None:
    """As ``bleedwatch migrate`` reads it (``migrate.revision``): Alembic's own version table lookup."""
    return await conn.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())
