"""End-to-end ingest throughput: a load process posting to a running service on Redis + PostgreSQL.

    .venv/bin/python bench/ingest.py --exchanges 4000 --batch 100 --concurrency 4 --workers 1

Starts ``bleedwatch serve`` on loopback (its own Redis key prefix and PostgreSQL schema),
fingerprints real stdlib text with the SDK *before* timing, then posts batches and prints
exchanges/s, fingerprints/s and batch latency percentiles, beside Redis' own ceiling measured
with ``redis-benchmark -P 64`` in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import docstrings, text
from bench.service import REDIS_URL, running_service
from service.sdk.exchange import fingerprint_exchange


def traffic(n: int, tenants: int, long_share: float, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    corpus = docstrings()
    key = secrets.token_bytes(32)
    out = []
    for i in range(n):
        long = rng.random() < long_share
        prompt = text(rng, corpus, rng.randint(20_000, 50_000) if long else rng.randint(200, 1500))
        response = text(rng, corpus, rng.randint(80, 400))
        tenant = f"tenant-{rng.randrange(tenants)}"
        out.append(
            fingerprint_exchange(
                prompt,
                response,
                key=key,
                tenant=tenant,
                request_id=f"bench-{i}",
                model="bench-model",
                meta={"deployment": "bench", "node": "n1"},
            )
        )
    return out


def fingerprints(exchanges: list[dict[str, Any]]) -> int:
    return sum(len(ex[side]["fingerprints"]) * 3 // 4 // 8 for ex in exchanges for side in ("prompt", "response"))


def redis_ceiling() -> float:
    out = subprocess.run(
        ["redis-benchmark", "-u", REDIS_URL, "-P", "64", "-n", "500000", "-t", "set", "-q"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    match = re.search(r"SET: ([\d.]+) requests per second", out)
    return float(match.group(1)) if match else float("nan")


async def post_all(url: str, token: str, batches: list[bytes], concurrency: int) -> list[float]:
    latencies: list[float] = []
    queue = list(reversed(batches))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:

        async def worker() -> None:
            while queue:
                body = queue.pop()
                start = time.perf_counter()
                resp = await client.post("/v1/exchanges", content=body)
                latencies.append(time.perf_counter() - start)
                if resp.status_code != 202:
                    raise RuntimeError(f"{resp.status_code}: {resp.text[:200]}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exchanges", type=int, default=4000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--tenants", type=int, default=50)
    p.add_argument("--long-share", type=float, default=0.01)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    print(f"fingerprinting {args.exchanges} exchanges ...", flush=True)
    t0 = time.perf_counter()
    exchanges = traffic(args.exchanges, args.tenants, args.long_share, args.seed)
    print(f"  SDK: {time.perf_counter() - t0:.1f} s")
    batches = [orjson.dumps({"exchanges": exchanges[i : i + args.batch]}) for i in range(0, len(exchanges), args.batch)]
    total_fps = fingerprints(exchanges)

    with running_service(workers=args.workers) as service:
        token = service.key("ingest")
        start = time.perf_counter()
        latencies = asyncio.run(post_all(service.url, token, batches, args.concurrency))
        elapsed = time.perf_counter() - start
    ceiling = redis_ceiling()
    latencies.sort()
    fps_rate = total_fps / elapsed
    print(
        f"exchanges {args.exchanges} in {len(batches)} batches of {args.batch}, concurrency {args.concurrency}, "
        f"{args.workers} worker(s)"
    )
    print(f"  {args.exchanges / elapsed:,.0f} exchanges/s, {fps_rate:,.0f} fingerprints/s ({total_fps:,} in all)")
    print(
        f"  batch latency p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {latencies[int(0.99 * (len(latencies) - 1))] * 1000:.1f} ms"
    )
    print(
        f"  reference: redis-benchmark -P 64 SET {ceiling:,.0f} ops/s; "
        f"bleedwatch indexes {fps_rate / ceiling:.2f} fingerprints per Redis SET of that ceiling"
    )


if __name__ == "__main__":
    main()
