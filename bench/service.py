"""A real bleedwatch for benchmarks: ``bleedwatch serve`` on loopback, on Redis and PostgreSQL.

Each run gets its own Redis key prefix and PostgreSQL schema, removed afterwards, so it never
touches other data on the same servers. With ``own_redis=True`` it also gets a redis-server of
its own (a free loopback port, a temporary directory, the hash encoding limits the index is
sized for stated on its command line): timings then do not depend on what other users of a
shared Redis are doing, and ``INFO`` figures are the service's alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import redis

from service.local_server import free_port

REDIS_URL = os.environ.get("BLEEDWATCH_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
DATABASE_URL = os.environ.get("BLEEDWATCH_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
BLEEDWATCH = str(Path(sys.executable).parent / "bleedwatch")


@dataclass(frozen=True, slots=True)
class Running:
    url: str
    env: dict[str, str]
    pid: int
    redis_url: str = REDIS_URL
    # With `work_processes`: each `bleedwatch work` process's pid and metrics URL (the API processes nothing).
    worker_pids: tuple[int, ...] = ()
    worker_urls: tuple[str, ...] = ()

    def key(self, role: str) -> str:
        out = subprocess.run(
            [BLEEDWATCH, "keys", "create", "--name", f"bench {role}", "--role", role],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return out.split()[-1]


LISTPACK_LIMITS = ("--hash-max-listpack-entries", "128", "--hash-max-listpack-value", "64")


@contextmanager
def own_redis_server(cluster_masters: int = 0) -> Iterator[str]:
    """A redis-server of our own, or a Redis Cluster of ``cluster_masters`` masters on loopback ports."""
    from tests.redis_servers import RedisClusterServers, RedisServer  # the tests' helpers: never the shared server

    with tempfile.TemporaryDirectory(prefix="bleedwatch-bench-redis-") as tmp:
        server: RedisServer | RedisClusterServers
        if cluster_masters:
            server = RedisClusterServers(Path(tmp), cluster_masters, args=LISTPACK_LIMITS)
        else:
            server = RedisServer(Path(tmp), args=LISTPACK_LIMITS)
        server.start()
        try:
            yield server.url
        finally:
            server.stop()


def redis_nodes(url: str) -> list[redis.Redis]:
    """A client per node: the server at ``url``, or every master of the cluster it belongs to."""
    client = redis.Redis.from_url(url)
    if not client.info("cluster").get("cluster_enabled"):
        return [client]
    nodes = client.execute_command("CLUSTER NODES")  # type: ignore[no-untyped-call]
    client.close()
    masters = [address for address, node in nodes.items() if "master" in node["flags"]]
    return [redis.Redis(host=a.rsplit(":", 1)[0], port=int(a.rsplit(":", 1)[1])) for a in masters]


@contextmanager
def running_service(
    workers: int = 1, *, own_redis: bool = False, cluster_masters: int = 0, work_processes: int = 0, **settings: str
) -> Iterator[Running]:
    """``work_processes`` > 0: the API with BLEEDWATCH_INGEST_WORKERS=0 and that many ``bleedwatch work``."""
    if own_redis or cluster_masters:
        cluster = {"redis_cluster": "true"} if cluster_masters else {}
        with (
            own_redis_server(cluster_masters) as url,
            running_service(
                workers,
                own_redis=False,
                cluster_masters=0,
                work_processes=work_processes,
                redis_url=url,
                **cluster,
                **settings,
            ) as running,
        ):
            yield running
        return
    redis_url = settings.get("redis_url", REDIS_URL)
    run = uuid.uuid4().hex[:8]
    schema = f"bw_bench_{run}"
    prefix = f"bwbench{run}"
    admin = psycopg.connect(DATABASE_URL, autocommit=True)
    admin.execute(f'CREATE SCHEMA "{schema}"')
    env = (
        os.environ
        | {
            "BLEEDWATCH_REDIS_URL": redis_url,
            "BLEEDWATCH_DATABASE_URL": f"{DATABASE_URL}?options=-csearch_path%3D{schema}",
            "BLEEDWATCH_KEY_PREFIX": prefix,
            "BLEEDWATCH_WORKERS": str(workers),
            "BLEEDWATCH_LOG_LEVEL": "warning",
            "BLEEDWATCH_RATE_LIMIT_PER_SECOND": "0",  # the load generator is one API key
        }
        | {f"BLEEDWATCH_{k.upper()}": v for k, v in settings.items()}
    )
    server = None
    work: list[subprocess.Popen[bytes]] = []
    # `kill` (SIGTERM) unwinds like Ctrl-C, so a stopped run removes its keys and schema too.
    stopped = signal.signal(signal.SIGTERM, _exit)
    try:
        subprocess.run([BLEEDWATCH, "migrate"], env=env, check=True, capture_output=True)
        port = free_port()
        api_env = env | ({"BLEEDWATCH_INGEST_WORKERS": "0"} if work_processes else {})
        server = subprocess.Popen([BLEEDWATCH, "serve", "--port", str(port)], env=api_env)
        url = f"http://127.0.0.1:{port}"
        worker_urls = []
        for _ in range(work_processes):
            work_port = free_port()
            work.append(subprocess.Popen([BLEEDWATCH, "work", "--port", str(work_port)], env=env))
            worker_urls.append(f"http://127.0.0.1:{work_port}")
        for ready in [url, *worker_urls]:
            for _ in range(200):
                try:
                    if httpx.get(f"{ready}/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        yield Running(url, env, server.pid, redis_url, tuple(p.pid for p in work), tuple(worker_urls))
    finally:
        for proc in [p for p in (server, *work) if p is not None]:
            proc.terminate()
        for proc in [p for p in (server, *work) if p is not None]:
            proc.wait(timeout=30)
        for node in redis_nodes(redis_url):  # one key per UNLINK: a cluster refuses keys of several slots
            with node.pipeline(transaction=False) as pipe:
                for key in node.scan_iter(match=f"{prefix}:*", count=1000):
                    pipe.unlink(key)
                pipe.execute()
            node.close()
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()
        signal.signal(signal.SIGTERM, stopped)


def _exit(signum: int, _: object) -> None:
    raise SystemExit(128 + signum)
