"""Fault drill (issue 19): crash what bleedwatch stands on under steady load, then count what a 202 was worth.

    .venv/bin/python bench/faults.py                          # appendfsync everysec, then always (~5 min)
    .venv/bin/python bench/faults.py --fsync everysec --json drill.json

The tests prove each recovery path alone (tests/test_redis_outage.py, test_findings_outbox.py,
test_ingest_queue.py, test_sharded_queue.py). An operator deciding what a 202 is worth needs the
faults one after another, under load, counted end to end: this drill gives those numbers.

Set-up, per fsync mode: a redis-server of its own (AOF, ``--appendfsync`` as asked, noeviction, in
a temporary directory on disk), a schema of its own in the machine's PostgreSQL reached through a
TCP proxy it can cut (tests/tcp_proxy.py; the server itself is never touched), two ``bleedwatch
serve`` replicas, and the SDK (``BleedwatchClient``, with a spool) sending pre-fingerprinted chat
traffic with planted leaks (bench/load.py) at a steady rate through a round-robin balancer that
records every exchange answered 202. First closed-loop bursts: one to warm up, then (first run
only, ``--cost-rounds``) everysec and always in turn on the same Redis (``CONFIG SET``), with
``redis-benchmark`` SETs beside them: the price of ``always``, measured so that the machine's
drift weighs on both alike. Then, during the paced load, one after another:

1. **Redis process crash**: ``kill -9``, restarted from its AOF at once.
2. **Redis host crash, simulated**: ``kill -9``, the AOF cut back to what its last fsync made
   durable, then restarted. Killing a process loses nothing it has written (the kernel keeps it);
   a power loss loses what was not fsynced. bench/aof_synced.c, preloaded into redis-server,
   logs the durable size at each fsync, so this is a power loss in which the page cache wrote
   back nothing more (the worst case).
3. **PostgreSQL away** for ``--pg-outage`` seconds (30): the proxy drops every connection and
   refuses new ones, then listens again.
4. **A replica ``kill -9``** while it holds a batch (taken from the queue, not finished),
   restarted 2 s later; the survivor takes the batch over after BLEEDWATCH_INGEST_RECLAIM_SECONDS.

Counted once the SDK has delivered everything and the queue and findings outbox are empty: each
acknowledged exchange is processed exactly once (its idempotency mark set, one prompt and one
response document: a batch processed twice under new refs would leave more), lost (neither), or
otherwise; acknowledged exchanges lost, by fault, with how long before the crash they were
answered; planted leaks found exactly once; duplicate findings; dead letters; SDK drops.
Prints a table; ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson
import psycopg
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ingest import all_findings, redis_benchmark_sets
from bench.load import Mix, Poster, TextPair, batches, chat_texts, fingerprint_all, fingerprint_count, percentile
from bench.service import BLEEDWATCH, DATABASE_URL, LISTPACK_LIMITS
from bleedwatch import BleedwatchClient
from service.index.keys import Keys
from service.index.queue import GROUP
from service.index.redis_index import decode_doc
from service.local_server import free_port
from tests.redis_servers import RedisServer
from tests.tcp_proxy import TcpProxy

HERE = Path(__file__).resolve().parent
RECLAIM_SECONDS = 5  # a killed replica's batch is taken over after this long idle (30 s by default)
REPLICA_DOWN_SECONDS = 2.0
RESTART_SECONDS = 120.0  # Redis replays its whole AOF before it answers: seconds per few hundred MB


@dataclass(frozen=True, slots=True)
class Ack:
    """One 202: when (seconds into the run), how long the request took, and the exchanges it acknowledged."""

    at: float
    seconds: float
    exchanges: tuple[tuple[str, str], ...]


@dataclass
class Fault:
    name: str
    at: float = 0.0  # seconds into the run
    down_seconds: float = 0.0  # from the fault to the service answering again
    note: str = ""
    longest_without_202: float = 0.0
    lost_exchanges: int = 0
    lost_batches: int = 0
    lost_answered_before_s: float = 0.0  # the oldest lost acknowledgement, seconds before the fault


@dataclass
class Result:
    fsync: str
    burst_exchanges: int = 0
    burst_fps: float = 0.0
    cost_fps: dict[str, list[float]] = field(default_factory=dict)  # interleaved bursts, by appendfsync
    cost_set_per_s: dict[str, list[float]] = field(default_factory=dict)  # redis-benchmark SET, 8 clients, no pipeline
    load_exchanges: int = 0
    acknowledged: int = 0
    processed_once: int = 0
    lost: int = 0
    processed_twice: int = 0
    partial: int = 0
    partial_how: dict[str, int] = field(default_factory=dict)
    odd: list[dict[str, Any]] = field(
        default_factory=list
    )  # exchanges not processed exactly once, not lost  # "mark 1, prompt docs 0, response docs 1": count
    processed_unacknowledged: int = 0
    leaks_planted: int = 0
    leaks_found_once: int = 0
    leaks_missed: list[dict[str, Any]] = field(default_factory=list)
    leaks_missed_lost: int = 0  # of the missed: a side of the leak was lost with Redis
    duplicate_findings: int = 0
    other_findings: int = 0
    dead_letters: int = 0
    findings_dead_letters: int = 0
    sdk_dropped: int = 0
    sdk_spooled: int = 0
    ack_p50_ms: float = 0.0
    ack_p99_ms: float = 0.0
    drain_seconds: float = 0.0
    faults: list[Fault] = field(default_factory=list)


class Balancer(httpx.AsyncBaseTransport):
    """What a load balancer in front of the replicas does: round robin, and a refused connection
    tried on the next replica at once (a request that was sent is never resent here: the SDK
    decides). It also records each exchange answered 202, which is what the drill counts against."""

    def __init__(self, urls: list[str], acks: list[Ack], t0: float) -> None:
        self._targets = [urlsplit(u) for u in urls]
        self._inner = httpx.AsyncHTTPTransport()
        self._next = 0
        self._acks = acks
        self._t0 = t0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = request.content
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"host"]
        for attempt in range(len(self._targets)):
            target = self._targets[self._next % len(self._targets)]
            self._next += 1
            url = request.url.copy_with(host=target.hostname, port=target.port)
            start = time.monotonic()
            try:
                resp = await self._inner.handle_async_request(
                    httpx.Request(request.method, url, headers=headers, content=body)
                )
            except httpx.ConnectError:
                if attempt + 1 == len(self._targets):
                    raise
                continue
            if request.url.path != "/v1/exchanges" or resp.status_code != 202:
                return resp
            content = await resp.aread()
            self._record(body, content, start)
            kept = [(k, v) for k, v in resp.headers.raw if k.lower() not in (b"content-encoding", b"content-length")]
            return httpx.Response(resp.status_code, headers=kept, content=content)
        raise AssertionError("unreachable")

    def _record(self, body: bytes, answer: bytes, start: float) -> None:
        sent = orjson.loads(body)["exchanges"]
        results = orjson.loads(answer).get("results") or [{"status": "accepted"}] * len(sent)
        taken = tuple(
            (ex["tenant"], ex["request_id"])
            for ex, r in zip(sent, results, strict=True)
            if r.get("status") in ("accepted", "duplicate")
        )
        now = time.monotonic()
        self._acks.append(Ack(now - self._t0, now - start, taken))

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class Replica:
    port: int
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [BLEEDWATCH, "serve", "--port", str(self.port)], env=self.env, stdout=out, stderr=out
            )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"replica on port {self.port} not ready within {timeout} s: see {self.log}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def build_preload(directory: Path) -> Path | None:
    """bench/aof_synced.c as a shared library, or None without a C compiler (no host-crash fault then)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = directory / "aof_synced.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(HERE / "aof_synced.c"), "-ldl"], check=True)
    return out


