"""The index and the rate limiter build their Redis clients through one factory, with one timeout policy."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from service.config import Settings
from service.index.factory import make_index
from service.index.redis_index import RedisIndex
from service.ratelimit import RedisLimiter, make_limiter
from service.redis_client import OPTIONS

pytestmark = pytest.mark.anyio


def _kwargs(client: Any) -> dict[str, Any]:
    assert isinstance(client, Redis)
    kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
    return kwargs


async def test_index_and_limiter_share_the_factory_options() -> None:
    settings = Settings(redis_url="redis://127.0.0.1:1/0")  # never connected: only the options are read
    index = make_index(settings)
    limiter = make_limiter(settings)
    assert isinstance(index, RedisIndex)
    assert isinstance(limiter, RedisLimiter)
    for client, name in ((index._r, "bleedwatch"), (limiter._client, "bleedwatch-ratelimit")):
        kwargs = _kwargs(client)
        assert kwargs["socket_timeout"] == OPTIONS.socket_timeout
        assert kwargs["socket_connect_timeout"] == OPTIONS.socket_connect_timeout
        assert kwargs["health_check_interval"] == OPTIONS.health_check_interval
        assert kwargs["client_name"] == name
    await limiter.close()
