"""Redis memory per indexed fingerprint, against one string key per fingerprint, in the same run.

    .venv/bin/python bench/memory.py --fingerprints 5000000

Starts its own redis-server on a free loopback port (never the shared one) with the hash
encoding limits the index is sized for, stated on the command line so the figures do not
depend on a redis.conf: ``hash-max-listpack-entries 128`` and ``hash-max-listpack-value 64``
(Redis 7's defaults). Then, each time from an empty server:

1. the reference: one string key per fingerprint with a TTL, ``SET <prefix>:fp:<key id>:<8 bytes>
   <13-byte entry> EX <ttl>``, the obvious layout;
2. the index: ``RedisIndex.insert`` of realistic batches (chat-sized prompts and responses from
   a pool of tenants, a share of boilerplate several tenants send, which becomes common, and
   responses that repeat their own prompt), everything that makes the index's answers right:
   tenant ownership, first doc and offset, kinds, recency (the generation) and the cross-tenant
   count (the entries and the common marker).

Prints ``used_memory`` after minus before, per fingerprint inserted and per stored field, the
ratio to the reference, how many hashes left the listpack encoding, and the insert rate.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import TypedDict

import numpy as np
import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bleedwatch.fingerprint.scheme import Params
from service.index.base import Doc, DocMeta, Kind
from service.index.keys import Keys
from service.index.redis_index import RedisIndex
from service.index.window import Window
from tests.redis_servers import RedisServer

NS = "00112233445566aa"
LISTPACK_ENTRIES = 128
LISTPACK_VALUE = 64


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def reference(client: redis.Redis, count: int, ttl: int, seed: int, prefix: bytes) -> float:
    """Bytes per fingerprint with one string key each: ``prefix`` + 8 raw bytes -> one 13-byte entry."""
    rng = np.random.default_rng(seed)
    client.flushall()
    before = used_memory(client)
    entry = b"\x00\x00\x00\x07\x00\x01\x02\x03\x00\x00\x01\x00\x01"  # tenant u32, doc u32, offset u32, kinds
    for start in range(0, count, 20_000):
        raw = rng.integers(0, 2**64, min(20_000, count - start), dtype=np.uint64).astype(">u8").tobytes()
        pipe = client.pipeline(transaction=False)
        for i in range(0, len(raw), 8):
            pipe.set(prefix + raw[i : i + 8], entry, ex=ttl)
        pipe.execute()
    return (used_memory(client) - before) / count


def traffic(
    rng: np.random.Generator, exchanges: int, tenants: int, first_ref: int
) -> list[tuple[int, int, Kind, np.ndarray, np.ndarray]]:
    """Docs of ``exchanges`` chat exchanges: (ref, tenant, kind, values, offsets)."""
    boilerplate = [rng.integers(0, 2**64, 40, dtype=np.uint64) for _ in range(300)]
    out = []
    ref = first_ref
    for _ in range(exchanges):
        tenant = int(rng.integers(1, tenants + 1))
        prompt = rng.integers(0, 2**64, int(rng.integers(60, 430)), dtype=np.uint64)
        if rng.random() < 0.3:  # a system prompt or template shared with other tenants
            prompt = np.concatenate([boilerplate[int(rng.integers(len(boilerplate)))], prompt])
        response = rng.integers(0, 2**64, int(rng.integers(20, 115)), dtype=np.uint64)
        if rng.random() < 0.2:  # the answer quotes the question
            response = np.concatenate([response, prompt[-20:]])
        for kind, values in ((Kind.PROMPT, prompt), (Kind.RESPONSE, response)):
            offsets = np.cumsum(rng.integers(1, 7, len(values))).astype(np.uint32)
            out.append((ref, tenant, kind, values, offsets))
            ref += 1
    return out


class IndexMemory(TypedDict):
    """What ``index_memory`` measured: byte counts, per-fingerprint figures and the script's inner commands."""

    docs_bytes: int
    exchanges: int
    response_fps: int
    inserted: int
    bytes: int
    per_fp: float
    per_field: float
    fields: int
    keys: int
    not_listpack: int
    filters: int
    inner: dict[str, tuple[float, float]]  # command -> (calls, microseconds) per fingerprint inserted
    rate: float
    lua_rate: float


async def index_memory(url: str, fingerprints: int, tenants: int, bucket_bits: int, seed: int) -> IndexMemory:
    client = redis.asyncio.Redis.from_url(url)
    await client.flushall()
    await client.config_resetstat()  # our own server: the figures below are the index's alone
    sync = redis.Redis.from_url(url)
    window = Window(3600, 4)
    index = RedisIndex(client, Keys("bw"), window, 3, 8, bucket_bits)
    rng = np.random.default_rng(seed)
    before = used_memory(sync)
    inserted = 0
    elapsed = 0.0
    now = time.time()
    ref = 2**31  # doc refs of a long-running deployment: 4 bytes whatever their size
    while inserted < fingerprints:
        docs = [Doc(r, t, k, v, o) for r, t, k, v, o in traffic(rng, 100, tenants, ref)]
        ref += len(docs)
        start = time.perf_counter()
        await index.insert(NS, docs, now)
        elapsed += time.perf_counter() - start
        inserted += sum(len(d.values) for d in docs)
    delta = used_memory(sync) - before
    stats = sync.info("commandstats")
    lua = stats.get("cmdstat_evalsha", {"usec": 0})
    inner = {
        k.removeprefix("cmdstat_"): (int(v["calls"]) / inserted, int(v["usec"]) / inserted)
        for k, v in stats.items()
        if k.removeprefix("cmdstat_") in ("hget", "hset", "bitfield", "bitfield_ro", "expireat", "exists", "set")
    }
    fields = 0
    not_listpack = 0
    keys = 0
    filters = 0
    for key in sync.scan_iter(match="bw:{*", count=5000):
        if sync.type(key) != b"hash":
            filters += int(sync.memory_usage(key) or 0)
            continue
        keys += 1
        fields += sync.hlen(key)
        if sync.object("encoding", key) != b"listpack":
            not_listpack += 1
    docs_bytes, exchanges, response_fps = await docs_memory(index, sync, rng, tenants, now)
    await index.close()
    sync.close()
    return {
        "docs_bytes": docs_bytes,
        "exchanges": exchanges,
        "response_fps": response_fps,
        "inserted": inserted,
        "bytes": delta,
        "per_fp": delta / inserted,
        "per_field": delta / fields,
        "fields": fields,
        "keys": keys,
        "not_listpack": not_listpack,
        "filters": filters,
        "inner": inner,
        "rate": inserted / elapsed,
        "lua_rate": inserted / (int(lua["usec"]) / 1e6) if int(lua["usec"]) else float("nan"),
    }