def cut_aof_to_durable(redis_dir: Path, sync_log: Path) -> int:
    """Each AOF file back to its last fsynced size (a power loss); returns the bytes cut."""
    durable: dict[str, int] = {}
    if sync_log.exists():
        for line in sync_log.read_text().splitlines():
            path, _, synced = line.rpartition(" ")
            durable[path] = int(synced)
    cut = 0
    for aof in sorted((redis_dir / "appendonlydir").glob("*.aof")):
        size = aof.stat().st_size
        keep = durable.get(str(aof), 0)
        if keep < size:
            with aof.open("r+b") as f:
                f.truncate(keep)
            cut += size - keep
    return cut


@contextlib.contextmanager
def own_schema() -> Iterator[str]:
    schema = f"bw_faults_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(DATABASE_URL, autocommit=True, connect_timeout=5)
    admin.execute("SET lock_timeout = '30s'")  # never wait forever on a replica's transaction
    admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()


def through(proxy_port: int, schema: str) -> str:
    """DATABASE_URL with the proxy's port and the run's schema."""
    parts = urlsplit(DATABASE_URL)
    netloc = f"{parts.username}@" if parts.username else ""
    netloc += f"127.0.0.1:{proxy_port}"
    query = f"options=-csearch_path%3D{schema}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def prepare(env: dict[str, str]) -> tuple[str, str]:
    """Migrate the run's schema; an ingest key and a read key."""
    subprocess.run([BLEEDWATCH, "migrate"], env=env, check=True, capture_output=True)
    return key(env, "ingest"), key(env, "read")


