"""End-to-end ingest: a load process posting to a running service on Redis + PostgreSQL, matching on.

    .venv/bin/python bench/ingest.py                         # as fast as it goes (closed loop)
    .venv/bin/python bench/ingest.py --rate 50000 --batch 20 # latency at a fixed offered load

Starts ``bleedwatch serve`` on loopback (a redis-server of its own, unless ``--shared-redis``, and
its own PostgreSQL schema, removed afterwards), fingerprints realistic chat traffic with the SDK
*before* timing (bench/load.py: shared system prompts, multi-turn resends, a share of
long-context prompts, a few real leaks), then posts batches from this process over keep-alive
HTTP/1.1 connections.

Closed loop: ``--concurrency`` batches in flight, each sent when one returns; the figure is the
sustained rate. Open loop (``--rate`` fingerprints/s): batches are sent on a fixed schedule
whatever the answers, and latency is counted from the scheduled send time, so a stalled server
shows up as latency rather than as a politely slower client.

Batches are sent as the SDK sends them, with ``Prefer: respond-async``: the answer comes once the
batch is durably queued, and the service's workers index and match it after. The sustained rate
counts until the queue is empty, so it is the processing rate; the batch latency is what the
gateway waits. ``--wait`` sends without the preference: each answer waits for processing.
``--split N``: the API (``--workers`` uvicorn workers) processes nothing (BLEEDWATCH_INGEST_WORKERS=0)
and N ``bleedwatch work`` processes do; with ``--rate``, what matching beside the API costs its answers.

Prints exchanges/s, fingerprints/s, batch latency p50/p99, the findings the leaks produced, the
CPU each party used (service workers, Redis, this load generator) and, in the same run,
Redis' own ceiling from ``redis-benchmark -P 64``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis
import uvloop
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.load import Mix, Poster, batches, chat_texts, cpu_seconds, fingerprint_all, percentile, process_tree
from bench.service import redis_nodes, running_service
from bleedwatch.fingerprint.scheme import DEFAULT_PARAMS
from service.index.keys import Keys


def redis_ceiling(url: str, cluster: bool) -> float:
    """``redis-benchmark -P 64 SET`` against the server; with ``cluster``, against all its masters."""
    host, port = url.removeprefix("redis://").split("/")[0].rsplit(":", 1)
    where = ["--cluster", "-h", host, "-p", port] if cluster else ["-u", url]
    return redis_benchmark_sets(*where, "-P", "64", "-n", "1000000")


def redis_benchmark_sets(*args: str) -> float:
    """SET/s that ``redis-benchmark`` with these arguments reports."""
    out = subprocess.run(
        ["redis-benchmark", *args, "-t", "set", "-q"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    match = re.findall(r"SET: ([\d.]+) requests per second", out)
    return float(match[-1]) if match else float("nan")


def command_usec(nodes: list[redis.Redis]) -> dict[str, tuple[int, int]]:
    """Calls and microseconds per command, summed over the nodes."""
    out: dict[str, tuple[int, int]] = {}
    for node in nodes:
        for k, v in node.info("commandstats").items():
            calls, usec = out.get(k, (0, 0))
            out[k] = (calls + int(v["calls"]), usec + int(v["usec"]))
    return out


def redis_cpu(nodes: list[redis.Redis]) -> list[float]:
    """CPU seconds each Redis server (each master of a cluster) has used."""
    return [float(i["used_cpu_user"]) + float(i["used_cpu_sys"]) for i in (n.info("cpu") for n in nodes)]


def load_process(
    share: list[tuple[bytes, int, int]], port: int, token: str, args: argparse.Namespace, start: Any, out: Any
) -> None:
    """One of ``--load-processes``: its share of the batches, on connections of its own, from ``start``."""

    async def run() -> list[float]:
        n = args.load_processes
        connections = max(1, max(args.concurrency, args.connections) // n)
        async with Poster("127.0.0.1", port, token, connections, respond_async=not args.wait) as poster:
            wire = [(poster.request(body), count, fps) for body, count, fps in share]
            start.wait()
            if args.rate > 0:
                return await open_loop(poster, wire, args.rate / n)
            return await closed_loop(poster, wire, max(1, args.concurrency // n))

    out.send(uvloop.run(run()))
    out.close()


async def several(
    timed: list[tuple[bytes, int, int]], port: int, token: str, args: argparse.Namespace
) -> tuple[list[float], float]:
    """``--load-processes`` > 1: the timed batches dealt round-robin to that many forked processes,
    released together; their latencies, and the CPU seconds they used."""
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(args.load_processes + 1)
    procs, pipes = [], []
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for i in range(args.load_processes):
        mine = timed[i :: args.load_processes]
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=load_process, args=(mine, port, token, args, start, send))  # forked: not copied
        proc.start()
        procs.append(proc)
        pipes.append(receive)
    await asyncio.to_thread(start.wait)
    latencies: list[float] = []
    for receive in pipes:
        latencies += await asyncio.to_thread(receive.recv)
    for proc in procs:
        proc.join()
        if proc.exitcode != 0:
            raise RuntimeError(f"a load process failed (exit {proc.exitcode})")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return latencies, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


SLOW: list[tuple[float, float, int]] = []  # open loop: (latency, scheduled at, fingerprints) of each batch


async def closed_loop(poster: Poster, requests: list[tuple[bytes, int, int]], concurrency: int) -> list[float]:
    latencies: list[float] = []
    queue = list(reversed(requests))

    async def worker() -> None:
        while queue:
            body, _, _ = queue.pop()
            start = time.perf_counter()
            status, answer = await poster.post(body)
            latencies.append(time.perf_counter() - start)
            if status != 202:
                raise RuntimeError(f"{status}: {answer[:300]!r}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def open_loop(poster: Poster, requests: list[tuple[bytes, int, int]], rate: float) -> list[float]:
    """Batch i goes out when the fingerprints before it, at ``rate``, would have been sent."""
    latencies: list[float] = []
    tasks = []
    t0 = time.perf_counter()
    sent_fps = 0

    async def one(body: bytes, scheduled: float, fps: int) -> None:
        status, answer = await poster.post(body)
        latencies.append(time.perf_counter() - scheduled)
        SLOW.append((time.perf_counter() - scheduled, scheduled - t0, fps))
        if status != 202:
            raise RuntimeError(f"{status}: {answer[:300]!r}")

    for body, _, fps in requests:
        scheduled = t0 + sent_fps / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(body, scheduled, fps)))
        sent_fps += fps
    await asyncio.gather(*tasks)
    return latencies


async def drained(client: redis.Redis | redis.RedisCluster, keys: list[str]) -> None:
    """Until the service's ingest queue (every shard of it) is empty: every accepted batch processed."""
    while True:
        if not any(client.xlen(key) for key in keys):
            return
        await asyncio.sleep(0.01)


