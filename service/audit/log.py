"""Writing to the audit log: ``await audit.record(session, caller, action, target, ...)``.

Called inside the route's own session scope, so the entry commits with the read or change it
records, or not at all. Tenants are written as ``tenant_hash(name)`` only (also in ``detail``):
an admin finds "who read tenant X's findings" with ``GET /v1/audit?tenant=X``, and purging a
tenant leaves no name behind here.

The digest is an HMAC under a server secret (``BLEEDWATCH_AUDIT_SECRET``), not a plain hash:
tenant names are few and guessable, so anyone with a copy of the audit table could otherwise
hash a list of customer names and read who was looked at. Unset, the secret is a random one
kept in ``BLEEDWATCH_DATA_DIR/audit.key`` (0600), which suits one host; replicas on several
hosts must share the setting, or their digests of one tenant differ.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from service.audit.models import AuditEntry
from service.auth.keys import Caller
from service.config import Settings
from service.db import utcnow
from service.logging import current_request_id

SYSTEM = "bleedwatch"  # the service itself (retention job)
CLI = "cli"  # ``bleedwatch`` commands run on the database directly
KEY_FILE = "audit.key"
log = logging.getLogger(__name__)
_secret: bytes | None = None  # set by configure(); a CLI command that never called it reads Settings()


def configure(settings: Settings) -> None:
    """The HMAC key of tenant digests, from the setting or the data directory (once per process start)."""
    global _secret
    if settings.audit_secret is not None:
        _secret = settings.audit_secret.get_secret_value().encode()
        return
    if settings.database_url is not None:
        log.warning("audit_secret_from_data_dir")  # fine on one host; replicas need BLEEDWATCH_AUDIT_SECRET
    _secret = _file_secret(settings.make_data_dir() / KEY_FILE)


def _file_secret(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes().strip()
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path.read_bytes().strip()


def tenant_hash(tenant: str) -> str:
    """A stable stand-in for a tenant name in audit entries, which only the server can compute."""
    if _secret is None:
        configure(Settings())
    assert _secret is not None
    return "t:" + hmac.new(_secret, tenant.encode(), hashlib.sha256).hexdigest()[:24]


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


def about(tenants: Iterable[str]) -> dict[str, Any]:
    """The tenants whose data a read showed, as digests: what ``GET /v1/audit?tenant=X`` finds."""
    return {"tenants": sorted({tenant_hash(t) for t in tenants})}


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
