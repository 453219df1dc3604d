"""What only the Redis backend has: its key layout, script loading, and a cluster's slots."""

from __future__ import annotations

import struct
import time
from dataclasses import astuple
from typing import Any

import numpy as np
import pytest
import redis.asyncio
from prometheus_client import REGISTRY

from service import metrics
from service.config import Settings
from service.index.base import Doc, Index, Kind
from service.index.factory import make_index
from service.index.keys import DOC_REF_LIMIT, Keys
from service.index.memory import MemoryIndex
from service.index.redis_index import PIPELINE_CALLS, RECORDS_PER_CALL, RedisIndex
from service.index.window import Window
from tests.conftest import ALL_BACKENDS
from tests.traffic import fp, words

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("settings", [b for b in ALL_BACKENDS if b != "embedded"], indirect=True),
]

NS = "00112233445566aa"
NOW = time.time()


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 128:
        out.append(n % 128 | 0x80)
        n //= 128
    return bytes([*out, n])


def redis_of(index: Index) -> RedisIndex:
    assert isinstance(index, RedisIndex)
    return index


async def flush_scripts(index: RedisIndex) -> None:
    """SCRIPT FLUSH on every node, each over its own connection."""
    client = index.client
    if not isinstance(client, redis.asyncio.RedisCluster):
        await client.script_flush()
        return
    await client.initialize()
    for node in client.get_primaries():
        async with redis.asyncio.Redis(host=node.host, port=int(node.port)) as one:
            await one.script_flush()


async def test_scripts_are_reloaded_after_a_flush_on_every_node(index: Index) -> None:
    """A restarted or promoted node has an empty script cache: NOSCRIPT is answered by loading."""
    r = redis_of(index)
    source = fp(words("argparse"))
    await r.insert(NS, [Doc(1, 1, Kind.PROMPT, source.values, source.offsets)], NOW)
    await flush_scripts(r)
    leaked = fp(words("argparse", 10, 80))
    hits = await r.insert(NS, [Doc(2, 2, Kind.RESPONSE, leaked.values, leaked.offsets)], NOW)
    assert [(h.tenant, h.doc) for h in hits] == [(1, 1)]
    await flush_scripts(r)
    assert all(x.entries for x in await r.lookup(NS, leaked.values, NOW))
    await flush_scripts(r)
    assert set((await r.tenant_refs(["fresh-tenant"])).values()) <= set(range(1, 100))