async def docs_memory(
    index: RedisIndex, sync: redis.Redis, rng: np.random.Generator, tenants: int, now: float
) -> tuple[int, int, int]:
    """What the rest of an exchange costs: its two documents' metadata and its idempotency mark.

    Prompts keep a small JSON head; responses also keep their fingerprints and offsets (12 bytes
    each), so a late-arriving source can re-check them. Measured on 20,000 exchanges.
    """
    before = used_memory(sync)
    exchanges = response_fps = 0
    ref = 1
    for _ in range(200):
        metas = {}
        keys = []
        for r, t, k, v, o in traffic(rng, 100, tenants, ref):
            ref = r + 1
            keep = k == Kind.RESPONSE
            response_fps += len(v) if keep else 0
            metas[r] = DocMeta(
                tenant=f"tenant-{t}",
                request_id=f"gw-eu-1:{r:012d}",
                kind=k,
                model="some-model-70b-instruct",
                ts=now,
                token_count=int(o[-1]) + 4 if len(o) else 0,
                context={"deployment": "pd-eu-1", "node": "decode-07", "prompt_tokens": 1234},
                params=Params(),
                values=v if keep else None,
                offsets=o if keep else None,
            )
            if keep:
                keys.append(f"{len(str(t))}:tenant-{t}:gw-eu-1:{r:012d}")
        await index.put_docs(NS, metas, now)
        await index.mark_done(keys, now)
        exchanges += len(keys)
    return used_memory(sync) - before, exchanges, response_fps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fingerprints", type=int, default=5_000_000)
    p.add_argument("--reference", type=int, default=2_000_000, help="string keys for the reference layout")
    p.add_argument("--tenants", type=int, default=1000)
    p.add_argument("--bucket-bits", type=int, default=16, help="BLEEDWATCH_INDEX_BUCKET_BITS")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bleedwatch-bench-memory-") as tmp:
        server = RedisServer(
            Path(tmp),
            args=(
                "--hash-max-listpack-entries",
                str(LISTPACK_ENTRIES),
                "--hash-max-listpack-value",
                str(LISTPACK_VALUE),
            ),
        )
        server.start()
        try:
            sync = redis.Redis.from_url(server.url)
            version = sync.info("server")["redis_version"]
            bare = reference(sync, args.reference, 3600, args.seed, b"")
            named = reference(sync, args.reference, 3600, args.seed, f"bw:fp:{NS}:".encode())
            sync.close()
            got = asyncio.run(index_memory(server.url, args.fingerprints, args.tenants, args.bucket_bits, args.seed))
        finally:
            server.kill()
    print(
        f"Redis {version}, hash-max-listpack-entries {LISTPACK_ENTRIES}, hash-max-listpack-value {LISTPACK_VALUE}, "
        f"bucket bits {args.bucket_bits}"
    )
    print(
        f"  reference, one string key per fingerprint with a TTL and a 13-byte value: {bare:.1f} bytes per "
        f"fingerprint with the bare 8-byte fingerprint as the key, {named:.1f} with a prefix and key id ({len(NS) + 7} "
        "more bytes)"
    )
    ref = bare
    print(
        f"  index: {got['inserted']:,.0f} fingerprints inserted, {got['fields']:,.0f} fields in {got['keys']:,.0f} "
        f"hashes ({got['fields'] / got['keys']:.0f} per hash, {got['not_listpack']:.0f} not listpack)"
    )
    print(
        "  commands inside the script, per fingerprint: "
        + ", ".join(f"{k} {calls:.2f} calls {usec:.2f} us" for k, (calls, usec) in got["inner"].items())
    )
    print(f"  of which presence filters: {got['filters'] / got['inserted']:.1f} bytes per fingerprint")
    print(
        f"  index: {got['per_fp']:.1f} bytes per fingerprint inserted ({got['per_field']:.1f} per stored field), "
        f"{ref / got['per_fp']:.1f}x smaller than the bare reference"
    )
    per_exchange = got["docs_bytes"] / got["exchanges"]
    print(
        f"  per exchange besides the index: {per_exchange:,.0f} bytes (two documents' metadata, the response's "
        f"{got['response_fps'] / got['exchanges']:.0f} fingerprints and offsets, the idempotency mark)"
    )
    print(
        f"  insert rate, one client: {got['rate']:,.0f} fingerprints/s; Redis' own time in the script "
        f"(INFO commandstats): {got['lua_rate']:,.0f} fingerprints per second of Redis CPU"
    )


if __name__ == "__main__":
    main()
