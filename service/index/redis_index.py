"""The Redis backend of the index contract (service/index/base.py).

Round trips per call are bounded by the number of shards touched, never by fingerprints:
``insert`` and ``lookup`` send one Lua call per shard in a single pipeline. Works against a
single Redis or a Redis Cluster (the pipeline then fans out per node).
"""

from __future__ import annotations

import struct
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from redis.asyncio import Redis, RedisCluster

from service import metrics
from service.fingerprint.scheme import Params
from service.index.base import Doc, DocMeta, Entry, Hit, Kind, Lookup
from service.index.keys import SHARD_BITS, Keys
from service.index.window import Window

_INSERT_RECORD = np.dtype(
    [("pos", ">u4"), ("tenant", ">u4"), ("doc", ">u4"), ("kind", "u1"), ("value", ">u8"), ("offset", ">u4")]
)
_LOOKUP_RECORD = np.dtype([("pos", ">u4"), ("value", ">u8")])

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

RedisClient = Redis | RedisCluster


def _lua(name: str) -> str:
    return resources.files("service.index").joinpath("lua", name).read_text()


def _shard_of(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    return values >> np.uint64(64 - SHARD_BITS)


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
        self._r = client
        self._keys = keys
        self._window = window
        self._common = (common_prompt_tenants, common_tenants)
        self._bucket_bits = bucket_bits - SHARD_BITS
        self._insert = client.register_script(_lua("insert.lua"))
        self._lookup = client.register_script(_lua("lookup.lua"))
        self._tenant_script = client.register_script(_TENANT_REFS)
        self._tenant_cache: dict[str, int] = {}

    async def ping(self) -> None:
        metrics.REDIS_ROUND_TRIPS.inc()
        await self._r.ping()

    async def close(self) -> None:
        await self._r.aclose()

    async def tenant_refs(self, names: list[str]) -> dict[str, int]:
        missing = sorted({n for n in names if n not in self._tenant_cache})
        if missing:
            metrics.REDIS_ROUND_TRIPS.inc()
            refs = await self._tenant_script(keys=[self._keys.tenant_names, self._keys.tenant_seq], args=missing)
            self._tenant_cache.update(zip(missing, (int(r) for r in refs), strict=True))
        return {n: self._tenant_cache[n] for n in names}

    async def new_doc_refs(self, count: int) -> int:
        metrics.REDIS_ROUND_TRIPS.inc()
        last = int(await self._r.incrby(self._keys.doc_seq, count))
        return last - count + 1

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
        records = np.empty(total, dtype=_INSERT_RECORD)
        start = 0
        for pos, doc in enumerate(docs):
            part = records[start : start + len(doc.values)]
            part["pos"], part["tenant"], part["doc"], part["kind"] = pos, doc.tenant, doc.ref, int(doc.kind)
            part["value"], part["offset"] = doc.values, doc.offsets
            start += len(doc.values)
        common_args = [
            self._window.current(now),
            self._window.generations,
            self._window.ttl_seconds,
            *self._common,
            self._bucket_bits,
        ]
        replies = await self._per_shard(ns, records, self._insert, common_args)
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
        records = np.empty(len(values), dtype=_LOOKUP_RECORD)
        records["pos"], records["value"] = np.arange(len(values)), values
        common_args = [self._window.current(now), self._window.generations, *self._common, self._bucket_bits]
        for reply in await self._per_shard(ns, records, self._lookup, common_args):
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

    async def _per_shard(self, ns: str, records: npt.NDArray[Any], script: Any, args: list[int]) -> list[list[Any]]:
        """One Lua call per shard the records fall into, all in one pipeline, records kept in order."""
        shards = _shard_of(records["value"].astype(np.uint64))
        order = np.argsort(shards, kind="stable")
        sorted_shards = shards[order]
        bounds = np.flatnonzero(np.diff(sorted_shards)) + 1
        async with self._r.pipeline(transaction=False) as pipe:
            for chunk in np.split(order, bounds):
                shard = int(shards[chunk[0]])
                await script(keys=[self._keys.shard(ns, shard)], args=[*args, records[chunk].tobytes()], client=pipe)
            metrics.REDIS_ROUND_TRIPS.inc()
            return list(await pipe.execute())

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
