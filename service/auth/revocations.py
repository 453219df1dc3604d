"""Revoked API keys reach every process within a second: a Redis pub/sub channel.

Each process caches verified keys for ``api_key_cache_seconds``; without a message, a key
revoked on one replica would keep working on the others until then. The revoking process
publishes the key id after the revocation is committed; every process (uvicorn workers and
replicas alike) subscribes and drops the key from its cache. Pub/sub keeps nothing: a process
whose subscription was down may have missed a message, so on every (re)subscription it marks
all its cached keys for re-checking. If a publish fails, the cache period bounds the delay.
With no Redis (the embedded default, one process) the revoking process's own ``forget`` is all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

import redis.exceptions
from redis.asyncio import Redis

from service import metrics
from service.auth.keys import KeyVerifier
from service.config import Settings
from service.index.keys import Keys

log = logging.getLogger(__name__)
RESUBSCRIBE_SECONDS = 1.0  # wait before subscribing again after Redis went away


class Revocations(Protocol):
    async def publish(self, key_id: str) -> None:
        """Tell every process that this key is revoked (the caller has forgotten it already)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class LocalRevocations:
    """One process, no Redis: the revoking process's own cache is the only one."""

    async def publish(self, key_id: str) -> None:
        return None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class RedisRevocations:
    def __init__(self, client: Redis, channel: str, keys: KeyVerifier) -> None:
        self._client = client
        self._channel = channel
        self._keys = keys
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()  # set while subscribed (tests wait on it)

    async def publish(self, key_id: str) -> None:
        try:
            await self._client.publish(self._channel, key_id)
        except (redis.exceptions.RedisError, OSError) as exc:
            metrics.BACKEND_ERRORS.labels("redis").inc()
            log.warning("revocation_not_published", extra={"exc_type": type(exc).__name__})

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="bleedwatch-revocations")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.aclose()

    async def _listen(self) -> None:
        while True:
            try:
                async with self._client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(self._channel)
                    self._keys.expire_all()  # messages sent while we were not subscribed are lost
                    self.subscribed.set()
                    while True:
                        # A timeout, not listen(): reading in turns lets the client PING a silent
                        # connection (health_check_interval), so a dead one raises and is replaced.
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        data = message.get("data") if message else None
                        if isinstance(data, bytes):
                            self._keys.forget(data.decode("ascii", "replace"))
            except (redis.exceptions.RedisError, OSError) as exc:
                self.subscribed.clear()
                metrics.BACKEND_ERRORS.labels("redis").inc()
                log.warning("revocations_unsubscribed", extra={"exc_type": type(exc).__name__})
                await asyncio.sleep(RESUBSCRIBE_SECONDS)


def make_revocations(settings: Settings, keys: KeyVerifier) -> Revocations:
    if settings.redis_url is None:
        return LocalRevocations()
    # A plain connection even to a Redis Cluster node: PUBLISH and SUBSCRIBE are cluster-wide there.
    # No socket timeout: a subscription waits for messages as long as it takes.
    client = Redis.from_url(
        settings.redis_url, socket_connect_timeout=2.0, client_name="bleedwatch-revocations", health_check_interval=15
    )
    return RedisRevocations(client, Keys(settings.key_prefix).revocations(), keys)
