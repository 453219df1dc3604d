"""The Redis backend of the index contract (service/index/base.py).

Round trips per call are bounded, never a function of the number of fingerprints: ``insert``
and ``lookup`` send their Lua calls in a single pipeline (on a single Redis, one call carries
consecutive shards, up to ``RECORDS_PER_CALL`` records; on a Redis Cluster, one call per shard,
since a script may only touch one slot), every other method one pipeline or one command. On a
cluster the pipeline fans out to the nodes in parallel (one round trip per node, concurrently).

What the scripts get is prepared here with numpy, so they never turn numbers into strings (the
most expensive thing Lua does inside Redis): each record's bucket and field bytes, its own entry
already encoded, and its presence-filter bit as decimal text. Lookups come back as one packed
string per call rather than lists of integers, which redis-py would parse one by one.

Scripts are sent as EVALSHA inside the pipeline. A node that does not know a script (a fresh
node, a restarted one, a replica promoted by failover: script caches are not replicated)
answers NOSCRIPT for those calls only; they did nothing, so the script is loaded on every
primary and exactly those calls are sent again.
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import orjson
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from bleedwatch.fingerprint.scheme import Params
from service import metrics
from service.index.base import (
    HELD_VALUE_BYTES,
    PROMPT_BIT,
    RESPONSE_BIT,
    SERVED_FIRST_BIT,
    YIELD_EVERY,
    Doc,
    DocMeta,
    Entry,
    Hit,
    Kind,
    Lookup,
    Outbox,
    Queue,
    same_exchange,
)
from service.index.keys import DOC_REF_LIMIT, FILTER_BITS_PER_BUCKET, IDENTITY_BITS, MIN_FIELD_BYTES, SHARD_BITS, Keys
from service.index.outbox import RedisOutbox
from service.index.queue import RedisQueue, ShardedQueue
from service.index.window import Window

# A single Redis runs consecutive shards in one Lua call, up to this many records: few round
# trips, yet no call holds the server long enough to delay the ingest queue's XADD (the
# gateway's answer) behind index work (docs/performance.md).
RECORDS_PER_CALL = 512
# Calls sent in one pipeline. Redis reads a pipeline's calls together and runs them back to back,
# serving no other client in between: 16 calls of 512 records hold it some 60 ms, where one pipeline
# for a text of 250,000 fingerprints held it 2 s.
PIPELINE_CALLS = 16
# Tenant name -> ref entries kept per process by default (BLEEDWATCH_TENANT_CACHE_SIZE); about 150 bytes each.
DEFAULT_TENANT_CACHE_SIZE = 100_000
PURGE_PAGE = 1000  # document keys read (the start of each) per round trip while purging a tenant
_LOOKUP_ROW = np.dtype([("pos", ">u4"), ("tenant", ">u4"), ("doc", ">u4"), ("offset", ">u4"), ("kinds", "u1")])
KINDS = {
    k: Kind(k)
    for k in (PROMPT_BIT, RESPONSE_BIT, PROMPT_BIT | RESPONSE_BIT, PROMPT_BIT | RESPONSE_BIT | SERVED_FIRST_BIT)
}
_KINDS_BITS = PROMPT_BIT | RESPONSE_BIT | SERVED_FIRST_BIT  # a lookup row's kinds without lookup.lua's SENDER flag
_SENDER = 8

_TENANT_REFS = """
local out = {}
for i, name in ipairs(ARGV) do
  local ref = redis.call('HGET', KEYS[1], name)
  if not ref then
    ref = redis.call('INCR', KEYS[2])
    redis.call('HSET', KEYS[1], name, ref)
  end
  out[i] = tonumber(ref)
