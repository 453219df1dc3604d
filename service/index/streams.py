"""What the ingest queue and the findings outbox share: a Redis Stream read by one consumer group."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from service import metrics

REWRITE_PAGE = 100


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


async def rewrite_stream(
    client: Redis | RedisCluster, key: str, field: bytes, keep: Callable[[bytes], bytes | None]
) -> int:
    """Pass every entry's ``field`` through ``keep`` (a tenant purge): None deletes the entry, other
    bytes replace it with a new entry (its other fields kept) in one transaction; how many changed.
    A page at a time, so a long stream never comes back in one reply; entries added meanwhile (the
    replacements among them) are seen too, and ``keep`` leaves them as they are."""
    changed, start = 0, "-"
    while True:
        metrics.REDIS_ROUND_TRIPS.inc()
        page: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(  # type: ignore[assignment]
            key, min=start, max="+", count=REWRITE_PAGE
        )
        if not page:
            return changed
        for raw_id, fields in page:
            value = fields.get(field) if fields else None
            new = None if value is None else keep(value)
            if value is None or new == value:
                continue
            async with client.pipeline(transaction=True) as pipe:  # one key: one slot on a cluster too
                if new is not None:
                    replacement: dict[Any, Any] = {**fields, field: new}
                    pipe.xadd(key, replacement)
                pipe.xdel(key, raw_id)
                metrics.REDIS_ROUND_TRIPS.inc()
                await pipe.execute()
            changed += 1
        start = f"({entry_id(page[-1][0])}"
