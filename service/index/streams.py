"""What the ingest queue and the findings outbox share: a Redis Stream read by one consumer group."""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from service import metrics


class Group:
    """One stream's consumer group, made by each replica on first use (and again once it is lost)."""

    def __init__(self, client: Redis | RedisCluster, key: str, name: str) -> None:
        self._r = client
        self._key = key
        self._name = name
        self._ready = False

    async def ensure(self) -> None:
        """The group, and the stream with it; one that exists already is fine (every replica tries)."""
        if self._ready:
            return
        metrics.REDIS_ROUND_TRIPS.inc()
        try:
            await self._r.xgroup_create(self._key, self._name, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._ready = True

    def lost(self) -> None:
        """The stream was deleted (FLUSHDB, an operator): the next ``ensure`` makes it again."""
        self._ready = False


def entry_id(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def entries(reply: object, field: bytes) -> list[tuple[str, bytes]]:
    """XREADGROUP's answer, RESP2 (a list of [stream, entries]) or RESP3 (a map), as (id, the field's value)."""
    streams = reply.values() if isinstance(reply, dict) else [items for _, items in (reply or [])]  # type: ignore[attr-defined]
    return [(entry_id(entry[0]), entry[1][field]) for items in streams for entry in items if entry[1]]
