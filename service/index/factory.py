"""The index a configuration asks for: in memory (embedded) or on Redis.

Here, not in ``service/app.py``, so the worker, the queue CLI and the retention CLI build the
same index without importing the whole application.
"""

from __future__ import annotations

from service.config import Settings
from service.index.base import Index
from service.index.keys import Keys
from service.index.memory import MemoryIndex
from service.index.redis_index import RedisIndex
from service.index.window import Window
from service.redis_client import make_redis


def make_index(settings: Settings) -> Index:
    window = Window(settings.retention_seconds, settings.index_generations)
    if settings.redis_url is None:
        return MemoryIndex(window, settings.common_prompt_tenants, settings.common_tenants)
    client = make_redis(settings, "bleedwatch")
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
