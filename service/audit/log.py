"""Writing to the audit log: ``await audit.record(session, caller, action, target, ...)``.

Called inside the route's own session scope, so the entry commits with the read or change it
records, or not at all. Tenants are written as ``tenant_hash(name)`` only (also in ``detail``):
an admin finds "who read tenant X's findings" with ``GET /v1/audit?tenant=X``, and purging a
tenant leaves no name behind here.
"""

from __future__ import annotations

import hashlib
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.audit.models import AuditEntry
from service.auth.keys import Caller
from service.db import utcnow
from service.logging import current_request_id

SYSTEM = "bleedwatch"  # the service itself (retention job)
CLI = "cli"  # ``bleedwatch`` commands run on the database directly


def tenant_hash(tenant: str) -> str:
    """A stable, non-reversible-at-a-glance stand-in for a tenant name in audit entries."""
    return "t:" + hashlib.sha256(tenant.encode()).hexdigest()[:24]


def filters(**values: object) -> dict[str, Any]:
    """Query filters as recorded: tenants hashed, datetimes as ISO strings, unset ones left out."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        if "tenant" in name and isinstance(value, str):
            out[name] = tenant_hash(value)
        elif hasattr(value, "isoformat"):
            out[name] = value.isoformat()
        else:
            out[name] = value if isinstance(value, int | float | bool) else str(value)
    return out


async def record(
    session: AsyncSession,
    caller: Caller | str,
    action: str,
    target: str,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append one entry; flushes with the caller's session (which commits it with the rest)."""
    key_id = caller if isinstance(caller, str) else caller.key_id
    session.add(
        AuditEntry(
            at=utcnow(),
            key_id=key_id,
            action=action,
            target=target[:128],
            request_id=current_request_id(),
            detail=detail or {},
        )
    )
    await session.flush()