def key(env: dict[str, str], role: str) -> str:
    out = subprocess.run(
        [BLEEDWATCH, "keys", "create", "--name", f"drill {role}", "--role", role],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[-1]


def holding(client: redis.Redis, queue: str, pid: int) -> bool:
    """Whether the replica with this pid has taken a batch and not finished it (consumer names carry the pid)."""
    try:
        summary: Any = client.xpending(queue, GROUP)
    except (redis.ResponseError, redis.ConnectionError):
        return False
    for consumer in summary.get("consumers") or []:
        name = consumer["name"].decode() if isinstance(consumer["name"], bytes) else str(consumer["name"])
        if f"-{pid}-" in name and int(consumer["pending"]):
            return True
    return False


async def until_answering(url: str, within: float) -> float:
    """Seconds until ``GET /readyz`` answers 200 (Redis and the database reachable)."""
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=2) as client:
        while time.monotonic() - start < within:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{url}/readyz")).status_code == 200:
                    return time.monotonic() - start
            await asyncio.sleep(0.05)
    return float("nan")


async def until(condition: Callable[[], bool], pause: float) -> None:
    """Poll ``condition`` (a quick Redis read) until it holds."""
    while True:
        if condition():
            return
        await asyncio.sleep(pause)


async def closed_burst(
    replicas: list[Replica],
    token: str,
    exchanges: list[dict[str, Any]],
    acks: list[Ack],
    origin: float,
    empty: Callable[[], bool],
) -> float:
    """Post every exchange in batches of 100, two in flight per replica; fingerprints/s until all are processed."""
    wire = batches(exchanges, 100)
    start = time.monotonic()
    async with (
        Poster("127.0.0.1", replicas[0].port, token, 2) as one,
        Poster("127.0.0.1", replicas[1].port, token, 2) as two,
    ):
        todo = list(reversed(wire))

        async def post(poster: Poster) -> None:
            while todo:
                body, _, _ = todo.pop()
                status, answer = await poster.post(poster.request(body))
                if status != 202:
                    raise RuntimeError(f"burst: {status} {answer[:200]!r}")
                sent = orjson.loads(body)["exchanges"]
                now = time.monotonic()
                acks.append(Ack(now - origin, 0.0, tuple((e["tenant"], e["request_id"]) for e in sent)))

        await asyncio.gather(post(one), post(one), post(two), post(two))
        await until(empty, 0.01)
    return sum(f for _, _, f in wire) / (time.monotonic() - start)


def sets(port: int) -> float:
    """``redis-benchmark`` SET/s from 8 clients without pipelining: Redis' own price of each fsync policy."""
    return redis_benchmark_sets("-p", str(port), "-n", "20000", "-c", "8")


def drained(client: redis.Redis, keys: Keys) -> bool:
    return not client.xlen(keys.queue) and not client.xlen(keys.outbox)


def planted(texts: list[TextPair]) -> dict[str, str]:
    """Recipient request id -> source request id of each planted leak. bench/load.py sometimes plants a
    tenant's own earlier prompt (its check compares a request id with a tenant): no leak, left out."""
    tenant = {t.request_id: t.tenant for t in texts}
    return {t.request_id: t.leak_from for t in texts if t.leak_from is not None and tenant[t.leak_from] != t.tenant}


