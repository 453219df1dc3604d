"""The one way a long-lived Redis client is built (index, rate limiters): one timeout policy.

Read timeout 5 s: an index pipeline or Lua script on a busy Redis may take a few seconds, and a
limiter that gives up sooner would only fall back to in-process buckets while the index call
beside it still waits. Connect timeout 2 s: an unreachable Redis is known quickly. A health
check every 15 s re-validates idle connections before use (single node; a cluster client checks
its nodes itself). The revocation subscriber keeps its own client: it must wait without a timeout.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis, RedisCluster

from service.config import Settings


@dataclass(frozen=True, slots=True)
class RedisOptions:
    socket_timeout: float = 5.0
    socket_connect_timeout: float = 2.0
    health_check_interval: int = 15


OPTIONS = RedisOptions()


def make_redis(settings: Settings, name: str, options: RedisOptions = OPTIONS) -> Redis | RedisCluster:
    """A client for ``settings.redis_url`` (a cluster when ``redis_cluster``), named ``name`` in CLIENT LIST."""
    if settings.redis_url is None:
        raise ValueError("make_redis needs BLEEDWATCH_REDIS_URL")
    if settings.redis_cluster:
        return RedisCluster.from_url(
            settings.redis_url,
            socket_timeout=options.socket_timeout,
            socket_connect_timeout=options.socket_connect_timeout,
            client_name=name,
        )
    return Redis.from_url(
        settings.redis_url,
        socket_timeout=options.socket_timeout,
        socket_connect_timeout=options.socket_connect_timeout,
        client_name=name,
        health_check_interval=options.health_check_interval,
    )