def queue_seconds(urls: list[str]) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of the queue-to-processed histogram, summed over the processes that process."""
    buckets: dict[float, float] = {}
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
            if family.name == "bleedwatch_ingest_queue_seconds":
                for sample in family.samples:
                    if sample.name.endswith("_bucket"):
                        le = float(sample.labels["le"])
                        buckets[le] = buckets.get(le, 0.0) + sample.value
    return sorted(buckets.items())


def bucket_quantile(before: list[tuple[float, float]], after: list[tuple[float, float]], q: float) -> float:
    """The bucket bound below which ``q`` of the observations between the two scrapes fall."""
    counts = dict(before)
    delta = [(le, n - counts.get(le, 0.0)) for le, n in after]
    total = delta[-1][1] if delta else 0.0
    return next((le for le, n in delta if total and n >= q * total), float("nan"))


def all_findings(url: str, token: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        while True:
            params: dict[str, Any] = {"limit": 500} | ({"cursor": cursor} if cursor else {})
            page = client.get("/v1/findings", params=params).json()
            items.extend(page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                return items


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--exchanges", type=int, default=12_000)
    p.add_argument("--batch", type=int, default=100, help="exchanges per batch")
    p.add_argument("--concurrency", type=int, default=4, help="closed loop: batches in flight")
    p.add_argument("--rate", type=float, default=0.0, help="open loop: offered fingerprints/s (0 = closed loop)")
    p.add_argument("--connections", type=int, default=32, help="open loop: keep-alive connections")
    p.add_argument("--tenants", type=int, default=50)
    p.add_argument("--long-share", type=float, default=0.01)
    p.add_argument("--workers", type=int, default=2, help="uvicorn workers of the service")
    p.add_argument(
        "--split",
        type=int,
        default=0,
        help="API and workers apart: the API with BLEEDWATCH_INGEST_WORKERS=0 and this many `bleedwatch work`",
    )
    p.add_argument("--warmup", type=float, default=0.05, help="share of batches sent before timing")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--w", type=int, default=DEFAULT_PARAMS.w, help="prompts' winnowing window (1: every shingle)")
    p.add_argument("--response-w", type=int, default=DEFAULT_PARAMS.response_w, help="answers' winnowing window")
    p.add_argument("--wait", action="store_true", help="answers after processing (no Prefer: respond-async)")
    p.add_argument("--queue-shards", type=int, default=1, help="BLEEDWATCH_INGEST_QUEUE_SHARDS of the service")
    p.add_argument(
        "--shared-redis", action="store_true", help="use BLEEDWATCH_TEST_REDIS_URL, not a redis-server of its own"
    )
    p.add_argument(
        "--cluster-masters", type=int, default=0, help="a Redis Cluster of this many masters (at least 3) of its own"
    )
    p.add_argument(
        "--load-processes",
        type=int,
        default=1,
        help="post from this many processes (batches dealt round-robin), so the load generator is not the limit",
    )
    args = p.parse_args()

    mix = Mix(tenants=args.tenants, long_share=args.long_share)
    t0 = time.perf_counter()
    texts = chat_texts(args.exchanges, mix, args.seed, prefix=f"bench{args.seed}")
    words = sum(len(t.prompt.split()) + len(t.response.split()) for t in texts)
    t1 = time.perf_counter()
    exchanges = fingerprint_all(texts, params=replace(DEFAULT_PARAMS, w=args.w, response_w=args.response_w))
    t2 = time.perf_counter()
    print(
        f"traffic: {len(texts)} exchanges, {words:,} words, {sum(t.leak_from is not None for t in texts)} leaks "
        f"(built in {t1 - t0:.1f} s, fingerprinted by the SDK on 2 processes in {t2 - t1:.1f} s)",
        flush=True,
    )
    requests = batches(exchanges, args.batch)
    warm = max(1, int(len(requests) * args.warmup))
    warmup, timed = requests[:warm], requests[warm:]
    timed_ex = sum(n for _, n, _ in timed)
    timed_fps = sum(f for _, _, f in timed)
    with running_service(
        workers=args.workers,
        own_redis=not args.shared_redis,
        cluster_masters=args.cluster_masters,
        work_processes=args.split,
        ingest_queue_shards=str(args.queue_shards),
    ) as service:
        nodes = redis_nodes(service.redis_url)
        port = int(service.url.rsplit(":", 1)[1])
        token = service.key("ingest")
        reader = service.key("read")
        pids = process_tree(service.pid) + list(service.worker_pids)
        processing = list(service.worker_urls) or [service.url]

        commands: dict[str, tuple[int, int]] = {}
        queue_keys = [Keys(service.env["BLEEDWATCH_KEY_PREFIX"]).queue_shard(i) for i in range(args.queue_shards)]
        queue_client = (
            redis.RedisCluster.from_url(service.redis_url)
            if args.cluster_masters
            else redis.Redis.from_url(service.redis_url)
        )
        answered = 0.0
        lag: dict[str, list[tuple[float, float]]] = {}

        async def run() -> tuple[list[float], float, float, list[float], float]:
            nonlocal answered
            connections = max(args.concurrency, args.connections)
            async with Poster("127.0.0.1", port, token, connections, respond_async=not args.wait) as poster:
                wire = [(poster.request(b), n, f) for b, n, f in timed]
                await closed_loop(poster, [(poster.request(b), n, f) for b, n, f in warmup], args.concurrency)
                await drained(queue_client, queue_keys)
                lag["before"] = queue_seconds(processing)
                cpu_service = sum(cpu_seconds(pid) for pid in pids)
                cpu_redis = redis_cpu(nodes)
                commands.update(command_usec(nodes))
                cpu_self = time.process_time()
                start = time.perf_counter()
                cpu_loaders = 0.0
                if args.load_processes > 1:
                    latencies, cpu_loaders = await several(timed, port, token, args)
                elif args.rate > 0:
                    latencies = await open_loop(poster, wire, args.rate)
                else:
                    latencies = await closed_loop(poster, wire, args.concurrency)
                answered = time.perf_counter() - start
                await drained(queue_client, queue_keys)
                elapsed = time.perf_counter() - start
                lag["after"] = queue_seconds(processing)
                after = command_usec(nodes)
                for name, (calls, usec) in after.items():
                    before = commands.get(name, (0, 0))
                    commands[name] = (calls - before[0], usec - before[1])
                return (
                    latencies,
                    elapsed,
                    sum(cpu_seconds(pid) for pid in pids) - cpu_service,
                    [after - before for before, after in zip(cpu_redis, redis_cpu(nodes), strict=True)],
                    time.process_time() - cpu_self + cpu_loaders,
                )

        latencies, elapsed, cpu_service, cpu_per_node, cpu_self = uvloop.run(run())
        cpu_redis = sum(cpu_per_node)
        found = all_findings(service.url, reader)
        ceiling = redis_ceiling(service.redis_url, cluster=args.cluster_masters > 0)
    latencies.sort()
    fps_rate = timed_fps / elapsed
    mode = (
        f"open loop at {args.rate:,.0f} fingerprints/s offered"
        if args.rate > 0
        else (f"closed loop, {args.concurrency} batches in flight")
    )
    apart = f", API apart from {args.split} `bleedwatch work` process(es)" if args.split else ""
    print(
        f"{len(timed)} timed batches of {args.batch} exchanges ({warm} more as warm-up), {mode}, "
        f"{args.workers} worker(s){apart}"
    )
    print(
        f"  {timed_ex / elapsed:,.0f} exchanges/s, {fps_rate:,.0f} fingerprints/s ({timed_fps:,} in {elapsed:.1f} s, "
        f"all answered by {answered:.1f} s)"
    )
    queued_p50, queued_p99 = (bucket_quantile(lag["before"], lag["after"], q) for q in (0.5, 0.99))
    print(f"  accepted to processed (the service's histogram): p50 <= {queued_p50:g} s, p99 <= {queued_p99:g} s")
    print(
        f"  batch latency p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms"
    )
    if SLOW:
        print(
            f"  latency p90 {percentile(latencies, 0.9) * 1000:.1f} ms, "
            f"p99.9 {percentile(latencies, 0.999) * 1000:.1f} ms, "
            f"max {latencies[-1] * 1000:.1f} ms; slowest: "
            + ", ".join(f"{lat * 1000:.0f} ms at {at:.1f} s ({fps:,} fps)" for lat, at, fps in sorted(SLOW)[-5:])
        )
        over: dict[int, int] = {}
        for lat, at, _ in SLOW:
            if lat > 0.05:
                over[int(at)] = over.get(int(at), 0) + 1
        print("  batches over 50 ms by second of the run: " + ", ".join(f"{k} s: {v}" for k, v in sorted(over.items())))
    leaks = {t.request_id: t.leak_from for t in texts if t.leak_from is not None}
    caught = [f for f in found if leaks.get(f["recipient_request_id"]) in f["source_request_ids"]]
    others = [f for f in found if f not in caught]
    findings = len(found)
    print(f"  findings: {len(caught)} of {len(leaks)} leaks found, {len(others)} other findings")
    for f in others[:5]:
        print(
            f"    other: {f['recipient_request_id']} <- {f['source_request_ids']}, {f['matched_fingerprints']} "
            f"fingerprints, run {f['longest_run_tokens']} tokens, score {f['score']}"
        )
    per_master = " + ".join(f"{c / elapsed:.2f}" for c in cpu_per_node)
    print(
        f"  CPU: service {cpu_service / elapsed:.2f} cores, Redis {cpu_redis / elapsed:.2f} ({per_master} by master), "
        f"load generator {cpu_self / elapsed:.2f} ({args.load_processes} process(es)), of {os.cpu_count()}"
    )
    busiest = sorted(commands.items(), key=lambda kv: -kv[1][1])[:4]
    print(
        "  Redis time by command: "
        + ", ".join(
            f"{k.removeprefix('cmdstat_')} {usec / 1e6 / elapsed:.2f} cores ({calls:,} calls)"
            for k, (calls, usec) in busiest
        )
    )
    print(
        f"  reference: redis-benchmark -P 64 SET {ceiling:,.0f} ops/s in the same run; "
        f"bleedwatch: {fps_rate / ceiling:.3f} fingerprints per SET of that ceiling"
    )
    print(
        "RESULT "
        + orjson.dumps(
            {
                "mode": "open" if args.rate > 0 else "closed",
                "rate": args.rate,
                "batch": args.batch,
                "workers": args.workers,
                "split": args.split,
                "queue_shards": args.queue_shards,
                "exchanges_s": timed_ex / elapsed,
                "fps_s": fps_rate,
                "p50_ms": percentile(latencies, 0.5) * 1000,
                "p99_ms": percentile(latencies, 0.99) * 1000,
                "queued_p99_s": queued_p99,
                "findings": findings,
                "leaks": len(leaks),
                "leaks_found": len(caught),
                "other_findings": len(others),
                "redis_set_ceiling": ceiling,
                "masters": max(1, args.cluster_masters),
                "cluster": args.cluster_masters > 0,
                "load_processes": args.load_processes,
                "cpus": os.cpu_count(),
                "service_cpu_cores": cpu_service / elapsed,
                "redis_cpu_cores": cpu_redis / elapsed,
                "redis_cpu_cores_by_master": [c / elapsed for c in cpu_per_node],
                "load_cpu_cores": cpu_self / elapsed,
            }
        ).decode()
    )


if __name__ == "__main__":
    main()