async def drive(
    args: argparse.Namespace,
    exchanges: list[dict[str, Any]],
    burst: list[dict[str, Any]],
    fsync: str,
    work: Path,
    cost: bool,
) -> tuple[Result, list[Ack], dict[tuple[str, str, str], list[int]], set[tuple[str, str]], list[dict[str, Any]]]:
    result = Result(fsync)
    redis_dir = work / "redis"
    sync_log = work / "aof-sync.log"
    preload = build_preload(work) if args.host_crash else None
    redis_env = os.environ | ({"LD_PRELOAD": str(preload), "BW_AOF_SYNC_LOG": str(sync_log)} if preload else {})
    server = RedisServer(
        redis_dir,
        durable=True,
        args=(
            *LISTPACK_LIMITS,
            "--appendfsync",
            fsync,
            "--maxmemory-policy",
            "noeviction",
        ),
        env=redis_env,
    )
    server.start()
    proxy = TcpProxy(*(urlsplit(DATABASE_URL).hostname or "127.0.0.1", urlsplit(DATABASE_URL).port or 5432))
    proxy.start()
    prefix = f"bwfaults{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix)
    replicas: list[Replica] = []
    direct = redis.Redis.from_url(server.url, socket_timeout=5)
    acks: list[Ack] = []
    try:
        with own_schema() as schema:
            try:
                env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"} | {
                    "BLEEDWATCH_REDIS_URL": server.url,
                    "BLEEDWATCH_DATABASE_URL": through(proxy.port, schema),
                    "BLEEDWATCH_KEY_PREFIX": prefix,
                    "BLEEDWATCH_WORKERS": "1",
                    "BLEEDWATCH_LOG_LEVEL": "warning",
                    "BLEEDWATCH_RATE_LIMIT_PER_SECOND": "0",
                    "BLEEDWATCH_INGEST_RECLAIM_SECONDS": str(RECLAIM_SECONDS),
                }
                ingest, reader = await asyncio.to_thread(prepare, env)
                replicas = [Replica(free_port(), env, work / f"replica-{i}.log") for i in range(2)]
                for r in replicas:
                    r.start()
                for r in replicas:
                    await asyncio.to_thread(r.wait_ready)

                # Throughput: closed-loop bursts of batches of 100, 2 in flight per replica. The first
                # warms up; with --cost-rounds, then everysec and always in turn on the same server
                # (CONFIG SET), the same exchanges under new request ids each time, so that a machine
                # whose speed drifts by ±20 % from one minute to the next weighs on both alike.
                origin = time.monotonic()  # the run's clock: acknowledgements and faults in seconds from here
                pairs = [("everysec", "always"), ("always", "everysec")]  # ABBA: later copies may cost less
                rounds = [("", fsync)] + [
                    (f"~{mode[0]}{k}", mode) for k in range(args.cost_rounds) for mode in pairs[k % 2]
                ]
                for tag, mode in rounds if cost else rounds[:1]:
                    direct.config_set("appendfsync", mode)
                    copy = [ex | {"request_id": ex["request_id"] + tag} for ex in burst]
                    fps = await closed_burst(replicas, ingest, copy, acks, origin, lambda: drained(direct, keys))
                    (result.cost_fps.setdefault(mode, []) if tag else []).append(fps)
                    if not tag:
                        result.burst_exchanges, result.burst_fps = len(burst), fps
                    print(f"  [{fsync}] burst{tag or ''} ({mode}): {fps:,.0f} fingerprints/s processed", flush=True)
                if cost:
                    for k in range(args.cost_rounds):
                        for mode in pairs[k % 2]:
                            direct.config_set("appendfsync", mode)
                            result.cost_set_per_s.setdefault(mode, []).append(
                                await asyncio.to_thread(sets, server.port)
                            )
                direct.config_set("appendfsync", fsync)
                burst_acks = len(acks)

                # The paced load and the faults, one after another.
                t0 = time.monotonic()
                faults: list[Fault] = []
                spool = work / "sdk.spool"
                transport = Balancer([r.url for r in replicas], acks, origin)
                client = BleedwatchClient(
                    replicas[0].url,
                    ingest,
                    batch_size=args.batch,
                    flush_seconds=0.25,
                    max_backoff_seconds=2.0,
                    transport=transport,
                    spool=spool,
                )
                stop = asyncio.Event()

                async def load() -> None:
                    for i, ex in enumerate(exchanges):
                        if stop.is_set():
                            break
                        delay = t0 + i / args.rate - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        await client.submit(ex)
                        result.load_exchanges += 1

                def now() -> float:
                    return time.monotonic() - origin

                async def faulting() -> None:
                    try:
                        await faults_in_a_row()
                    finally:
                        stop.set()  # a fault that fails ends the load too: the run then reports it

                async def faults_in_a_row() -> None:
                    await asyncio.sleep(args.settle)
                    fault = Fault("Redis kill -9 (process crash), restart from the AOF", now())
                    await asyncio.to_thread(server.kill)
                    await asyncio.to_thread(server.start, RESTART_SECONDS)
                    fault.down_seconds = now() - fault.at + await until_answering(replicas[0].url, 60)
                    faults.append(fault)
                    print(f"  [{fsync}] {fault.name} at {fault.at:.1f} s", flush=True)

                    if preload is not None:
                        await asyncio.sleep(args.settle)
                        fault = Fault("Redis host crash (kill -9, AOF cut to its last fsync), restart", now())
                        await asyncio.to_thread(server.kill)
                        cut = cut_aof_to_durable(redis_dir, sync_log)
                        await asyncio.to_thread(server.start, RESTART_SECONDS)
                        fault.down_seconds = now() - fault.at + await until_answering(replicas[0].url, 60)
                        fault.note = f"{cut:,} AOF bytes not yet fsynced, cut"
                        faults.append(fault)
                        print(f"  [{fsync}] {fault.name} at {fault.at:.1f} s: {fault.note}", flush=True)

                    await asyncio.sleep(args.settle)
                    fault = Fault(f"PostgreSQL cut for {args.pg_outage:g} s (TCP proxy)", now())
                    await asyncio.to_thread(proxy.cut)
                    await asyncio.sleep(args.pg_outage)
                    await asyncio.to_thread(proxy.restore)
                    fault.down_seconds = now() - fault.at
                    faults.append(fault)
                    print(f"  [{fsync}] {fault.name} at {fault.at:.1f} s", flush=True)

                    await asyncio.sleep(args.settle)
                    victim = replicas[1]
                    fault = Fault("replica kill -9 holding a batch, restarted 2 s later", now())
                    assert victim.process is not None
                    pid, deadline = victim.process.pid, time.monotonic() + 20
                    await until(lambda: time.monotonic() > deadline or holding(direct, keys.queue, pid), 0.002)
                    held = holding(direct, keys.queue, victim.process.pid)
                    fault.at = now()
                    victim.kill()
                    await asyncio.sleep(REPLICA_DOWN_SECONDS)
                    victim.start()
                    await asyncio.to_thread(victim.wait_ready)
                    fault.down_seconds = now() - fault.at
                    fault.note = "killed holding a batch" if held else "never caught holding a batch: killed anyway"
                    faults.append(fault)
                    print(f"  [{fsync}] {fault.name} at {fault.at:.1f} s: {fault.note}", flush=True)
                    await asyncio.sleep(args.settle)
                    stop.set()

                async with client:
                    failed = [e for e in await asyncio.gather(load(), faulting(), return_exceptions=True) if e]
                    if failed:
                        raise failed[0]
                    await client.flush()
                await transport.aclose()
                result.sdk_dropped = client.dropped
                result.sdk_spooled = client.spooled

                start = time.monotonic()
                await until(lambda: drained(direct, keys) or time.monotonic() - start > args.drain_timeout, 0.1)
                if not drained(direct, keys):
                    print(f"  [{fsync}] not drained after {args.drain_timeout:g} s", flush=True)
                result.drain_seconds = time.monotonic() - start

                result.faults = faults
                load_acks = acks[burst_acks:]
                lat = sorted(a.seconds for a in load_acks)
                result.ack_p50_ms = percentile(lat, 0.5) * 1000
                result.ack_p99_ms = percentile(lat, 0.99) * 1000
                for fault in faults:
                    times = [fault.at] + [a.at for a in load_acks if fault.at <= a.at <= fault.at + 90]
                    times.sort()
                    fault.longest_without_202 = max((b - a for a, b in itertools.pairwise(times)), default=0.0)

                async with httpx.AsyncClient(
                    base_url=replicas[0].url, headers={"Authorization": f"Bearer {reader}"}
                ) as c:
                    queue_state = (await c.get("/v1/queue")).json()
                result.dead_letters = int(queue_state["dead_letters"])
                result.findings_dead_letters = int(direct.xlen(keys.outbox_dead))
                found = await asyncio.to_thread(all_findings, replicas[0].url, reader)
                docs = documents(direct, keys)
                marked = done_marks(direct, keys, {ex for a in acks for ex in a.exchanges})
                return result, acks, docs, marked, found
            finally:
                for r in replicas:  # before the schema is dropped
                    r.stop()
    finally:
        direct.close()
        with contextlib.suppress(Exception):
            proxy.stop()
        server.kill()