async def test_buckets_are_compact_listpacks(index: Index, settings: Settings) -> None:
    """Fields are 3 bytes folded from the bits the key does not imply; a typical entry is 8 bytes.
    Fingerprints that differ in one bit a plain truncation would drop keep fields of their own."""
    r = redis_of(index)
    values = np.array([0xA7B3000000000001 + (i << 8) for i in range(10)], dtype=np.uint64)
    values = np.concatenate([values, values ^ np.uint64(1 << 40)])
    offsets = np.arange(20, dtype=np.uint32) * 3 + 500
    await r.insert(NS, [Doc(123_456_789, 42, Kind.PROMPT, values, offsets)], NOW)
    gen = int(NOW // -(-settings.retention_seconds // (settings.index_generations - 1)))
    assert settings.index_bucket_bits == 16  # the bucket is the second byte, raw, as the key's last byte
    key = f"{Keys(settings.key_prefix).shard(NS, 0xA7)}:{gen}:".encode() + b"\xb3"
    client = r.client
    assert await client.object("encoding", key) in (b"listpack", "listpack")
    stored = await client.hgetall(key)
    assert len(stored) == 20
    rest = int(values[0]) & ((1 << 48) - 1)
    field = ((rest ^ (rest >> 24)) & 0xFFFFFF).to_bytes(3, "big")
    assert stored[field] == varint(42 * 8 + 1) + (123_456_789).to_bytes(4, "big") + varint(500)
    assert len(stored[field]) == 8
    assert 0 < await client.ttl(key) <= r._window.ttl_seconds


async def test_a_value_common_by_holders_stores_its_entries_after_a_marker(index: Index, settings: Settings) -> None:
    """'(' then its senders' entries and a mark for each tenant served it (keys.py): '(' is 40, a
    multiple of 8, which no entry starts with; marks are kept while the value fits a listpack value
    (HELD_VALUE_BYTES), later senders always, and '*' replaces it all once common_prompt_tenants (3)
    tenants sent it."""
    r = redis_of(index)
    values = np.array([0xA7B3000000000001], dtype=np.uint64)
    offsets = np.array([500], dtype=np.uint32)
    await r.insert(NS, [Doc(123_456_789, 42, Kind.PROMPT, values, offsets)], NOW)
    for tenant in range(100, 107):  # the eighth tenant makes it common
        await r.insert(NS, [Doc(tenant, tenant, Kind.RESPONSE, values, offsets + 1)], NOW)
    gen = int(NOW // settings.generation_seconds)
    key = f"{Keys(settings.key_prefix).shard(NS, 0xA7)}:{gen}:".encode() + b"\xb3"
    rest = int(values[0]) & ((1 << 48) - 1)
    field = ((rest ^ (rest >> 24)) & 0xFFFFFF).to_bytes(3, "big")

    def entry(tenant: int, ref: int, offset: int, kinds: int) -> bytes:
        return varint(tenant * 8 + kinds) + ref.to_bytes(4, "big") + varint(offset)

    sender = entry(42, 123_456_789, 500, 1)
    assert await r.client.hget(key, field) == b"(" + sender + b"".join(varint(t * 8 + 6) for t in range(100, 107))
    await r.insert(NS, [Doc(7, 107, Kind.RESPONSE, values, offsets)], NOW)
    await r.insert(NS, [Doc(8, 108, Kind.PROMPT, values, offsets + 2)], NOW)
    await r.insert(NS, [Doc(9, 100, Kind.PROMPT, values, offsets)], NOW)  # a recipient's chat sending it back
    marks = b"".join(varint(t * 8 + 6) for t in range(100, 108))
    assert await r.client.hget(key, field) == b"(" + sender + marks + entry(108, 8, 502, 1)
    for tenant in range(1000, 1100):  # tenant refs of two-byte marks: 15 more fit
        await r.insert(NS, [Doc(tenant, tenant, Kind.RESPONSE, values, offsets)], NOW)
    stored = await r.client.hget(key, field)
    assert stored == b"(" + sender + marks + entry(108, 8, 502, 1) + b"".join(
        varint(t * 8 + 6) for t in range(1000, 1015)
    )
    assert len(stored) == 63
    await r.insert(NS, [Doc(9, 109, Kind.PROMPT, values, offsets)], NOW)
    assert await r.client.hget(key, field) == b"*"
    await r.insert(NS, [Doc(10, 110, Kind.PROMPT, values, offsets)], NOW)
    assert await r.client.hget(key, field) == b"*"


async def test_doc_refs_wrap_before_two_to_the_32(index: Index, settings: Settings) -> None:
    r = redis_of(index)
    await r.client.set(Keys(settings.key_prefix).doc_seq, DOC_REF_LIMIT - 3)
    first = await r.new_doc_refs(5)
    assert first == 1
    assert await r.new_doc_refs(2) == 6


async def test_the_tenant_cache_is_bounded_least_recently_used_first(settings: Settings) -> None:
    """A key sending ever-new tenant names cannot grow a process's memory; refs stay stable across evictions."""
    r = redis_of(make_index(settings.model_copy(update={"tenant_cache_size": 3})))
    try:
        first = await r.tenant_refs(["a", "b", "c"])
        await r.tenant_refs(["a"])  # now the most recently used
        evicted = metrics.TENANT_CACHE_EVICTIONS._value.get()
        for batch in range(20):
            await r.tenant_refs([f"new-{batch}-{i}" for i in range(2)])
            assert r.tenant_cache_len <= 3
        assert metrics.TENANT_CACHE_EVICTIONS._value.get() - evicted == 40
        assert await r.tenant_refs(["a", "b", "c"]) == first  # from Redis again, the same refs
        assert r.tenant_cache_len == 3
        await r.tenant_refs(["new-19-0", "a"])
        second = await r.tenant_refs(["d"])
        assert r.tenant_cache_len == 3
        assert second["d"] not in first.values()
    finally:
        await r.close()


@pytest.mark.parametrize("bits", [8, 12, 20])
async def test_every_bucket_size_keeps_the_contract(settings: Settings, bits: int) -> None:
    """Other BLEEDWATCH_INDEX_BUCKET_BITS: different keys and fields, the same answers. (24 bits
    gives every shard a 2 MB filter: half a gigabyte of Redis for a text spread over all shards,
    which timed out on a busy machine; the one-shard test below covers 24.)"""
    index = make_index(settings.model_copy(update={"index_bucket_bits": bits}))
    try:
        source = fp(words("argparse"))
        await index.insert(NS, [Doc(1, 1, Kind.PROMPT, source.values, source.offsets)], NOW)
        leaked = fp(words("argparse", 10, 80))
        hits = await index.insert(NS, [Doc(2, 2, Kind.RESPONSE, leaked.values, leaked.offsets)], NOW)
        assert [(h.tenant, h.doc, h.count) for h in hits] == [
            (1, 1, len(set(leaked.values.tolist()) & set(source.values.tolist())))
        ]
        by_value: dict[int, int] = {}
        for value, offset in zip(source.values.tolist(), source.offsets.tolist(), strict=True):
            by_value.setdefault(value, offset)  # the first offset is the one kept
        for value, x in zip(leaked.values.tolist(), await index.lookup(NS, leaked.values, NOW), strict=True):
            assert x.entries is not None
            assert [(e.tenant, e.doc, e.offset) for e in x.entries if e.tenant == 1] == [(1, 1, by_value[value])]
    finally:
        await index.close()


@pytest.mark.parametrize("bits", [16, 24])
async def test_thousands_of_records_in_one_shard_are_read_in_chunks(
    settings: Settings, bits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Lua call reads the presence filters in chunks of 1,000 bits (Lua's unpack limit), at any filter size.
    A sender chooses its values and can put a whole text in one shard: a call still carries at most
    RECORDS_PER_CALL records (one call with them all held Redis past its 5 s script limit: BUSY for
    every client), and a pipeline at most PIPELINE_CALLS calls, which Redis runs back to back."""
    r = make_index(settings.model_copy(update={"index_bucket_bits": bits}))
    sent: list[list[int]] = []  # records of each call, per pipeline
    pipeline = RedisIndex._pipeline

    async def counting(self: RedisIndex, calls: Any) -> list[Any]:
        def records(keys: list[str], args: list[Any]) -> int:  # the u32 count of records per key
            (counts,) = [a for a in args if isinstance(a, bytes) and len(a) == 4 * len(keys)][:1]
            return sum(struct.unpack(f">{len(keys)}I", counts))

        sent.append([records(keys, args) for _, keys, args in calls])
        return await pipeline(self, calls)

    monkeypatch.setattr(RedisIndex, "_pipeline", counting)
    rng = np.random.default_rng(5)
    values = np.unique((rng.integers(0, 2**56, 2500, dtype=np.uint64)) | np.uint64(0x5A << 56))  # all in shard 5a
    offsets = np.arange(len(values), dtype=np.uint32) * 3
    await r.insert(NS, [Doc(1, 1, Kind.PROMPT, values, offsets)], NOW)
    hits = await r.insert(NS, [Doc(2, 2, Kind.RESPONSE, values, offsets)], NOW)
    assert [(h.tenant, h.doc, h.count) for h in hits] == [(1, 1, len(values))]
    found = await r.lookup(NS, values, NOW)
    assert all(x.entries is not None and [e.tenant for e in x.entries] == [1, 2] for x in found)
    assert [x.entries[0].offset for x in found if x.entries] == offsets.tolist()
    assert max(n for calls in sent for n in calls) == RECORDS_PER_CALL
    assert max(len(calls) for calls in sent) <= PIPELINE_CALLS
    await r.close()


@pytest.mark.parametrize("bits", [16, 20])
async def test_every_index_key_expires_with_its_generation(settings: Settings, bits: int) -> None:
    """Every bucket and filter a write creates gets the generation's TTL: small and large batches,
    new fingerprints and ones the index holds already, few buckets a shard and many."""
    index = make_index(settings.model_copy(update={"index_bucket_bits": bits}))
    assert isinstance(index, RedisIndex)
    try:
        rng = np.random.default_rng(bits)
        seen = np.empty(0, dtype=np.uint64)
        for ref, size in enumerate((1, 3, 40, 30_000, 200, 50_000), start=1):
            fresh = rng.integers(0, 2**64, size, dtype=np.uint64)
            values = np.concatenate([fresh, seen[: size // 2]])  # some new to this tenant, some not
            offsets = np.arange(len(values), dtype=np.uint32)
            await index.insert(NS, [Doc(ref, ref % 3 + 1, Kind.PROMPT, values, offsets)], NOW)
            seen = np.concatenate([seen, fresh])
        assert all(x.entries != () for x in await index.lookup(NS, seen, NOW))  # held, or common
        client = index.client
        keys = [k async for k in client.scan_iter(match=f"{settings.key_prefix}:{{{NS}:*", count=1000)]
        assert len(keys) > 256  # buckets and filters of every shard
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.ttl(k)
        ttls = await pipe.execute()
        assert all(0 < t <= index._window.ttl_seconds for t in ttls)
    finally:
        await index.close()


async def primaries(index: RedisIndex, settings: Settings) -> list[redis.asyncio.Redis]:
    """One client per primary (the single node, or every cluster master), each over its own connection."""
    client = index.client
    if not isinstance(client, redis.asyncio.RedisCluster):
        assert settings.redis_url is not None
        return [redis.asyncio.Redis.from_url(settings.redis_url)]
    await client.initialize()
    return [redis.asyncio.Redis(host=n.host, port=int(n.port)) for n in client.get_primaries()]


async def test_stats_read_maxmemory_of_every_primary_with_the_memory(index: Index, settings: Settings) -> None:
    """bleedwatch_index_memory_max_bytes: maxmemory summed over the primaries, from the same INFO memory
    (still two round trips); 0 while any primary has none, since the ratio would then mean nothing.
    bleedwatch_index_memory_fullest_ratio: the primary nearest its own limit, which refuses writes first."""
    r = redis_of(index)
    nodes = await primaries(r, settings)
    try:
        before = [int((await n.info("memory"))["maxmemory"]) for n in nodes]
        used = [int((await n.info("memory"))["used_memory"]) for n in nodes]
        limits = [u + (1 << 30) * (i + 1) for i, u in enumerate(used)]  # far above use: writes still pass
        try:
            for node, limit in zip(nodes, limits, strict=True):
                await node.config_set("maxmemory", limit)
            trips = REGISTRY.get_sample_value("bleedwatch_backend_round_trips_total", {"backend": "redis"})
            stats = await r.stats()
            after = REGISTRY.get_sample_value("bleedwatch_backend_round_trips_total", {"backend": "redis"})
            assert stats.memory_max_bytes == sum(limits)
            assert 0 < stats.memory_bytes < stats.memory_max_bytes
            assert (after or 0) - (trips or 0) == 2
            # The first primary has the least room to spare: its ratio is the fullest, not the sum's.
            # Other tests' writes to the shared Redis (an xdist worker beside this one) move used_memory
            # between reads: the ratio lies between the ones read before and after.
            later = int((await nodes[0].info("memory"))["used_memory"])
            low, high = sorted((used[0], later))
            assert low / limits[0] * 0.95 <= stats.memory_fullest <= high / limits[0] * 1.05
            assert stats.memory_fullest >= stats.memory_bytes / stats.memory_max_bytes
            await nodes[-1].config_set("maxmemory", 0)
            assert (await r.stats()).memory_max_bytes == 0
            if len(nodes) > 1:  # the others still have a limit: the fullest of them is still known
                assert (await r.stats()).memory_fullest > 0
        finally:
            for node, limit in zip(nodes, before, strict=True):
                await node.config_set("maxmemory", limit)
    finally:
        for node in nodes:
            await node.aclose()


@pytest.mark.parametrize("seed", range(4))
async def test_the_scripts_and_the_embedded_index_agree_on_random_traffic(
    index: Index, settings: Settings, seed: int
) -> None:
    """insert.lua and lookup.lua against memory.py, the same logic twice: random prompts and answers of
    a dozen tenants over a few values, processed out of order, past common by holders and by senders,
    with chats sending back what they were served. Hits and lookups must be the same."""
    rng = np.random.default_rng(seed)
    values = np.array([0xA7B3000000000001 + (i << 20) for i in range(6)], dtype=np.uint64)
    for run in range(25):
        ns = f"{seed:02x}{run:014x}"
        memory = MemoryIndex(
            Window(settings.retention_seconds, settings.index_generations),
            settings.common_prompt_tenants,
            settings.common_tenants,
        )
        docs = []
        for ref in range(1, int(rng.integers(4, 40))):
            chosen = np.sort(rng.choice(len(values), size=int(rng.integers(1, len(values) + 1)), replace=False))
            offsets = rng.integers(0, 300, size=len(chosen)).astype(np.uint32)
            kind = Kind.PROMPT if rng.random() < 0.4 else Kind.RESPONSE
            docs.append(Doc(ref, int(rng.integers(1, 20)), kind, values[chosen], offsets))
        order = rng.permutation(len(docs)) if rng.random() < 0.5 else np.arange(len(docs))
        # Over the generations of the window, now and then one behind (a replica's clock).
        gens = np.sort(rng.integers(0, settings.index_generations, size=len(docs)))
        gens = np.maximum(0, gens - (rng.random(len(docs)) < 0.1))
        for i, gen in zip(order.tolist(), gens.tolist(), strict=True):
            now = NOW + gen * settings.generation_seconds
            got = await index.insert(ns, [docs[i]], now)
            want = await memory.insert(ns, [docs[i]], now)
            assert sorted(map(astuple, got)) == sorted(map(astuple, want)), (seed, run, i)
        end = NOW + int(gens.max()) * settings.generation_seconds
        got_lookup = await index.lookup(ns, values, end)
        want_lookup = await memory.lookup(ns, values, end)
        for g, w in zip(got_lookup, want_lookup, strict=True):
            assert (g.entries is None) == (w.entries is None), (seed, run)
            assert sorted(g.entries or ()) == sorted(w.entries or ()), (seed, run)
            assert sorted(g.senders or ()) == sorted(w.senders or ()), (seed, run)
            assert (g.senders is None) == (w.senders is None), (seed, run)
