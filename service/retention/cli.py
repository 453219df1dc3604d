"""``bleedwatch prune`` and ``bleedwatch tenants purge``: straight on the database, like ``keys``."""

from __future__ import annotations

import argparse
import sys
import time

from bleedwatch.plural import counted
from service.audit.log import CLI
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.retention.jobs import Retention, prune, purge_tenant, purge_tenant_index
from service.retention.routes import NOT_PURGED, index_note


async def run_prune(_: argparse.Namespace) -> int:
    settings = Settings()
    engine = make_engine(settings)
    retention = Retention(
        settings.findings_retention_days, settings.incidents_retention_days, settings.audit_retention_days
    )
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            pruned = await prune(session, retention, actor=CLI)
    finally:
        await engine.dispose()
    if pruned is None:
        print("another replica is pruning right now; nothing done")
        return 1
    print(
        f"pruned {counted(pruned.findings, 'finding')} (older than {counted(retention.findings_days, 'day')}), "
        f"{counted(pruned.incidents, 'closed incident')} ({counted(retention.incidents_days, 'day')}), "
        f"{counted(pruned.audit_entries, 'audit entry', 'audit entries')} ({counted(retention.audit_days, 'day')}), "
        f"{counted(pruned.webhook_deliveries, 'finished webhook delivery', 'finished webhook deliveries')}"
    )
    return 0


async def run_purge(args: argparse.Namespace) -> int:
    """The index first (Redis: tombstone, documents, queued batches, held findings), then the database.
    The embedded index lives in the server's process: there ``POST /v1/tenants/purge`` does both, and
    this command purges the database only when told the server is stopped (``--database-only``)."""
    from service.index.factory import make_index

    settings = Settings()
    if settings.redis_url is None and not args.database_only:
        # Half a purge would leave a running server's index naming the tenant in new findings.
        print(
            "nothing purged: the embedded index lives in the server's process, out of this command's reach; "
            'purge through the server: POST /v1/tenants/purge {"tenant": ...} with an admin key, or, with the '
            "server stopped (its index went with it), add --database-only",
            file=sys.stderr,
        )
        return 2
    if settings.redis_url is not None and args.database_only:
        print("--database-only is for the embedded default: with Redis, the index is purged too", file=sys.stderr)
        return 2
    if settings.redis_url is not None:
        index = make_index(settings)
        try:
            done = await purge_tenant_index(index, args.tenant, time.time())
        finally:
            await index.close()
        print(
            f"index: {counted(done.documents, 'document')} deleted, "
            f"{counted(done.batches, 'queued batch', 'queued batches')} rewritten, "
            f"{counted(done.held_findings, 'held finding')} removed; a tombstone refuses the tenant's earlier exchanges"
        )
    engine = make_engine(settings)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            purged = await purge_tenant(session, args.tenant, CLI)
    finally:
        await engine.dispose()
    print(
        f"purged: {counted(purged.findings_deleted, 'finding')} deleted, {purged.findings_scrubbed:,} scrubbed, "
        f"{counted(purged.incidents_deleted, 'incident')} deleted, {purged.incidents_updated:,} updated"
    )
    if settings.redis_url is not None:
        print(f"index entries: {index_note(settings)}")
    print(f"not purged: {NOT_PURGED}")
    return 0
