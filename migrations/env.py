"""Alembic environment: the URL comes from bleedwatch's settings, never from alembic.ini."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from service.allowlist import models as _allowlist_models  # noqa: F401  (registers tables)
from service.audit import models as _audit_models  # noqa: F401
from service.auth import models as _auth_models  # noqa: F401
from service.canaries import models as _canary_models  # noqa: F401
from service.db import Base
from service.deployments import models as _deployment_models  # noqa: F401
from service.findings import models as _finding_models  # noqa: F401
from service.incidents import models as _incident_models  # noqa: F401
from service.signals import models as _signal_models  # noqa: F401
from service.ui import models as _ui_models  # noqa: F401
from service.webhooks import models as _webhook_models  # noqa: F401

config = context.config
url: str
if (configured := config.attributes.get("sqlalchemy_url")) is not None:
    url = configured
else:
    from service.config import Settings

    url = Settings().sqlalchemy_url(asynchronous=False)


def run() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _migrate(connectable)
        return
    engine = create_engine(url)
    with engine.connect() as connection:
        _migrate(connection)
    engine.dispose()


def _migrate(connection: Connection) -> None:
    is_pg = connection.dialect.name == "postgresql"
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=not is_pg,  # SQLite can only ALTER by copying the table
        compare_type=True,
    )
    with context.begin_transaction():
        if is_pg:
            context.execute("SET LOCAL lock_timeout = '5s'")
        context.run_migrations()


run()
