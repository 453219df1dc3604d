"""The Redis backend of the index contract (service/index/base.py).

Round trips per call are bounded, never a function of the number of fingerprints: ``insert``
and ``lookup`` send one Lua call per shard in a single pipeline, every other method one
pipeline or one command. Works against a single Redis or a Redis Cluster, where the pipeline
fans out to the nodes in parallel (one round trip per node, concurrently).

Scripts are sent as EVALSHA inside the pipeline. A node that does not know a script (a fresh
node, a restarted one, a replica promoted by failover: script caches are not replicated)
answers NOSCRIPT for those calls only; they did nothing, so the script is loaded on every
primary and exactly those calls are sent again.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from redis.asyncio import Redis, RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from service import metrics
from service.fingerprint.scheme import Params
from service.index.base import Doc, DocMeta, Entry, Hit, Kind, Lookup
from service.index.keys import DOC_REF_LIMIT, FILTER_BITS_PER_BUCKET, SHARD_BITS, Keys
from service.index.window import Window

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
    return resources.files("service.index").joinpath("lua", name).read_text()


def _shard_of(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    return values >> np.uint64(64 - SHARD_BITS)


def _be(values: npt.NDArray[Any], dtype: str) -> npt.NDArray[np.uint8]:
    """Each value's big-endian bytes, one row per value."""
    arr = np.ascontiguousarray(values, dtype=dtype)
    return arr.view(np.uint8).reshape(len(arr), arr.dtype.itemsize)


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
        return 8 - self.bucket_bits // 8

    def buckets(self, values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        if not self.in_shard:
            return np.zeros(len(values), dtype=np.uint64)
        return (values << np.uint64(SHARD_BITS)) >> np.uint64(64 - self.in_shard)

    def cut(self, values: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
        raw = _be(self.buckets(values), ">u8")[:, 8 - self.bucket_bytes :]
        return raw, _be(values, ">u8")[:, 8 - self.field_bytes :]

    def filter_bits(self, values: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
        """Each fingerprint's bit in its shard's presence filter, and its bucket's TTL bit (keys.py)."""
        buckets = self.buckets(values)
        low = values & np.uint64(FILTER_BITS_PER_BUCKET - 1)
        presence = np.uint64(1 << self.in_shard) + buckets * np.uint64(FILTER_BITS_PER_BUCKET) + low
        return presence, buckets

    def insert_format(self) -> str:
        return f">I4I4I4Bc{self.bucket_bytes}c{self.field_bytes}I4"

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
        self._tenant_cache: dict[str, int] = {}

    @property
    def client(self) -> RedisClient:
        return self._r

    @property
    def keys(self) -> Keys:
        return self._keys

    async def ping(self) -> None:
        metrics.REDIS_ROUND_TRIPS.inc()
        await self._r.ping()

    async def close(self) -> None:
        await self._r.aclose()

    async def tenant_refs(self, names: list[str]) -> dict[str, int]:
        missing = sorted({n for n in names if n not in self._tenant_cache})
        if missing:
            (refs,) = await self._scripts(
                [(self._tenant_script, [self._keys.tenant_names, self._keys.tenant_seq], missing)]
            )
            self._tenant_cache.update(zip(missing, (int(r) for r in refs), strict=True))
        return {n: self._tenant_cache[n] for n in names}

    async def new_doc_refs(self, count: int) -> int:
        if not 0 < count < DOC_REF_LIMIT // 2:
            raise ValueError("count must be positive and well below 2^31")
        (last,) = await self._scripts([(self._doc_refs_script, [self._keys.doc_seq], [count, DOC_REF_LIMIT])])
        return int(last) - count + 1

    async def put_docs(self, ns: str, docs: dict[int, DocMeta], now: float) -> None:
        if not docs:
            return
        ttl, gen = self._window.ttl_seconds, self._window.current(now)
        async with self._r.pipeline(transaction=False) as pipe:
            for ref, meta in docs.items():
                pipe.set(self._keys.doc(ns, ref), encode_doc(meta, gen), ex=ttl)
            metrics.REDIS_ROUND_TRIPS.inc()
            await pipe.execute()

    async def get_docs(self, ns: str, refs: list[int], now: float) -> dict[int, DocMeta]:
        if not refs:
            return {}
        async with self._r.pipeline(transaction=False) as pipe:
            for ref in refs:
                pipe.get(self._keys.doc(ns, ref))
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

    async def insert(self, ns: str, docs: list[Doc], now: float) -> list[Hit]:
        total = sum(len(d.values) for d in docs)
        if total == 0:
            return []
        if any(not 0 <= d.ref < DOC_REF_LIMIT or not 0 <= d.tenant < DOC_REF_LIMIT for d in docs):
            raise ValueError("doc and tenant refs are stored as u32: use new_doc_refs and tenant_refs")
        sizes = [len(d.values) for d in docs]
        values = np.concatenate([d.values for d in docs]).astype(np.uint64)
        bucket, field = self._layout.cut(values)
        columns = [
            _be(np.repeat(np.arange(len(docs)), sizes), ">u4"),
            _be(np.repeat([d.tenant for d in docs], sizes), ">u4"),
            _be(np.repeat([d.ref for d in docs], sizes), ">u4"),
            _be(np.repeat([int(d.kind) for d in docs], sizes), "u1"),
            bucket,
            field,
            _be(np.concatenate([d.offsets for d in docs]), ">u4"),
        ]
        records = np.hstack(columns)
        presence, ttl_bits = self._layout.filter_bits(values)
        bits = np.column_stack([presence, ttl_bits])
        current = self._window.current(now)
        common_args = [
            current,
            self._window.generations,
            self._window.expires_at(current),
            *self._common,
            self._layout.insert_format(),
            records.shape[1],
        ]
        replies = await self._per_shard(ns, values, records, bits, self._insert, common_args)
        counts: dict[tuple[int, int, int, int], int] = {}
        for reply in replies:  # one per shard: the same pair can show up in several
            for i in range(0, len(reply), 5):
                pos, tenant, ref, kinds, count = (int(x) for x in reply[i : i + 5])
                counts[(pos, tenant, ref, kinds)] = counts.get((pos, tenant, ref, kinds), 0) + count
        return [Hit(pos, tenant, ref, Kind(kinds), n) for (pos, tenant, ref, kinds), n in counts.items()]

    async def lookup(self, ns: str, values: npt.NDArray[np.uint64], now: float) -> list[Lookup]:
        out = [Lookup(())] * len(values)
        if len(values) == 0:
            return out
        values = values.astype(np.uint64)
        bucket, field = self._layout.cut(values)
        records = np.hstack([_be(np.arange(len(values)), ">u4"), bucket, field])
        presence, _ = self._layout.filter_bits(values)
        common_args = [
            self._window.current(now),
            self._window.generations,
            *self._common,
            self._layout.lookup_format(),
            records.shape[1],
        ]
        for reply in await self._per_shard(ns, values, records, presence[:, None], self._lookup, common_args):
            i = 0
            while i < len(reply):
                pos, count = int(reply[i]), int(reply[i + 1])
                i += 2
                if count < 0:
                    out[pos] = Lookup(None)
                    continue
                flat = [int(x) for x in reply[i : i + 4 * count]]
                i += 4 * count
                out[pos] = Lookup(
                    tuple(Entry(flat[j], flat[j + 1], flat[j + 2], Kind(flat[j + 3])) for j in range(0, len(flat), 4))
                )
        return out

    async def _per_shard(
        self,
        ns: str,
        values: npt.NDArray[np.uint64],
        records: npt.NDArray[np.uint8],
        bits: npt.NDArray[np.uint64],
        script: LuaScript,
        args: list[Any],
    ) -> list[list[Any]]:
        """One Lua call per shard the records fall into, all in one pipeline, records kept in order.

        ``bits`` are the records' filter bit offsets, sent as decimal strings after the records.
        """
        shards = _shard_of(values)
        order = np.argsort(shards, kind="stable")
        bounds = np.flatnonzero(np.diff(shards[order])) + 1
        calls = []
        for chunk in np.split(order, bounds):
            shard = int(shards[chunk[0]])
            offsets = bits[chunk].ravel().astype(np.bytes_).tolist()
            calls.append((script, [self._keys.shard(ns, shard)], [*args, records[chunk].tobytes(), *offsets]))
        return await self._scripts(calls)

    async def _scripts(self, calls: Sequence[tuple[LuaScript, list[str], Sequence[Any]]]) -> list[Any]:
        """EVALSHA every call in one pipeline; calls a node answered NOSCRIPT are loaded and sent again."""
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

    async def stats(self) -> metrics.IndexStats:
        """For /metrics (cached there): keys in this Redis database and its used memory; two commands."""
        metrics.REDIS_ROUND_TRIPS.inc(2)
        items, memory = await self._r.dbsize(), await self._r.info("memory")
        if isinstance(self._r, RedisCluster):  # per-node answers
            items = sum(int(v) for v in items.values()) if isinstance(items, dict) else int(items)
            memory = {"used_memory": sum(int(m.get("used_memory", 0)) for m in memory.values())}
        return metrics.IndexStats(items=int(items), memory_bytes=int(memory["used_memory"]))
