"""The two ``Outbox`` backends (service/index/base.py): a Redis Stream, and a list in process.

Findings on hold (``BLEEDWATCH_FINDINGS_HOLD_SECONDS``) wait beside the stream, in a sorted set
scored by when they are due, and move into it once due; from there they are written as any other.
"""

from __future__ import annotations

import heapq
import itertools
import time

from redis.asyncio import Redis, RedisCluster

from service import metrics
from service.index.base import Rewrite
from service.index.keys import Keys
from service.index.streams import Group, entries, entry_id, rewrite_stream

GROUP = "writers"

# Dead letters back into the outbox, oldest first, atomically (both keys share a hash tag).
_REQUEUE = """
local moved = 0
for _, entry in ipairs(redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', ARGV[1])) do
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'd' then redis.call('XADD', KEYS[1], '*', 'd', fields[i + 1]) end
  end
  redis.call('XDEL', KEYS[2], entry[1])
  moved = moved + 1
end
return moved
"""


# Findings on hold that are due, into the outbox, at most ARGV[2] of them, atomically (one hash tag).
_DUE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
for _, item in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', 'd', item)
  redis.call('ZREM', KEYS[1], item)
end
return #due
"""

# A finding on hold replaced by another version of it (a purge), unless it has just moved into the
# outbox; whether it was still on hold.
_REPLACE_LATER = """
local held = redis.call('ZREM', KEYS[1], ARGV[1])
if held == 1 and ARGV[2] ~= '' then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
end
return held
"""


class RedisOutbox:
    """``p:{p:outbox}:findings``: one stream entry per finding, one consumer group for all replicas;
    ``p:{p:outbox}:later``: findings on hold."""

    def __init__(self, client: Redis | RedisCluster, keys: Keys) -> None:
        self._r = client
        self._key = keys.outbox
        self._dead = keys.outbox_dead
        self._later = keys.outbox_later
        self._group = Group(client, self._key, GROUP)

    async def hold_until(self, items: list[bytes], due: float) -> None:
        if items:
            metrics.REDIS_ROUND_TRIPS.inc()
            # NX: a draft already on hold keeps its due time, so drafting it again never postpones it.
            await self._r.zadd(self._later, dict.fromkeys(items, due), nx=True)

    async def move_due(self, now: float, count: int) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        return int(await self._r.eval(_DUE, 2, self._later, self._key, now, count))

    async def later_size(self) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        return int(await self._r.zcard(self._later))

    async def hold(self, items: list[bytes]) -> None:
        if not items:
            return
        async with self._r.pipeline(transaction=False) as pipe:
            for item in items:
                pipe.xadd(self._key, {"d": item})
            metrics.REDIS_ROUND_TRIPS.inc()
            await pipe.execute()

    async def claim(self, consumer: str, count: int, min_idle_seconds: float) -> list[tuple[str, bytes]]:
        await self._group.ensure()
        metrics.REDIS_ROUND_TRIPS.inc()
        mine = await self._r.xreadgroup(GROUP, consumer, {self._key: "0"}, count=count)
        items = entries(mine, b"d")
        if items:
            return items
        metrics.REDIS_ROUND_TRIPS.inc()
        _, abandoned, *_ = await self._r.xautoclaim(
            self._key, GROUP, consumer, int(min_idle_seconds * 1000), start_id="0-0", count=count
        )
        items = [(entry_id(i), f[b"d"]) for i, f in abandoned if f]
        if items:
            return items
        metrics.REDIS_ROUND_TRIPS.inc()
        return entries(await self._r.xreadgroup(GROUP, consumer, {self._key: ">"}, count=count), b"d")

    async def release(self, ids: list[str]) -> None:
        if not ids:
            return
        async with self._r.pipeline(transaction=False) as pipe:
            pipe.xack(self._key, GROUP, *ids)
            pipe.xdel(self._key, *ids)
            metrics.REDIS_ROUND_TRIPS.inc()
            await pipe.execute()

    async def bury(self, item_id: str, item: bytes, reason: str) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.xadd(self._dead, {"d": item, "id": item_id, "reason": reason})
            pipe.xack(self._key, GROUP, item_id)
            pipe.xdel(self._key, item_id)
            metrics.REDIS_ROUND_TRIPS.inc()
            await pipe.execute()

    async def size(self) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        return int(await self._r.xlen(self._key))

    async def dead_size(self) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        return int(await self._r.xlen(self._dead))

    async def requeue_dead(self, count: int) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        return int(await self._r.eval(_REQUEUE, 2, self._key, self._dead, count))

    async def expire_dead(self, before: float) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()  # a dead letter's stream id is the (Redis) time it was buried
        return int(await self._r.xtrim(self._dead, minid=f"{max(0, int(before * 1000))}-0", approximate=False))

    async def rewrite(self, keep: Rewrite) -> int:
        """Findings on hold first: one that becomes due meanwhile is then in the stream, rewritten next."""
        changed = 0
        metrics.REDIS_ROUND_TRIPS.inc()
        later: list[tuple[bytes, float]] = await self._r.zrange(self._later, 0, -1, withscores=True)  # type: ignore[assignment]
        for item, due in later:
            new = keep(item)
            if new != item:
                metrics.REDIS_ROUND_TRIPS.inc()
                replaced = await self._r.eval(_REPLACE_LATER, 1, self._later, item, b"" if new is None else new, due)
                changed += int(replaced)
        changed += await rewrite_stream(self._r, self._key, b"d", keep)
        return changed + await rewrite_stream(self._r, self._dead, b"d", keep)


class MemoryOutbox:
    """For the embedded default: one process, so claiming is bookkeeping only."""

    def __init__(self) -> None:
        self._later: list[tuple[float, int, bytes]] = []  # a heap of (due, order, item)
        self._items: dict[str, bytes] = {}
        self._claimed: dict[str, tuple[str, float]] = {}
        self._ids = itertools.count(1)
        self.dead: list[tuple[str, bytes, str]] = []  # id, item, reason
        self._buried_at: dict[str, float] = {}  # dead letter id -> when it was buried (epoch seconds)

    async def hold(self, items: list[bytes]) -> None:
        for item in items:
            self._items[f"{next(self._ids)}-0"] = item

    async def hold_until(self, items: list[bytes], due: float) -> None:
        """As the sorted set does: an item already on hold keeps its due time."""
        held = {item for _, _, item in self._later}
        for item in dict.fromkeys(items):
            if item not in held:
                heapq.heappush(self._later, (due, next(self._ids), item))

    async def move_due(self, now: float, count: int) -> int:
        due: list[bytes] = []
        while self._later and self._later[0][0] <= now and len(due) < count:
            due.append(heapq.heappop(self._later)[2])
        await self.hold(due)
        return len(due)

    async def later_size(self) -> int:
        return len(self._later)

    async def claim(self, consumer: str, count: int, min_idle_seconds: float) -> list[tuple[str, bytes]]:
        """As the stream does: this consumer's own claimed items, else abandoned ones, else new ones."""
        now = time.monotonic()
        mine = [i for i, (owner, _) in self._claimed.items() if owner == consumer]
        abandoned = [
            i for i, (owner, at) in self._claimed.items() if owner != consumer and now - at >= min_idle_seconds
        ]
        fresh = [i for i in self._items if i not in self._claimed]
        chosen = (mine or abandoned or fresh)[:count]
        for item_id in chosen:
            self._claimed[item_id] = (consumer, now)
        return [(item_id, self._items[item_id]) for item_id in chosen]

    async def release(self, ids: list[str]) -> None:
        for item_id in ids:
            self._items.pop(item_id, None)
            self._claimed.pop(item_id, None)

    async def bury(self, item_id: str, item: bytes, reason: str) -> None:
        self._items.pop(item_id, None)
        self._claimed.pop(item_id, None)
        self.dead.append((item_id, item, reason))
        self._buried_at[item_id] = time.time()

    async def size(self) -> int:
        return len(self._items)

    async def dead_size(self) -> int:
        return len(self.dead)

    async def expire_dead(self, before: float) -> int:
        kept = [d for d in self.dead if self._buried_at.get(d[0], before) >= before]
        expired = len(self.dead) - len(kept)
        self.dead = kept
        self._buried_at = {d[0]: self._buried_at[d[0]] for d in kept if d[0] in self._buried_at}
        return expired

    async def requeue_dead(self, count: int) -> int:
        moved, self.dead = self.dead[:count], self.dead[count:]
        await self.hold([item for _, item, _ in moved])
        return len(moved)

    async def rewrite(self, keep: Rewrite) -> int:
        changed = 0
        later = []
        for due, order, item in self._later:
            new = keep(item)
            changed += new != item
            if new is not None:
                later.append((due, order, new))
        heapq.heapify(later)
        self._later = later
        dead = []
        for item_id, item, reason in self.dead:
            new = keep(item)
            changed += new != item
            if new is not None:
                dead.append((item_id, new, reason))
        self.dead = dead
        for item_id, item in list(self._items.items()):
            new = keep(item)
            if new != item:
                changed += 1
                if new is None:
                    self._items.pop(item_id)
                    self._claimed.pop(item_id, None)
                else:
                    self._items[item_id] = new
        return changed
