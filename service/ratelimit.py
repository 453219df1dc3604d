"""Per API key rate limiting: a token bucket of ``BLEEDWATCH_RATE_LIMIT_BURST`` tokens refilled at
``BLEEDWATCH_RATE_LIMIT_PER_SECOND``; every authenticated request takes one (an ingest batch is one).

With Redis the bucket lives there, one small Lua script per request, so every replica draws on
the same bucket; it uses Redis' clock, so replicas' clocks do not matter. The embedded default
keeps buckets in process. If Redis cannot be reached the limiter falls back to in-process
buckets (and counts a Redis error): refusing every read because the limiter is down would hide
an incident, and letting everything through would hand the outage to whoever floods first.
Each process then limits on its own, so the replicas together allow a multiple of the rate.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

import redis.exceptions
from redis.asyncio import Redis, RedisCluster

from service import metrics
from service.config import Settings
from service.index.keys import Keys
from service.redis_client import make_redis

log = logging.getLogger(__name__)
MAX_BUCKETS = 100_000  # in-process: forget every bucket past this many keys (they refill anyway)

# KEYS[1] bucket; ARGV rate (tokens/s), burst. Returns 0 when a token was taken, else ms to wait.
TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return wait
"""


class RateLimiter(Protocol):
    async def take(self, key_id: str) -> float:
        """Take a token for this API key: 0 if it was there, else seconds until one will be."""
        ...

    async def close(self) -> None: ...


class Unlimited:
    async def take(self, key_id: str) -> float:
        return 0.0

    async def close(self) -> None:
        return None


class MemoryLimiter:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}

    async def take(self, key_id: str) -> float:
        now = time.monotonic()
        tokens, at = self._buckets.get(key_id, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
        if len(self._buckets) >= MAX_BUCKETS and key_id not in self._buckets:
            self._buckets.clear()
        self._buckets[key_id] = (tokens, now)
        return wait

    async def close(self) -> None:
        return None


class RedisLimiter:
    def __init__(
        self,
        client: Redis | RedisCluster,
        keys: Keys,
        rate: float,
        burst: int,
        bucket: Callable[[Keys, str], str] = Keys.rate_limit,
    ) -> None:
        self._client = client
        self._keys = keys
        self._bucket = bucket
        self.rate = rate
        self.burst = burst
        self._take = client.register_script(TAKE)
        self._fallback = MemoryLimiter(rate, burst)  # while Redis is unreachable

    async def take(self, key_id: str) -> float:
        try:
            wait_ms = await self._take(keys=[self._bucket(self._keys, key_id)], args=[self.rate, self.burst])
        except (redis.exceptions.RedisError, OSError) as exc:
            metrics.BACKEND_ERRORS.labels("redis").inc()
            log.warning("rate_limit_fallback", extra={"exc_type": type(exc).__name__})
            return await self._fallback.take(key_id)
        metrics.REDIS_ROUND_TRIPS.inc()
        return int(wait_ms) / 1000

    async def close(self) -> None:
        await self._client.aclose()


def make_limiter(
    settings: Settings,
    rate: float | None = None,
    burst: int | None = None,
    bucket: Callable[[Keys, str], str] = Keys.rate_limit,
    name: str = "bleedwatch-ratelimit",
) -> RateLimiter:
    """The per API key limiter by default; other buckets (failed authentication) pass their own."""
    rate = settings.rate_limit_per_second if rate is None else rate
    burst = settings.rate_limit_burst if burst is None else burst
    if rate <= 0:
        return Unlimited()
    if settings.redis_url is None:
        return MemoryLimiter(rate, burst)
    client = make_redis(settings, name)
    return RedisLimiter(client, Keys(settings.key_prefix), rate, burst, bucket)


def retry_after(wait_seconds: float) -> str:
    return str(max(1, math.ceil(wait_seconds)))
