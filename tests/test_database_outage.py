"""With the database unreachable, what bleedwatch already read keeps working: keys and lists.

Ingest must go on through a database outage, so API keys verified before it, and the allowlist
and canaries read before it, stay in use (stale if error); what was never read fails loudly.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy.exc

from service.auth.keys import KeyVerifier, Role, create_key
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.local_server import free_port
from service.matching.known import KnownFingerprints
from service.migrate import upgrade

pytestmark = pytest.mark.anyio


async def test_known_keys_and_lists_survive_a_database_outage(tmp_path: Path) -> None:
    settings = Settings(database_url=None, data_dir=tmp_path)
    upgrade(settings)
    engine = make_engine(settings)
    good = make_sessionmaker(engine)
    async with session_scope(good) as session:
        _, token = await create_key(session, "gateway", Role.INGEST)
        _, other = await create_key(session, "never used", Role.INGEST)
    down = make_engine(Settings(database_url=f"postgresql://nobody@127.0.0.1:{free_port()}/none"))
    broken = make_sessionmaker(down)

    keys = KeyVerifier(good, cache_seconds=0)
    caller = await keys.verify(token)
    assert caller is not None
    keys._sessions = broken  # the database goes away
    assert await keys.verify(token) == caller
    assert await keys.verify(token.rsplit("_", 1)[0] + "_wrong") is None  # a known key, a wrong secret
    with pytest.raises(sqlalchemy.exc.OperationalError):
        await keys.verify(other)  # never verified before: cannot be checked now

    lists = KnownFingerprints(good, ttl_seconds=0)
    before = await lists.get("00112233445566aa")
    lists._sessions = broken
    assert await lists.get("00112233445566aa") is before
    with pytest.raises(sqlalchemy.exc.OperationalError):
        await lists.get("ffeeddccbbaa9988")
    await engine.dispose()
    await down.dispose()
