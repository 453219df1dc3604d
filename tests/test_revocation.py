"""Revocation and fallbacks: a revoked key is refused by every replica within a second (Redis
pub/sub) and stays refused while the database is down; the stale-if-error window of known keys
is capped; the rate limiter keeps limiting, in process, while Redis is down."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import sqlalchemy.exc

from service.auth.keys import KeyVerifier, Role, create_key
from service.auth.revocations import RedisRevocations
from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.local_server import free_port
from service.migrate import upgrade
from service.ratelimit import make_limiter
from tests.conftest import Api, running_api
from tests.redis_servers import RedisServer
from tests.tcp_proxy import tcp_proxy
from tests.test_findings_outbox import through

pytestmark = pytest.mark.anyio


async def _subscribed(api: Api) -> None:
    revocations = api.client._transport.app.state.deps.revocations  # type: ignore[attr-defined]
    assert isinstance(revocations, RedisRevocations)
    await asyncio.wait_for(revocations.subscribed.wait(), timeout=5)


async def _status(api: Api, token: str) -> int:
    return (await api.client.get("/v1/findings", headers={"Authorization": f"Bearer {token}"})).status_code


@pytest.mark.parametrize("settings", ["redis+postgres"], indirect=True)
async def test_a_revoked_key_is_refused_everywhere_within_a_second_and_during_an_outage(settings: Settings) -> None:
    assert settings.database_url is not None
    long_cache = settings.model_copy(update={"api_key_cache_seconds": 3600})  # only the message can do it
    target = urlsplit(settings.database_url)
    with tcp_proxy(target.hostname or "127.0.0.1", target.port or 5432) as proxy:
        via_proxy = long_cache.model_copy(update={"database_url": through(settings.database_url, proxy.port)})
        async with running_api(long_cache) as first, running_api(via_proxy) as second:
            await _subscribed(second)
            admin = first.headers(Role.ADMIN)
            created = await first.client.post("/v1/keys", json={"name": "oncall", "role": "read"}, headers=admin)
            token = created.json()["token"]
            staying = second.tokens[Role.READ]
            for api in (first, second):
                assert await _status(api, token) == 200
                assert await _status(api, staying) == 200

            assert (await first.client.delete(f"/v1/keys/{created.json()['id']}", headers=admin)).status_code == 200
            assert await _status(first, token) == 401
            deadline = time.monotonic() + 1.0
            while await _status(second, token) != 401:
                assert time.monotonic() < deadline, "the other replica still takes the revoked key after 1 s"
                await asyncio.sleep(0.02)

            proxy.cut()  # the second replica loses its database: the revoked key stays refused
            assert await _status(second, token) == 401
            assert await _status(second, staying) in (200, 503)  # past auth: the key is known and valid
            never_seen = second.tokens[Role.TRIAGE]
            assert await _status(second, never_seen) == 503  # cannot be checked: refused, not let through
            proxy.restore()


async def test_known_keys_outlive_a_database_outage_only_for_the_stale_window(tmp_path: Path) -> None:
    settings = Settings(database_url=None, data_dir=tmp_path)
    upgrade(settings)
    engine = make_engine(settings)
    good = make_sessionmaker(engine)
    async with session_scope(good) as session:
        _, token = await create_key(session, "gateway", Role.INGEST)
        key, revoked = await create_key(session, "revoked", Role.INGEST)
    down = make_engine(Settings(database_url=f"postgresql://nobody@127.0.0.1:{free_port()}/none"))

    capped = KeyVerifier(good, cache_seconds=0, stale_seconds=0)
    roomy = KeyVerifier(good, cache_seconds=0, stale_seconds=3600)
    for keys in (capped, roomy):
        assert await keys.verify(token) is not None
        assert await keys.verify(revoked) is not None
        keys.forget(key.id)  # revoked elsewhere: the message arrived
        keys._sessions = make_sessionmaker(down)  # the database goes away
        assert await keys.verify(revoked) is None
    assert await roomy.verify(token) is not None
    with pytest.raises(sqlalchemy.exc.OperationalError):
        await capped.verify(token)  # past its window: refused (503), never trusted for the whole outage
    await engine.dispose()
    await down.dispose()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    yield server
    server.kill()


async def test_the_rate_limiter_limits_in_process_while_redis_is_down(own_redis: RedisServer) -> None:
    limiter = make_limiter(Settings(redis_url=own_redis.url, rate_limit_per_second=0.01, rate_limit_burst=2))
    assert [await limiter.take("k") > 0 for _ in range(3)] == [False, False, True]
    own_redis.kill()
    assert [await limiter.take("k") > 0 for _ in range(3)] == [False, False, True]
    assert await limiter.take("other") == 0
    await limiter.close()
