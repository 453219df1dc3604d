"""The index a configuration asks for: in memory (embedded) or on Redis.

Here, not in ``service/app.py``, so the worker, the queue CLI and the retention CLI build the
same index without importing the whole application.
"""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster

from service.config import Settings
from service.index.base import Index
from service.index.keys import Keys
from service.index.memory import MemoryIndex
from service.index.redis_index import RedisIndex
from service.index.window import Window


def make_index(settings: Settings) -> Index:
    window = Window(settings.retention_seconds, settings.index_generations)
    if settings.redis_url is None:
        return MemoryIndex(window, settings.common_prompt_tenants, settings.common_tenants)
    client: Redis | RedisCluster
    if settings.redis_cluster:
        client = RedisCluster.from_url(
            settings.redis_url, socket_timeout=5.0, socket_connect_timeout=2.0, client_name="bleedwatch"
        )
    else:
        client = Redis.from_url(
            settings.redis_url,
            socket_timeout=5.0,
            socket_connect_timeout=2.0,
            client_name="bleedwatch",
            health_check_interval=15,
        )
    return RedisIndex(
        client,
        Keys(settings.key_prefix),
        window,
        settings.common_prompt_tenants,
        settings.common_tenants,
        settings.index_bucket_bits,
        settings.ingest_queue_shards,
        settings.tenant_cache_size,
    )