def documents(client: redis.Redis, keys: Keys) -> dict[tuple[str, str, str], list[int]]:
    """(tenant, request id, kind) -> the refs of the documents Redis holds for it."""
    out: dict[tuple[str, str, str], list[int]] = {}
    names = list(client.scan_iter(match=keys.doc_pattern(), count=1000))
    for i in range(0, len(names), 500):
        with client.pipeline(transaction=False) as pipe:
            for name in names[i : i + 500]:
                pipe.get(name)
            for name, raw in zip(names[i : i + 500], pipe.execute(), strict=True):
                if raw is not None:
                    _, meta = decode_doc(raw)
                    ref = int(name.rsplit(b":", 1)[1])
                    out.setdefault((meta.tenant, meta.request_id, meta.kind.name or ""), []).append(ref)
    return out


def done_marks(client: redis.Redis, keys: Keys, exchanges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The exchanges whose idempotency mark is set (service/ingest/service.py: ``_idempotency_key``)."""
    ordered = sorted(exchanges)
    marked: set[tuple[str, str]] = set()
    for i in range(0, len(ordered), 1000):
        part = ordered[i : i + 1000]
        with client.pipeline(transaction=False) as pipe:
            for tenant, request_id in part:
                pipe.exists(keys.done(f"{len(tenant)}:{tenant}:{request_id}"))
            marked.update(ex for ex, n in zip(part, pipe.execute(), strict=True) if n)
    return marked


def count(
    result: Result,
    acks: list[Ack],
    docs: dict[tuple[str, str, str], list[int]],
    marked: set[tuple[str, str]],
    found: list[dict[str, Any]],
    leaks: dict[str, str],
) -> Result:
    acked: dict[tuple[str, str], Ack] = {}
    for a in acks:
        for ex in a.exchanges:
            acked.setdefault(ex, a)  # the first acknowledgement is the one the gateway relied on
    result.acknowledged = len(acked)
    lost: list[tuple[str, str]] = []
    for ex in acked:
        refs = docs.get((*ex, "PROMPT"), []), docs.get((*ex, "RESPONSE"), [])
        prompt, response = len(refs[0]), len(refs[1])
        odd = not (ex in marked and prompt == response == 1) and (prompt or response or ex in marked)
        if odd and len(result.odd) < 30:  # what became of it: for the story in RESULTS.md
            answers = [round(a.at, 2) for a in acks if ex in a.exchanges]
            result.odd.append({"exchange": ex[1], "marked": ex in marked, "refs": refs, "answered_at": answers})
        if ex in marked and prompt == response == 1:
            result.processed_once += 1
        elif ex not in marked and prompt == response == 0:
            lost.append(ex)
        elif prompt > 1 or response > 1:
            result.processed_twice += 1
        else:
            result.partial += 1
            how = f"mark {int(ex in marked)}, prompt docs {prompt}, response docs {response}"
            result.partial_how[how] = result.partial_how.get(how, 0) + 1
    result.lost = len(lost)
    seen = {(t, r) for (t, r, _k) in docs}
    result.processed_unacknowledged = len(seen - set(acked))
    for fault in result.faults:
        fault.lost_exchanges = fault.lost_batches = 0
    redis_faults = [f for f in result.faults if f.name.startswith("Redis")]
    by_fault: dict[int, list[Ack]] = {}
    for ex in lost:
        a = acked[ex]
        # A lost acknowledgement belongs to the first Redis crash after it.
        after = [i for i, f in enumerate(redis_faults) if f.at >= a.at]
        if after:
            by_fault.setdefault(after[0], []).append(a)
    for i, fault in enumerate(redis_faults):
        lost_acks = by_fault.get(i, [])
        fault.lost_exchanges = len(lost_acks)
        fault.lost_batches = len({id(a) for a in lost_acks})
        fault.lost_answered_before_s = max((fault.at - a.at for a in lost_acks), default=0.0)
    per_recipient = Counter(f["recipient_request_id"] for f in found)
    result.duplicate_findings = sum(n - 1 for n in per_recipient.values() if n > 1)
    # Every copy of a burst (request id + "~tag") carries its original's leak; the finding may name
    # any copy of the source (the lowest ref of equal sources wins), so sources compare by original.
    sent = {r for _, r in acked}
    leaks = {r: leaks[base(r)] for r in sent if base(r) in leaks}
    result.leaks_planted = len(leaks)
    lost_ids = {r for _, r in lost}
    when = {r: a.at for (_, r), a in acked.items()}
    for recipient, source in leaks.items():
        mine = [f for f in found if f["recipient_request_id"] == recipient]
        if len(mine) == 1 and source in {base(s) for s in mine[0]["source_request_ids"]}:
            result.leaks_found_once += 1
            continue
        side_lost = recipient in lost_ids or any(base(r) == source for r in lost_ids)
        result.leaks_missed_lost += side_lost
        result.leaks_missed.append(
            {
                "recipient": recipient,
                "source": source,
                "findings": [(f["source_tenant"], f["source_request_ids"], f["matched_fingerprints"]) for f in mine],
                "recipient_answered_at": round(when.get(recipient, -1.0), 2),
                "source_answered_at": round(when.get(source, -1.0), 2),
                "a_side_lost": side_lost,
            }
        )
    result.other_findings = sum(1 for f in found if f["recipient_request_id"] not in leaks)
    return result


def base(request_id: str) -> str:
    """The request id a burst copy was made from."""
    return request_id.split("~", 1)[0]


def table(results: list[Result]) -> str:
    rows: list[tuple[str, ...]] = [("", *(f"appendfsync {r.fsync}" for r in results))]

    def row(label: str, *values: object) -> None:
        rows.append((label, *(str(v) for v in values)))

    row("warm-up burst: fingerprints/s processed", *(f"{r.burst_fps:,.0f}" for r in results))
    row("load: exchanges sent by the SDK", *(r.load_exchanges for r in results))
    row("acknowledged (202), burst and load", *(r.acknowledged for r in results))
    row("  processed exactly once", *(r.processed_once for r in results))
    row("  lost", *(r.lost for r in results))
    row("  processed twice (new refs)", *(r.processed_twice for r in results))
    row("  partly (mark or documents missing)", *(r.partial for r in results))
    row("processed, never acknowledged", *(r.processed_unacknowledged for r in results))
    row("planted leaks found exactly once", *(f"{r.leaks_found_once} of {r.leaks_planted}" for r in results))
    row("  missed, a side lost with Redis", *(r.leaks_missed_lost for r in results))
    row("duplicate findings", *(r.duplicate_findings for r in results))
    row("other findings", *(r.other_findings for r in results))
    row("dead letters (queue, findings)", *(f"{r.dead_letters}, {r.findings_dead_letters}" for r in results))
    row("SDK dropped (spooled)", *(f"{r.sdk_dropped} ({r.sdk_spooled})" for r in results))
    row("answer p50 / p99 under load", *(f"{r.ack_p50_ms:.0f} / {r.ack_p99_ms:.0f} ms" for r in results))
    row("drained after the load", *(f"{r.drain_seconds:.1f} s" for r in results))
    for i, fault in enumerate(results[0].faults):
        same = [r.faults[i] if i < len(r.faults) else Fault("-") for r in results]
        row(fault.name, *(f"no 202 for {f.longest_without_202:.1f} s" for f in same))
        if fault.name.startswith("Redis"):
            row(
                "  acknowledged and lost",
                *(
                    f"{f.lost_exchanges} exchanges in {f.lost_batches} batches"
                    + (f", answered ≤ {f.lost_answered_before_s:.2f} s before" if f.lost_batches else "")
                    for f in same
                ),
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    cost = results[0].cost_fps
    if cost:
        median = {mode: statistics.median(v) for mode, v in cost.items()}
        lines.append(
            "cost of always, bursts in turn on one Redis (fingerprints/s processed): "
            + "; ".join(f"{m} median {median[m]:,.0f} ({', '.join(f'{v:,.0f}' for v in cost[m])})" for m in cost)
            + f"; always/everysec {median['always'] / median['everysec']:.2f}"
        )
    raw = results[0].cost_set_per_s
    if raw:
        median = {mode: statistics.median(v) for mode, v in raw.items()}
        lines.append(
            "redis-benchmark SET/s, 8 clients, no pipelining: "
            + "; ".join(f"{m} median {median[m]:,.0f}" for m in raw)
            + f"; always/everysec {median['always'] / median['everysec']:.2f}"
        )
    return "\n".join(lines)


def options(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fsync", choices=["everysec", "always", "both"], default="both")
    p.add_argument("--rate", type=float, default=40.0, help="exchanges/s the SDK is given during the faults")
    p.add_argument("--batch", type=int, default=20, help="the SDK's batch size")
    p.add_argument("--settle", type=float, default=8.0, help="seconds of plain load before each fault and at the end")
    p.add_argument("--pg-outage", type=float, default=30.0, help="seconds PostgreSQL is cut off")
    p.add_argument("--burst", type=int, default=1000, help="exchanges of each closed-loop throughput burst")
    p.add_argument(
        "--cost-rounds", type=int, default=3, help="pairs of bursts, everysec then always, on the first run's Redis"
    )
    p.add_argument("--leak-share", type=float, default=0.03, help="share of answers carrying a planted leak")
    p.add_argument("--no-host-crash", dest="host_crash", action="store_false", help="skip the simulated power loss")
    p.add_argument("--drain-timeout", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", type=Path, help="write every figure here")
    return p.parse_args(argv)


def main() -> None:
    args = options()
    results = run(args)
    print(table(results))
    if args.json:
        args.json.write_bytes(orjson.dumps([asdict(r) for r in results], option=orjson.OPT_INDENT_2))


def run(args: argparse.Namespace) -> list[Result]:
    modes = ["everysec", "always"] if args.fsync == "both" else [args.fsync]
    faults_seconds = args.settle * (5 if args.host_crash else 4) + args.pg_outage + REPLICA_DOWN_SECONDS + 10
    n = int(args.rate * faults_seconds)
    mix = Mix(tenants=30, long_share=0.0, leak_share=args.leak_share)
    texts = chat_texts(n, mix, args.seed, prefix="drill")
    burst_texts = chat_texts(args.burst, mix, args.seed + 1, prefix="burst")
    start = time.monotonic()
    exchanges, burst = fingerprint_all(texts), fingerprint_all(burst_texts)
    print(
        f"traffic: {n} exchanges paced at {args.rate:g}/s ({sum(map(fingerprint_count, exchanges)):,} fingerprints, "
        f"{len(planted(texts))} planted leaks) and a burst of {args.burst}; fingerprinted in "
        f"{time.monotonic() - start:.0f} s",
        flush=True,
    )
    leaks = planted(texts) | planted(burst_texts)
    results: list[Result] = []
    for fsync in modes:
        with tempfile.TemporaryDirectory(prefix="bleedwatch-faults-", dir="/var/tmp") as tmp:
            result, acks, docs, marked, found = asyncio.run(
                drive(args, exchanges, burst, fsync, Path(tmp), cost=not results)
            )
        results.append(count(result, acks, docs, marked, found, leaks))
    return results


if __name__ == "__main__":
    main()
