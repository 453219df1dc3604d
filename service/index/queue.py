"""The two ``Queue`` backends (service/index/base.py): a Redis Stream, and a list in process.

One consumer group for every replica: ``XREADGROUP >`` hands each batch to one replica, which
``finish``-es it (XACK + XDEL, and the result for a caller waiting on it, in one transaction:
the keys share a hash tag, so this holds on Redis Cluster too). A replica that dies leaves its
batches in the group's pending list, where ``reclaim`` finds them once idle long enough; a live
replica ``hold``-s the batch it is at, so however slow, it does not look idle.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from service import metrics
from service.index.base import Rewrite
from service.index.keys import Keys
from service.index.streams import REWRITE_PAGE, Group, entries, entry_id, rewrite_stream

GROUP = "ingest"
RESULT_SECONDS = 300

# Bounded in batches and in bytes: a full queue refuses (the caller retries later) rather than
# growing Redis without limit; a few large batches fill it as surely as many small ones.
# KEYS stream, sizes, bytes; ARGV max items, item, max bytes (0: none).
_PUT = """
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return false end
local n = string.len(ARGV[2])
local queued = tonumber(redis.call('GET', KEYS[3]) or '0')
if tonumber(ARGV[3]) > 0 and queued > 0 and queued + n > tonumber(ARGV[3]) then return false end
local id = redis.call('XADD', KEYS[1], '*', 'b', ARGV[2])
redis.call('HSET', KEYS[2], id, n)
redis.call('INCRBY', KEYS[3], n)
return id
"""

# An item leaves the stream (finished, buried, purged): its bytes are subtracted once, however often.
# KEYS stream, sizes, bytes; ARGV id.
_DROP = """
local n = redis.call('HGET', KEYS[2], ARGV[1])
if n then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('DECRBY', KEYS[3], n)
end
return redis.call('XDEL', KEYS[1], ARGV[1])
"""

# Dead letters back into the queue, oldest first, atomically (every key shares a hash tag).
# KEYS stream, dead letters, sizes, bytes; ARGV count.
_REQUEUE = """
local moved = 0
for _, entry in ipairs(redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', ARGV[1])) do
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == 'b' then
      local id = redis.call('XADD', KEYS[1], '*', 'b', fields[i + 1])
      redis.call('HSET', KEYS[3], id, string.len(fields[i + 1]))
      redis.call('INCRBY', KEYS[4], string.len(fields[i + 1]))
    end
  end
  redis.call('XDEL', KEYS[2], entry[1])
  moved = moved + 1
end
return moved
"""

# A purge's replacement of one item: KEYS stream, sizes, bytes; ARGV old id, new item ('' with ARGV[3] 0: none).
_REPLACE = """
local n = redis.call('HGET', KEYS[2], ARGV[1])
if n then
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('DECRBY', KEYS[3], n)
end
redis.call('XDEL', KEYS[1], ARGV[1])
if ARGV[3] == '1' then
  local id = redis.call('XADD', KEYS[1], '*', 'b', ARGV[2])
  redis.call('HSET', KEYS[2], id, string.len(ARGV[2]))
  redis.call('INCRBY', KEYS[3], string.len(ARGV[2]))
end
return 1
"""


# Only while the consumer still owns the entry: after a reclaim it is another's, and stays so.
# JUSTID leaves the delivery count alone, which counts failures towards the dead letters.
_HOLD = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #pending == 0 or pending[1][2] ~= ARGV[2] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
return 1
"""


class RedisQueue:
    durable = True

    def __init__(self, client: Redis | RedisCluster, keys: Keys, shard: int = 0) -> None:
        self._r = client
        self._keys = keys
        self._shard = shard
        self._key = keys.queue_shard(shard)
        self._dead = keys.dead_letters_shard(shard)
        self._sizes = keys.queue_sizes(shard)
        self._bytes = keys.queue_bytes(shard)
        self._group = Group(client, self._key, GROUP)

    async def put(self, item: bytes, max_items: int, max_bytes: int = 0) -> str | None:
        metrics.REDIS_ROUND_TRIPS.inc()
        item_id = await self._r.eval(_PUT, 3, self._key, self._sizes, self._bytes, max_items, item, max_bytes)
        return None if item_id is None else entry_id(item_id)

    async def byte_size(self) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        return max(0, int(await self._r.get(self._bytes) or 0))

    async def take(self, consumer: str, block_seconds: float, lane: int = 0) -> tuple[str, bytes] | None:
        """``block_seconds`` 0: answer at once."""
        await self._group.ensure()
        metrics.REDIS_ROUND_TRIPS.inc()
        try:
            reply = await self._r.xreadgroup(
                GROUP,
                consumer,
                {self._key: ">"},
                count=1,
                block=max(1, int(block_seconds * 1000)) if block_seconds > 0 else None,
            )
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._group.lost()
            return None
        taken = entries(reply, b"b")
        return taken[0] if taken else None

    async def reclaim(self, consumer: str, min_idle_seconds: float, count: int) -> list[tuple[str, bytes, int]]:
        await self._group.ensure()
        idle_ms = int(min_idle_seconds * 1000)
        metrics.REDIS_ROUND_TRIPS.inc()
        pending: list[dict[str, Any]] = await self._r.xpending_range(
            self._key, GROUP, min="-", max="+", count=count, idle=idle_ms
        )
        if not pending:
            return []
        deliveries = {entry_id(p["message_id"]): int(p["times_delivered"]) for p in pending}
        metrics.REDIS_ROUND_TRIPS.inc()
        claimed: Any = await self._r.xclaim(self._key, GROUP, consumer, idle_ms, list(deliveries))
        out, gone = [], []
        for raw_id, fields in claimed:
            item_id = entry_id(raw_id)
            if fields:
                out.append((item_id, fields[b"b"], deliveries[item_id] + 1))
            else:
                gone.append(item_id)  # finished by its first owner after all, between the two calls
        if gone:
            metrics.REDIS_ROUND_TRIPS.inc()
            await self._r.xack(self._key, GROUP, *gone)
        return out

    async def hold(self, consumer: str, item_id: str) -> bool:
        metrics.REDIS_ROUND_TRIPS.inc()
        return bool(await self._r.eval(_HOLD, 1, self._key, GROUP, consumer, item_id))

    async def finish(self, item_id: str, result: bytes) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.xack(self._key, GROUP, item_id)
            pipe.eval(_DROP, 3, self._key, self._sizes, self._bytes, item_id)
            pipe.set(self._keys.queue_result(item_id, self._shard), result, ex=RESULT_SECONDS)
            metrics.REDIS_ROUND_TRIPS.inc()
            await pipe.execute()

    async def bury(self, item_id: str, item: bytes, reason: str) -> None:
        async with self._r.pipeline(transaction=True) as pipe:
            pipe.xadd(self._dead, {"b": item, "id": item_id, "reason": reason})  # expired by expire_dead
            pipe.xack(self._key, GROUP, item_id)
            pipe.eval(_DROP, 3, self._key, self._sizes, self._bytes, item_id)
            metrics.REDIS_ROUND_TRIPS.inc()
            await pipe.execute()

    async def result(self, item_id: str) -> bytes | None:
        metrics.REDIS_ROUND_TRIPS.inc()
        value: Any = await self._r.get(self._keys.queue_result(item_id, self._shard))
        return None if value is None else bytes(value)

    async def size(self) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        return int(await self._r.xlen(self._key))

    async def dead_size(self) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        return int(await self._r.xlen(self._dead))

    async def requeue_dead(self, count: int) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        return int(await self._r.eval(_REQUEUE, 4, self._key, self._dead, self._sizes, self._bytes, count))

    async def expire_dead(self, before: float) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()  # a dead letter's stream id is the (Redis) time it was buried
        return int(await self._r.xtrim(self._dead, minid=f"{max(0, int(before * 1000))}-0", approximate=False))

    async def rewrite(self, keep: Rewrite) -> int:
        """As ``rewrite_stream`` does, each changed item in one script that keeps the byte count true."""
        changed, start = 0, "-"
        while True:
            metrics.REDIS_ROUND_TRIPS.inc()
            page: list[tuple[bytes, dict[bytes, bytes]]] = await self._r.xrange(  # type: ignore[assignment]
                self._key, min=start, max="+", count=REWRITE_PAGE
            )
            if not page:
                break
            for raw_id, fields in page:
                value = fields.get(b"b") if fields else None
                new = None if value is None else keep(value)
                if value is None or new == value:
                    continue
                metrics.REDIS_ROUND_TRIPS.inc()
                keys = (self._key, self._sizes, self._bytes)
                await self._r.eval(_REPLACE, 3, *keys, entry_id(raw_id), new or b"", int(new is not None))
                changed += 1
            start = f"({entry_id(page[-1][0])}"
        return changed + await rewrite_stream(self._r, self._dead, b"b", keep)


class ShardedQueue:
    """``BLEEDWATCH_INGEST_QUEUE_SHARDS`` streams as one queue: on a Redis Cluster one stream is one
    node's work (every put, take, hold and finish of every replica), the shards spread it.

    A batch goes to the shards in turn (one that is full passes it on; the bound is split evenly).
    Each of a process's worker tasks has a home shard, its ``lane``: it takes from there first,
    then from the others, and waits on its home when all are empty, so with at least as many
    worker tasks in all as shards every shard has a reader waiting. Item ids carry their shard
    (``<stream id>@<shard>``), so hold, finish, result and bury reach its stream; reclaim and dead
    letters work per shard, sizes are sums. Shard 0 is the single queue's stream: going from one
    shard to several loses nothing queued (going back strands the other shards' batches).
    """

    durable = True

    def __init__(self, shards: list[RedisQueue]) -> None:
        self._shards = shards
        self._next = itertools.count()

    def _of(self, item_id: str) -> tuple[RedisQueue, str]:
        stream_id, _, shard = item_id.partition("@")
        return self._shards[int(shard or 0)], stream_id

    def _named(self, shard: int, stream_id: str) -> str:
        return f"{stream_id}@{shard}" if shard else stream_id

    async def put(self, item: bytes, max_items: int, max_bytes: int = 0) -> str | None:
        n = len(self._shards)
        each = -(-max_items // n)
        each_bytes = -(-max_bytes // n)
        start = next(self._next)
        for k in range(n):
            shard = (start + k) % n
            item_id = await self._shards[shard].put(item, each, each_bytes)
            if item_id is not None:
                return self._named(shard, item_id)
        return None

    async def take(self, consumer: str, block_seconds: float, lane: int = 0) -> tuple[str, bytes] | None:
        n = len(self._shards)
        home = lane % n
        for k in range(n):
            shard = (home + k) % n
            taken = await self._shards[shard].take(consumer, 0)
            if taken is not None:
                return self._named(shard, taken[0]), taken[1]
        taken = await self._shards[home].take(consumer, block_seconds)
        return None if taken is None else (self._named(home, taken[0]), taken[1])

    async def reclaim(self, consumer: str, min_idle_seconds: float, count: int) -> list[tuple[str, bytes, int]]:
        out = []
        for shard, queue in enumerate(self._shards):
            for item_id, item, deliveries in await queue.reclaim(consumer, min_idle_seconds, count):
                out.append((self._named(shard, item_id), item, deliveries))
        return out

    async def hold(self, consumer: str, item_id: str) -> bool:
        queue, stream_id = self._of(item_id)
        return await queue.hold(consumer, stream_id)

    async def finish(self, item_id: str, result: bytes) -> None:
        queue, stream_id = self._of(item_id)
        await queue.finish(stream_id, result)

    async def bury(self, item_id: str, item: bytes, reason: str) -> None:
        queue, stream_id = self._of(item_id)
        await queue.bury(stream_id, item, reason)

    async def result(self, item_id: str) -> bytes | None:
        queue, stream_id = self._of(item_id)
        return await queue.result(stream_id)

    async def size(self) -> int:
        return sum([await queue.size() for queue in self._shards])

    async def dead_size(self) -> int:
        return sum([await queue.dead_size() for queue in self._shards])

    async def byte_size(self) -> int:
        return sum([await queue.byte_size() for queue in self._shards])

    async def rewrite(self, keep: Rewrite) -> int:
        return sum([await queue.rewrite(keep) for queue in self._shards])

    async def expire_dead(self, before: float) -> int:
        return sum([await queue.expire_dead(before) for queue in self._shards])

    async def requeue_dead(self, count: int) -> int:
        moved = 0
        for queue in self._shards:  # each shard's dead letters back into its own stream
            moved += await queue.requeue_dead(count - moved)
            if moved >= count:
                break
        return moved


class MemoryQueue:
    """For the embedded default: one process, so not durable; the worker empties it before exit."""

    durable = False

    def __init__(self) -> None:
        self._items: dict[str, bytes] = {}
        self._taken: dict[str, tuple[str, float, int]] = {}  # id -> consumer, when, deliveries
        self._results: dict[str, tuple[bytes, float]] = {}
        self.dead: list[tuple[str, bytes, str]] = []  # id, item, reason
        self._buried_at: dict[str, float] = {}  # dead letter id -> when it was buried (epoch seconds)
        self._ids = itertools.count(1)
        self._arrived = asyncio.Event()

    async def put(self, item: bytes, max_items: int, max_bytes: int = 0) -> str | None:
        if len(self._items) >= max_items:
            return None
        queued = await self.byte_size()
        if max_bytes and queued and queued + len(item) > max_bytes:
            return None
        item_id = f"{int(time.time() * 1000)}-{next(self._ids)}"
        self._items[item_id] = item
        self._arrived.set()
        return item_id

    async def take(self, consumer: str, block_seconds: float, lane: int = 0) -> tuple[str, bytes] | None:
        deadline = time.monotonic() + block_seconds
        while True:
            fresh = next((i for i in self._items if i not in self._taken), None)
            if fresh is not None:
                self._taken[fresh] = (consumer, time.monotonic(), 1)
                return fresh, self._items[fresh]
            self._arrived.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                # asyncio.timeout, not wait_for: a cancel that lands as the event fires must
                # still cancel (the worker's stop), not return into another hour-long wait.
                async with asyncio.timeout(left):
                    await self._arrived.wait()
            except TimeoutError:
                return None

    async def reclaim(self, consumer: str, min_idle_seconds: float, count: int) -> list[tuple[str, bytes, int]]:
        now = time.monotonic()
        idle = [i for i, (_, at, _) in self._taken.items() if now - at >= min_idle_seconds][:count]
        out = []
        for item_id in idle:
            deliveries = self._taken[item_id][2] + 1
            self._taken[item_id] = (consumer, now, deliveries)
            out.append((item_id, self._items[item_id], deliveries))
        return out

    async def hold(self, consumer: str, item_id: str) -> bool:
        taken = self._taken.get(item_id)
        if taken is None or taken[0] != consumer:
            return False
        self._taken[item_id] = (consumer, time.monotonic(), taken[2])
        return True

    async def finish(self, item_id: str, result: bytes) -> None:
        self._drop(item_id)
        now = time.monotonic()
        self._results = {k: v for k, v in self._results.items() if now - v[1] < RESULT_SECONDS}
        self._results[item_id] = (result, now)

    async def bury(self, item_id: str, item: bytes, reason: str) -> None:
        self._drop(item_id)
        self.dead.append((item_id, item, reason))
        self._buried_at[item_id] = time.time()

    def _drop(self, item_id: str) -> None:
        self._items.pop(item_id, None)
        self._taken.pop(item_id, None)

    async def result(self, item_id: str) -> bytes | None:
        found = self._results.get(item_id)
        return None if found is None else found[0]

    async def size(self) -> int:
        return len(self._items)

    async def dead_size(self) -> int:
        return len(self.dead)

    async def byte_size(self) -> int:
        return sum(map(len, self._items.values()))  # at most max_items: a sum, no counter to keep true

    async def expire_dead(self, before: float) -> int:
        kept = [d for d in self.dead if self._buried_at.get(d[0], before) >= before]
        expired = len(self.dead) - len(kept)
        self.dead = kept
        self._buried_at = {d[0]: self._buried_at[d[0]] for d in kept if d[0] in self._buried_at}
        return expired

    async def requeue_dead(self, count: int) -> int:
        moved, self.dead = self.dead[:count], self.dead[count:]
        for _, item, _ in moved:
            await self.put(item, max_items=len(self._items) + 1)
        return len(moved)

    async def rewrite(self, keep: Rewrite) -> int:
        changed = 0
        for item_id, item in list(self._items.items()):
            new = keep(item)
            if new != item:
                changed += 1
                if new is None:
                    self._drop(item_id)  # one a worker holds is finished by it as it was
                else:
                    self._items[item_id] = new
        dead = []
        for item_id, item, reason in self.dead:
            new = keep(item)
            changed += new != item
            if new is not None:
                dead.append((item_id, new, reason))
        self.dead = dead
        return changed
