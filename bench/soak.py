"""Soak: a fixed offered load for minutes, with a short retention; memory must level off.

    .venv/bin/python bench/soak.py --minutes 10 --rate 60000

``bleedwatch serve`` on a Redis of its own (a redis-server started on a free loopback port, so
its memory and key count are the index's alone) and the shared PostgreSQL, with
``BLEEDWATCH_RETENTION_SECONDS=60`` (four
generations of 20 s: keys live at most 100 s), fed open-loop at ``--rate`` fingerprints/s in
batches of ``--batch`` exchanges. Traffic is bench/load.py's chat mix; to keep it fresh for ten
minutes without fingerprinting millions of texts first, each round re-keys a pool of
fingerprinted exchanges (every fingerprint XOR-ed with a per-round 64-bit constant, new request
ids), which keeps their structure (sizes, offsets, shared and leaked spans) and makes every
round's fingerprints new to the index.

Every ``--sample-seconds`` it records the service workers' RSS, Redis' ``used_memory`` and key
count, the batches answered and any that were not 202, and the batches waiting in the ingest
queue (answers come once a batch is queued, as the SDK asks: a queue that stays short is
processing keeping up); at the end it prints the samples and
the change of each figure over the part of the run after the retention window (first the window
fills, then it must stay flat). Not part of CI.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import redis
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.load import Mix, Poster, chat_texts, fingerprint_all, fingerprint_count, percentile, process_tree
from bench.service import running_service
from service.index.keys import Keys

RETENTION_SECONDS = 60
_POOL: list[dict[str, Any]] = []


def _init(pool: list[dict[str, Any]]) -> None:
    _POOL[:] = pool


def _rekey(values: str, salt: np.uint64) -> str:
    arr = np.frombuffer(base64.b64decode(values), dtype="<u8") ^ salt
    return base64.b64encode(arr.astype("<u8").tobytes()).decode()


def round_batches(r: int, batch: int) -> list[tuple[bytes, int]]:
    """Round ``r`` of the pool, re-keyed: (body, fingerprints) per batch."""
    salt = np.uint64((r + 1) * 0x9E3779B97F4A7C15 % 2**64)
    out = []
    now = time.time()
    exchanges = []
    for ex in _POOL:
        fresh = dict(ex)
        fresh["request_id"] = f"{ex['request_id']}-r{r}"
        fresh["ts"] = now
        for side in ("prompt", "response"):
            fresh[side] = dict(ex[side]) | {"fingerprints": _rekey(ex[side]["fingerprints"], salt)}
        exchanges.append(fresh)
    for i in range(0, len(exchanges), batch):
        part = exchanges[i : i + batch]
        out.append((orjson.dumps({"exchanges": part}), sum(fingerprint_count(e) for e in part)))
    return out


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--rate", type=float, default=60_000.0, help="offered fingerprints/s")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--pool", type=int, default=3000, help="exchanges fingerprinted once and re-keyed each round")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sample-seconds", type=float, default=20.0)
    p.add_argument(
        "--bucket-bits",
        type=int,
        default=14,
        help="sized for ~80 fields a bucket at the default rate (docs/capacity.md)",
    )
    args = p.parse_args()

    pool = fingerprint_all(chat_texts(args.pool, Mix(long_share=0.005), 11, prefix="soak"))
    print(f"pool: {len(pool)} exchanges, {sum(fingerprint_count(e) for e in pool):,} fingerprints a round", flush=True)
    samples: list[dict[str, float]] = []
    latencies: list[float] = []
    errors: dict[int, int] = {}
    with (
        running_service(
            workers=args.workers,
            own_redis=True,
            retention_seconds=str(RETENTION_SECONDS),
            index_bucket_bits=str(args.bucket_bits),
        ) as service,
        ProcessPoolExecutor(1, initializer=_init, initargs=(pool,)) as prep,
    ):
        port = int(service.url.rsplit(":", 1)[1])
        token = service.key("ingest")
        pids = process_tree(service.pid)
        rclient = redis.Redis.from_url(service.redis_url)
        queue_key = Keys(service.env["BLEEDWATCH_KEY_PREFIX"]).queue

        def index_keys() -> int:
            return int(rclient.dbsize())

        async def run() -> None:
            end = time.perf_counter() + args.minutes * 60
            start = time.perf_counter()
            sent_fps = 0
            next_sample = start
            tasks: set[asyncio.Task[None]] = set()
            loop = asyncio.get_running_loop()
            r = 0
            upcoming = loop.run_in_executor(prep, round_batches, r, args.batch)
            async with Poster("127.0.0.1", port, token, connections=32) as poster:

                async def one(body: bytes, scheduled: float) -> None:
                    status, _ = await poster.post(body)
                    latencies.append(time.perf_counter() - scheduled)
                    if status != 202:
                        errors[status] = errors.get(status, 0) + 1

                while time.perf_counter() < end:
                    batches = await upcoming
                    r += 1
                    upcoming = loop.run_in_executor(prep, round_batches, r, args.batch)
                    for body, fps in batches:
                        if time.perf_counter() >= end:
                            break
                        scheduled = start + sent_fps / args.rate
                        delay = scheduled - time.perf_counter()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        task = asyncio.create_task(one(poster.request(body), scheduled))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                        sent_fps += fps
                        if time.perf_counter() >= next_sample:
                            info = rclient.info("memory")
                            samples.append(
                                {
                                    "t": time.perf_counter() - start,
                                    "rss_mb": rss_mb(pids),
                                    "redis_mb": int(info["used_memory"]) / 1e6,
                                    "keys": await asyncio.to_thread(index_keys),
                                    "queued": int(rclient.xlen(queue_key)),
                                    "batches": len(latencies),
                                    "errors": sum(errors.values()),
                                    "fps": sent_fps,
                                }
                            )
                            s = samples[-1]
                            print(
                                f"  {s['t']:6.0f} s  service RSS {s['rss_mb']:6.0f} MB  Redis {s['redis_mb']:7.1f} MB "
                                f"{s['keys']:8.0f} keys  {s['batches']:7.0f} batches  {s['queued']:4.0f} queued  "
                                f"errors {s['errors']:.0f}",
                                flush=True,
                            )
                            next_sample += args.sample_seconds
                await asyncio.gather(*tasks)

        uvloop.run(run())
    latencies.sort()
    window = RETENTION_SECONDS * 4 / 3 + 2 * RETENTION_SECONDS / 3  # filled, plus the keys' slack
    late = [s for s in samples if s["t"] >= window]
    print(
        f"{args.minutes:.0f} min at {args.rate:,.0f} fingerprints/s offered, batches of {args.batch}, "
        f"retention {RETENTION_SECONDS} s: {len(latencies):,} batches, errors {errors or 0}"
    )
    print(
        f"  batch latency p50 {percentile(latencies, 0.5) * 1e3:.1f} ms, p99 {percentile(latencies, 0.99) * 1e3:.1f} ms"
    )
    if len(late) >= 2:
        first, last = late[0], late[-1]
        for name, unit in (("rss_mb", "MB"), ("redis_mb", "MB"), ("keys", "keys"), ("queued", "batches queued")):
            values = [s[name] for s in late]
            print(
                f"  after {window:.0f} s: {name} from {first[name]:,.1f} to {last[name]:,.1f} {unit} "
                f"(min {min(values):,.1f}, max {max(values):,.1f})"
            )


if __name__ == "__main__":
    main()