end
return out
"""

# KEYS[1] tenant names, KEYS[2] one API key's new-tenant set of this minute; ARGV limit, TTL, then
# (name, digest) pairs. Returns the names refused: unknown, not yet counted, and over the limit.
_ADMIT_TENANTS = """
local limit = tonumber(ARGV[1])
local refused = {}
for i = 3, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 and redis.call('SISMEMBER', KEYS[2], ARGV[i + 1]) == 0 then
    if redis.call('SCARD', KEYS[2]) < limit then
      redis.call('SADD', KEYS[2], ARGV[i + 1])
      redis.call('EXPIRE', KEYS[2], ARGV[2])
    else
      refused[#refused + 1] = ARGV[i]
    end
  end
end
return refused
"""
NEW_TENANTS_WINDOW_SECONDS = 60

# Refs first..last for ARGV[1] new documents; the counter restarts at 1 rather than pass 2^32.
_DOC_REFS = """
local n = tonumber(ARGV[1])
local last = redis.call('INCRBY', KEYS[1], n)
if last >= tonumber(ARGV[2]) then
  redis.call('SET', KEYS[1], n)
  last = n
end
return last
"""

RedisClient = Redis | RedisCluster


@dataclass(frozen=True, slots=True)
class LuaScript:
    source: str
    sha: str

    @classmethod
    def of(cls, source: str) -> LuaScript:
        return cls(source, hashlib.sha1(source.encode()).hexdigest())  # noqa: S324 - Redis names scripts by SHA-1


def _lua(name: str) -> str:
    """A script with common.lua in front of it (a Redis script cannot load another)."""
    lua = resources.files("service.index").joinpath("lua")
    return lua.joinpath("common.lua").read_text() + lua.joinpath(name).read_text()


def _shard_of(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    return values >> np.uint64(64 - SHARD_BITS)


def _be(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.uint8]:
    """Each value's big-endian bytes, one row per value."""
    arr = np.ascontiguousarray(values, dtype=dtype)
    return arr.view(np.uint8).reshape(len(arr), arr.dtype.itemsize)


def _decimals(x: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Each value (below 10^10) in decimal followed by a space, as rows with the mask of the bytes used."""
    digits = 10
    rows = np.empty((len(x), digits + 1), dtype=np.uint8)
    rest = x.astype(np.uint64)
    for k in range(digits - 1, -1, -1):
        rows[:, k] = (rest % np.uint64(10)).astype(np.uint8) + ord("0")
        rest //= np.uint64(10)
    rows[:, digits] = ord(" ")
    width = np.ones(len(x), dtype=np.int64)
    for k in range(1, digits):
        width += x >= np.uint64(10**k)
    used = np.arange(digits + 1)[None, :] >= (digits - width)[:, None]
    return rows, used


def _varints(x: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Each value as a varint (keys.py), in a row of 5 bytes, with the mask of the bytes it uses."""
    shifts = np.arange(5, dtype=np.uint64) * np.uint64(7)
    groups = (x[:, None] >> shifts) & np.uint64(0x7F)
    more = (x[:, None] >> (shifts + np.uint64(7))) > 0
    used = np.concatenate([np.ones((len(x), 1), dtype=bool), more[:, :-1]], axis=1)
    return (groups | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8), used


def encode_entries(
    tenants: npt.NDArray[np.uint64],
    docs: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.uint64],
    kinds: npt.NDArray[np.uint64],
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
    """Entries as stored, ``varint(tenant * 8 + kinds) . doc u32 . varint(offset)``, as rows of up to
    14 bytes with the mask of the bytes each uses (row-major selection gives the bytes in order)."""
    head, head_used = _varints(tenants * np.uint64(8) + kinds)
    tail, tail_used = _varints(offsets)
    rows = np.hstack([head, _be(docs, ">u4"), tail])
    used = np.hstack([head_used, np.ones((len(docs), 4), dtype=bool), tail_used])
    return rows, used


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a fingerprint lives (keys.py): its bucket bytes (the key's suffix) and its field bytes.

    The Lua scripts get both cut out already, so they never turn numbers into strings.
    """

    bucket_bits: int  # BLEEDWATCH_INDEX_BUCKET_BITS: shard bits plus bucket bits

    @property
    def in_shard(self) -> int:
        return self.bucket_bits - SHARD_BITS

    @property
    def bucket_bytes(self) -> int:
        return max(1, -(-self.in_shard // 8))

    @property
    def field_bytes(self) -> int:
        return max(MIN_FIELD_BYTES, -(-(IDENTITY_BITS - self.bucket_bits) // 8))

    def fields(self, values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """The bits the key does not imply, XOR-folded to ``field_bytes``: every bit counts, so
        fingerprints that differ in any one bit do not share a field."""
        bits = np.uint64(8 * self.field_bytes)
        rest = (values << np.uint64(self.bucket_bits)) >> np.uint64(self.bucket_bits)
        return (rest ^ (rest >> bits)) & np.uint64((1 << int(bits)) - 1)

    def buckets(self, values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        if not self.in_shard:
            return np.zeros(len(values), dtype=np.uint64)
        return (values << np.uint64(SHARD_BITS)) >> np.uint64(64 - self.in_shard)

    def cut(self, values: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
        raw = _be(self.buckets(values), ">u8")[:, 8 - self.bucket_bytes :]
        return raw, _be(self.fields(values), ">u8")[:, 8 - self.field_bytes :]

    def filter_bits(self, values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        """Each fingerprint's bit in its shard's presence filter (keys.py)."""
        per_bucket = np.uint64(FILTER_BITS_PER_BUCKET)
        return self.buckets(values) * per_bucket + values % per_bucket

    @property
    def filter_bytes(self) -> int:
        return (1 << self.in_shard) * FILTER_BITS_PER_BUCKET // 8

    def insert_format(self) -> str:
        return f">I4I4I4Bc{self.bucket_bytes}c{self.field_bytes}I4Bc0"

    def lookup_format(self) -> str:
        return f">I4c{self.bucket_bytes}c{self.field_bytes}"


def encode_doc(meta: DocMeta, generation: int) -> bytes:
    head = orjson.dumps(
        {
            "gen": generation,
            "tenant": meta.tenant,
            "request_id": meta.request_id,
            "kind": int(meta.kind),
            "model": meta.model,
            "ts": meta.ts,
            "token_count": meta.token_count,
            "context": meta.context,
            "params": [meta.params.n, meta.params.w, meta.params.sample_after, meta.params.sample_mod],
        }
    )
    values = b"" if meta.values is None else meta.values.astype("<u8").tobytes()
    offsets = b"" if meta.offsets is None else meta.offsets.astype("<u4").tobytes()
    return struct.pack("<II", len(head), len(values) // 8) + head + values + offsets


def decode_doc(raw: bytes) -> tuple[int, DocMeta]:
    head_len, count = struct.unpack_from("<II", raw)
    head = orjson.loads(raw[8 : 8 + head_len])
    body = 8 + head_len
    values = offsets = None
    if body < len(raw):
        values = np.frombuffer(raw, "<u8", count, body).astype(np.uint64)
        offsets = np.frombuffer(raw, "<u4", count, body + 8 * count).astype(np.uint32)
    return head["gen"], DocMeta(
        tenant=head["tenant"],
        request_id=head["request_id"],
        kind=Kind(head["kind"]),
        model=head["model"],
        ts=head["ts"],
        token_count=head["token_count"],
        context=head["context"],
        params=Params(*head["params"]),
        values=values,
        offsets=offsets,
    )


class RedisIndex:
    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        window: Window,
        common_prompt_tenants: int,
        common_tenants: int,
        bucket_bits: int,
        queue_shards: int = 1,
        tenant_cache_size: int = DEFAULT_TENANT_CACHE_SIZE,
    ) -> None:
        if not SHARD_BITS <= bucket_bits <= SHARD_BITS + 16:
            raise ValueError(f"bucket bits must be between {SHARD_BITS} and {SHARD_BITS + 16}")
        self._r = client
        self._keys = keys
        self._window = window
        self._common = (common_prompt_tenants, common_tenants)
        self._layout = Layout(bucket_bits)
        self._insert = LuaScript.of(_lua("insert.lua"))
        self._lookup = LuaScript.of(_lua("lookup.lua"))
        self._tenant_script = LuaScript.of(_TENANT_REFS)
        self._doc_refs_script = LuaScript.of(_DOC_REFS)
        self._admit_script = LuaScript.of(_ADMIT_TENANTS)
        # Least recently used first. Bounded because tenant names come from ingest keys' callers: an
        # unbounded dict would let one key grow every replica's memory by sending ever-new names.
        # Refs are stable in Redis, so an evicted name costs one round trip the next time, nothing more.
        self._tenant_cache: OrderedDict[str, int] = OrderedDict()
        self._tenant_cache_size = tenant_cache_size
        self._outbox: Outbox | None = None
        self._queue: Queue | None = None
        self._queue_shards = queue_shards

    @property
    def client(self) -> RedisClient:
        return self._r

    def outbox(self) -> Outbox:
        if self._outbox is None:
            self._outbox = RedisOutbox(self._r, self._keys)
        return self._outbox

    def queue(self) -> Queue:
        if self._queue is None:
            shards = [RedisQueue(self._r, self._keys, i) for i in range(self._queue_shards)]
            self._queue = shards[0] if len(shards) == 1 else ShardedQueue(shards)
        return self._queue

    @property
    def keys(self) -> Keys:
        return self._keys

    async def ping(self) -> None:
        metrics.REDIS_ROUND_TRIPS.inc()
        await self._r.ping()

    async def close(self) -> None:
        await self._r.aclose()

    async def tenant_refs(self, names: list[str]) -> dict[str, int]:
        cache = self._tenant_cache
        out = {}
        for name in names:
            if name in cache:
                cache.move_to_end(name)
                out[name] = cache[name]
        missing = sorted({n for n in names if n not in out})
        if missing:
            (refs,) = await self._scripts(
                [(self._tenant_script, [self._keys.tenant_names, self._keys.tenant_seq], missing)]
            )
            for name, ref in zip(missing, refs, strict=True):
                out[name] = cache[name] = int(ref)
            while len(cache) > self._tenant_cache_size:
                cache.popitem(last=False)
                metrics.TENANT_CACHE_EVICTIONS.inc()
        return {n: out[n] for n in names}

    async def admit_new_tenants(self, key_id: str, names: list[str], limit: int, now: float) -> set[str]:
        unknown = sorted({n for n in names if n not in self._tenant_cache})  # cached = known: no round trip
        if not unknown:
            return set()
        minute = int(now // NEW_TENANTS_WINDOW_SECONDS)
        args: list[Any] = [limit, 2 * NEW_TENANTS_WINDOW_SECONDS]
        for name in unknown:
            args += [name, self._keys.tenant_digest(name)]
        keys = [self._keys.tenant_names, self._keys.new_tenants(key_id, minute)]
        (refused,) = await self._scripts([(self._admit_script, keys, args)])
        return {r.decode() if isinstance(r, bytes) else str(r) for r in refused}

    @property
    def tenant_cache_len(self) -> int:
        """Names cached in this process (tests check the bound)."""
        return len(self._tenant_cache)

    async def new_doc_refs(self, count: int) -> int:
        if not 0 < count < DOC_REF_LIMIT // 2:
            raise ValueError("count must be positive and well below 2^31")
        (last,) = await self._scripts([(self._doc_refs_script, [self._keys.doc_seq], [count, DOC_REF_LIMIT])])
        return int(last) - count + 1

    async def put_docs(self, key_id: str, docs: dict[int, DocMeta], now: float) -> set[int]:
        if not docs:
            return set()
        ttl, gen = self._window.ttl_seconds, self._window.current(now)
        encoded = {ref: encode_doc(meta, gen) for ref, meta in docs.items()}
        async with self._r.pipeline(transaction=False) as pipe:
            for ref, value in encoded.items():  # written only where there is none
                pipe.set(self._keys.doc(key_id, ref), value, ex=ttl, nx=True, get=True)
            metrics.REDIS_ROUND_TRIPS.inc()
            held = await pipe.execute()
        taken: set[int] = set()
        again = []  # the same exchange processed again (at least once): its document rewritten, TTL renewed
        for (ref, meta), old in zip(docs.items(), held, strict=True):
            if old is not None:
                if same_exchange(decode_doc(old)[1], meta):
                    again.append(ref)
                else:
                    taken.add(ref)
        if again:
            async with self._r.pipeline(transaction=False) as pipe:
                for ref in again:
                    pipe.set(self._keys.doc(key_id, ref), encoded[ref], ex=ttl)
                metrics.REDIS_ROUND_TRIPS.inc()
                await pipe.execute()
        return taken

    async def get_docs(self, key_id: str, refs: list[int], now: float) -> dict[int, DocMeta]:
        if not refs:
            return {}
        async with self._r.pipeline(transaction=False) as pipe:
            for ref in refs:
                pipe.get(self._keys.doc(key_id, ref))
            metrics.REDIS_ROUND_TRIPS.inc()
            raws = await pipe.execute()
        oldest = self._window.live(now).start
        out = {}
        for ref, raw in zip(refs, raws, strict=True):
            if raw is not None:
                gen, meta = decode_doc(raw)
                if gen >= oldest:  # the key's TTL is a backstop; the window decides
                    out[ref] = meta
        return out

    async def insert(self, key_id: str, docs: list[Doc], now: float) -> list[Hit]:
        total = sum(len(d.values) for d in docs)
        if total == 0:
            return []
        if any(not 0 <= d.ref < DOC_REF_LIMIT or not 0 <= d.tenant < DOC_REF_LIMIT for d in docs):
            raise ValueError("doc and tenant refs are stored as u32: use new_doc_refs and tenant_refs")
        sizes = [len(d.values) for d in docs]
        values = np.concatenate([d.values for d in docs]).astype(np.uint64)
        tenants = np.repeat(np.array([d.tenant for d in docs], dtype=np.uint64), sizes)
        refs = np.repeat(np.array([d.ref for d in docs], dtype=np.uint64), sizes)
        kinds = np.repeat(np.array([int(d.kind) for d in docs], dtype=np.uint64), sizes)
        offsets = np.concatenate([d.offsets for d in docs]).astype(np.uint64)
        bucket, field = self._layout.cut(values)
        entries, used = encode_entries(tenants, refs, offsets, kinds)
        fixed = np.hstack(
            [
                _be(np.repeat(np.arange(len(docs)), sizes), ">u4"),
                _be(tenants, ">u4"),
                _be(refs, ">u4"),
                _be(kinds, "u1"),
                bucket,
                field,
                _be(offsets, ">u4"),
                _be(used.sum(axis=1), "u1"),
            ]
        )
        records = np.hstack([fixed, entries])
        mask = np.hstack([np.ones(fixed.shape, dtype=bool), used])
        current = self._window.current(now)
        common_args = [
            current,
            self._window.generations,
            self._window.expires_at(current),
            *self._common,
            self._layout.insert_format(),
        ]
        bits = _decimals(self._layout.filter_bits(values))
        replies = await self._per_shard(
            key_id,
            values,
            [(records, mask), bits],
            self._insert,
            common_args,
            [self._layout.filter_bytes, HELD_VALUE_BYTES],
        )
        counts: dict[tuple[int, int, int, int], int] = {}
        for reply in replies:  # one per shard: the same pair can show up in several
            for i in range(0, len(reply), 5):
                key = (int(reply[i]), int(reply[i + 1]), int(reply[i + 2]), int(reply[i + 3]))
                counts[key] = counts.get(key, 0) + int(reply[i + 4])
        return [Hit(pos, tenant, ref, KINDS[k], n) for (pos, tenant, ref, k), n in counts.items()]

    async def lookup(self, key_id: str, values: npt.NDArray[np.uint64], now: float) -> list[Lookup]:
        out = [Lookup(())] * len(values)
        if len(values) == 0:
            return out
        values = values.astype(np.uint64)
        bucket, field = self._layout.cut(values)
        records = np.hstack([_be(np.arange(len(values)), ">u4"), bucket, field])
        bits = _decimals(self._layout.filter_bits(values))
        common_args = [
            self._window.current(now),
            self._window.generations,
            *self._common,
            self._layout.lookup_format(),
        ]
        replies = await self._per_shard(key_id, values, [(records, None), bits], self._lookup, common_args)
        rows = np.frombuffer(b"".join(cast(list[bytes], replies)), dtype=_LOOKUP_ROW)
        if len(rows) == 0:
            return out
        positions = rows["pos"].tolist()
        tenants, refs, offsets = rows["tenant"].tolist(), rows["doc"].tolist(), rows["offset"].tolist()
        kinds = rows["kinds"].tolist()
        i, n, turn = 0, len(positions), YIELD_EVERY
        while i < n:
            if i >= turn:
                turn = i + YIELD_EVERY
                await asyncio.sleep(0)
            pos, j = positions[i], i
            while j < n and positions[j] == pos:
                j += 1
            if kinds[i] == 0:  # common by senders (lookup.lua)
                out[pos] = Lookup(None)
            elif kinds[i] == _SENDER:  # common by holders; rows after it are its senders, flagged
                senders = tuple(Entry(tenants[k], refs[k], offsets[k], kinds[k] & _KINDS_BITS) for k in range(i + 1, j))
                out[pos] = Lookup(None, senders)
            else:
                out[pos] = Lookup(tuple(Entry(tenants[k], refs[k], offsets[k], kinds[k]) for k in range(i, j)))
            i = j
        return out

    async def _per_shard(
        self,
        key_id: str,
        values: npt.NDArray[np.uint64],
        columns: list[tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_] | None]],
        script: LuaScript,
        args: list[Any],
        tail: Sequence[Any] = (),
    ) -> list[Any]:
        """The records, grouped by shard, in as few Lua calls as allowed, all in one pipeline.

        A Redis Cluster gets one call per shard (a script only touches one slot); a single Redis
        gets consecutive shards together. Either way a call holds at most ``RECORDS_PER_CALL``
        records, so it never holds the server for long. Each of ``columns`` is one byte row per record, with the
        mask of the bytes each row uses when rows vary in length; every call gets ``args``, its
        records per shard, one string per column (its records' rows, concatenated), ``tail``.
        """
        shards = _shard_of(values)
        order = np.argsort(shards, kind="stable")
        sorted_shards = shards[order]
        cuts = np.flatnonzero(np.diff(sorted_shards)) + 1
        # Each shard's records, in pieces of at most RECORDS_PER_CALL: a sender chooses its values, and
        # can put all 500,000 of a text in one shard, which one call would hold Redis for seconds
        # with (BUSY for every other client). A piece sees what the pieces before it wrote.
        starts, stops = [], []
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(order)], strict=True):
            for first in range(lo, hi, RECORDS_PER_CALL):
                starts.append(first)
                stops.append(min(first + RECORDS_PER_CALL, hi))
        ends = []
        flats = []
        for matrix, mask in columns:
            if mask is None:
                flats.append(matrix[order].tobytes())
                ends.append(np.arange(1, len(order) + 1) * matrix.shape[1])
            else:
                flats.append(matrix[order][mask[order]].tobytes())
                ends.append(np.cumsum(mask[order].sum(axis=1)))
        one_per_call = isinstance(self._r, RedisCluster)
        groups: list[list[int]] = [[]]
        held = 0
        for i, (lo, hi) in enumerate(zip(starts, stops, strict=True)):
            if groups[-1] and (one_per_call or held + hi - lo > RECORDS_PER_CALL):
                groups.append([])
                held = 0
            groups[-1].append(i)
            held += hi - lo
        calls = []
        for group in groups:
            lo, hi = starts[group[0]], stops[group[-1]]
            keys = [self._keys.shard(key_id, int(sorted_shards[starts[i]])) for i in group]
            counts = np.array([stops[i] - starts[i] for i in group], dtype=">u4").tobytes()
            strings = [
                flat[(int(end[lo - 1]) if lo else 0) : int(end[hi - 1])] for flat, end in zip(flats, ends, strict=True)
            ]
            calls.append((script, keys, [*args, counts, *strings, *tail]))
        return await self._scripts(calls)

    async def _scripts(self, calls: Sequence[tuple[LuaScript, list[str], Sequence[Any]]]) -> list[Any]:
        """EVALSHA every call, ``PIPELINE_CALLS`` a pipeline, in order."""
        results: list[Any] = []
        for first in range(0, len(calls), PIPELINE_CALLS):
            results += await self._pipeline(calls[first : first + PIPELINE_CALLS])
        return results

    async def _pipeline(self, calls: Sequence[tuple[LuaScript, list[str], Sequence[Any]]]) -> list[Any]:
        """EVALSHA the calls in one pipeline; calls a node answered NOSCRIPT are loaded and sent again."""
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(3):
            async with self._r.pipeline(transaction=False) as pipe:
                for i in todo:
                    script, keys, args = calls[i]
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
                metrics.REDIS_ROUND_TRIPS.inc()
                replies = await pipe.execute(raise_on_error=False)
            missing: dict[str, LuaScript] = {}
            retry = []
            for i, reply in zip(todo, replies, strict=True):
                if isinstance(reply, NoScriptError) or (
                    isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT")
                ):
                    missing[calls[i][0].sha] = calls[i][0]
                    retry.append(i)
                elif isinstance(reply, Exception):
                    raise reply
                else:
                    results[i] = reply
            if not retry:
                return results
            if attempt == 2:
                break
            for script in missing.values():
                metrics.REDIS_ROUND_TRIPS.inc()
                await self._r.script_load(script.source)  # a cluster sends it to every primary
            todo = retry
        raise NoScriptError("Redis kept answering NOSCRIPT after loading the scripts")

    async def done(self, keys: list[str], now: float) -> list[bool]:
        if not keys:
            return []
        async with self._r.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.get(self._keys.done(key))
            oldest = self._window.live(now).start
            metrics.REDIS_ROUND_TRIPS.inc()
            return [raw is not None and int(raw) >= oldest for raw in await pipe.execute()]

    async def mark_done(self, keys: list[str], now: float) -> None:
        if not keys:
            return
        async with self._r.pipeline(transaction=False) as pipe:
            gen = self._window.current(now)
            for key in keys:
                pipe.set(self._keys.done(key), gen, ex=self._window.ttl_seconds)
            metrics.REDIS_ROUND_TRIPS.inc()
            await pipe.execute()

    async def purged(self, names: list[str]) -> dict[str, float]:
        if not names:
            return {}
        unique = sorted(set(names))
        metrics.REDIS_ROUND_TRIPS.inc()
        raws = await self._r.hmget(self._keys.tenant_tombstones, [self._keys.tenant_digest(n) for n in unique])
        out = {}
        for name, raw in zip(unique, raws, strict=True):
            if raw is None:
                continue
            at, ref = raw.split()
            out[name] = float(at)
            if self._tenant_cache.get(name) == int(ref):  # cached here before another replica purged it
                del self._tenant_cache[name]
        return out

    async def purge_tenant(self, name: str, now: float) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        ref = await self._r.hget(self._keys.tenant_names, name)
        async with self._r.pipeline(transaction=True) as pipe:  # one hash tag: one slot
            pipe.hset(self._keys.tenant_tombstones, self._keys.tenant_digest(name), f"{now!r} {int(ref or 0)}")
            pipe.hdel(self._keys.tenant_names, name)
            metrics.REDIS_ROUND_TRIPS.inc()
            await pipe.execute()
        self._tenant_cache.pop(name, None)
        # A document's metadata starts {"gen":<int>,"tenant":<name> (encode_doc): read only that much.
        marker = b',"tenant":' + orjson.dumps(name) + b","
        head = 8 + len(b'{"gen":') + 20 + len(marker)
        deleted = 0
        page: list[bytes] = []
        async for key in self._r.scan_iter(match=self._keys.doc_pattern(), count=PURGE_PAGE):
            page.append(key)
            if len(page) >= PURGE_PAGE:
                deleted += await self._purge_docs(page, marker, head)
                page = []
        return deleted + await self._purge_docs(page, marker, head)

    async def _purge_docs(self, keys: list[bytes], marker: bytes, head: int) -> int:
        if not keys:
            return 0
        async with self._r.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.getrange(key, 0, head - 1)
            metrics.REDIS_ROUND_TRIPS.inc()
            starts = await pipe.execute()
        gone = [key for key, start in zip(keys, starts, strict=True) if start and marker in bytes(start)[8:]]
        if gone:
            async with self._r.pipeline(transaction=False) as pipe:
                for key in gone:  # one key a command: a cluster pipeline sends each to its node
                    pipe.execute_command("UNLINK", key)
                metrics.REDIS_ROUND_TRIPS.inc()
                await pipe.execute()
        return len(gone)

    async def durability(self) -> metrics.Durability:
        """AOF and eviction policy of every node (INFO, which managed Redis allows where CONFIG is not)."""
        metrics.REDIS_ROUND_TRIPS.inc(2)
        every: dict[str, Any] = {"target_nodes": RedisCluster.ALL_NODES} if isinstance(self._r, RedisCluster) else {}
        persistence = await self._r.info("persistence", **every)
        memory = await self._r.info("memory", **every)
        nodes_p, nodes_m = _per_node(persistence), _per_node(memory)
        aof = all(str(n.get("aof_enabled", "0")) == "1" for n in nodes_p)
        policies = {str(n.get("maxmemory_policy", "unknown")) for n in nodes_m}
        policy = next((p for p in sorted(policies) if p != "noeviction"), "noeviction")
        return metrics.Durability(aof=aof, eviction_policy=policy)

    async def stats(self) -> metrics.IndexStats:
        """For /metrics (cached there): keys in this Redis database, its used memory and its maxmemory;
        two commands (the limit comes with the memory, from the same INFO memory).

        On a Redis Cluster all are asked of every primary and added up: redis-py sums DBSIZE over
        the primaries itself, but sends INFO to one node unless told, which would report a third
        (at 3 masters) of the memory, or a flat answer where a per-node one was expected. The limit
        is 0 (none) when any primary has none: a sum over the others would understate it. The fullest
        primary's share of its own limit is what says when writes will be refused.
        """
        metrics.REDIS_ROUND_TRIPS.inc(2)
        if isinstance(self._r, RedisCluster):
            items: Any = await self._r.dbsize(target_nodes=RedisCluster.PRIMARIES)
            per_node: Any = await self._r.info("memory", target_nodes=RedisCluster.PRIMARIES)
            if isinstance(items, dict):
                items = sum(int(v) for v in items.values())
            nodes = list(per_node.values()) if "used_memory" not in per_node else [per_node]
        else:
            items, memory = await self._r.dbsize(), await self._r.info("memory")
            nodes = [memory]
        limits = [int(m.get("maxmemory", 0)) for m in nodes]
        used = [int(m.get("used_memory", 0)) for m in nodes]
        return metrics.IndexStats(
            items=int(items),
            memory_bytes=sum(used),
            memory_max_bytes=sum(limits) if all(limits) else 0,
            memory_fullest=max((u / limit for u, limit in zip(used, limits, strict=True) if limit), default=0.0),
        )


def _per_node(info: dict[str, Any]) -> list[dict[str, Any]]:
    """INFO answers one node's fields, or (on a cluster, depending on the target) a dict per node."""
    values = list(info.values())
    if values and all(isinstance(v, dict) for v in values):
        return values
    return [info]
