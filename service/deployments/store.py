"""Deployments in the database. Functions flush; the caller's session scope commits."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from service.db import utcnow
from service.deployments.models import Deployment
from service.deployments.schemas import DeploymentConfig, Safeguards

CONFIG_COLUMNS = (
    "model",
    "engine",
    "engine_version",
    "disaggregated",
    "context_length",
    "prefill_kv_pool_tokens",
    "decode_kv_pool_tokens",
)


async def put(
    session: AsyncSession, deployment_id: str, config: DeploymentConfig, key_id: str
) -> tuple[Deployment, bool]:
    """Create or replace the config; returns the row and whether it was created.

    One upsert statement, so two replicas reporting the same new deployment never collide.
    """
    now = utcnow()
    values = {c: getattr(config, c) for c in CONFIG_COLUMNS} | config.safeguards.model_dump()
    values |= {"updated_at": now, "updated_by": key_id}
    insert = postgresql.insert if session.get_bind().dialect.name == "postgresql" else sqlite.insert
    stmt = insert(Deployment).values(id=deployment_id, created_at=now, **values)
    stmt = stmt.on_conflict_do_update(index_elements=["id"], set_={k: stmt.excluded[k] for k in values})
    await session.execute(stmt)
    row = (
        await session.scalars(
            select(Deployment).where(Deployment.id == deployment_id).execution_options(populate_existing=True)
        )
    ).one()
    return row, row.created_at == now


def config_of(row: Deployment) -> DeploymentConfig:
    return DeploymentConfig(
        **{c: getattr(row, c) for c in CONFIG_COLUMNS},
        safeguards=Safeguards(**{f: getattr(row, f) for f in Safeguards.model_fields}),
    )


async def get(session: AsyncSession, deployment_id: str) -> Deployment | None:
    return await session.get(Deployment, deployment_id)


async def after(session: AsyncSession, cursor: str | None) -> list[Deployment]:
    """Every deployment after the cursor, by id: deployments are few (one a serving config)."""
    q = select(Deployment).order_by(Deployment.id)
    if cursor is not None:
        q = q.where(Deployment.id > cursor)  # the last id of the page before
    return list((await session.scalars(q)).all())
