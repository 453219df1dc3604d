"""What the ingest queue and the findings outbox share: a Redis Stream read by one consumer group."""

from __future__ import annotations

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from service import metrics


async def create_group(client: Redis | RedisCluster, key: str, group: str) -> None:
    """The group, and the stream with it; one that exists already is fine (every replica tries)."""
    metrics.REDIS_ROUND_TRIPS.inc()
    try:
        await client.xgroup_create(key, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def entry_id(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def entries(reply: object, field: bytes) -> list[tuple[str, bytes]]:
    """XREADGROUP's answer, RESP2 (a list of [stream, entries]) or RESP3 (a map), as (id, the field's value)."""
    streams = reply.values() if isinstance(reply, dict) else [items for _, items in (reply or [])]  # type: ignore[attr-defined]
    return [(entry_id(entry[0]), entry[1][field]) for items in streams for entry in items if entry[1]]
