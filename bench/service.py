"""A real bleedwatch for benchmarks: ``bleedwatch serve`` on loopback, on Redis and PostgreSQL.

Each run gets its own Redis key prefix and PostgreSQL schema, removed afterwards, so it never
touches other data on the same servers. With ``own_redis=True`` it also gets a redis-server of
its own (a free loopback port, a temporary directory, the hash encoding limits the index is
sized for stated on its command line): timings then do not depend on what other users of a
shared Redis are doing, and ``INFO`` figures are the service's alone.
"""

from __future__ import annotations

import os
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

    def key(self, role: str) -> str:
        out = subprocess.run(
            [BLEEDWATCH, "keys", "create", "--name", f"bench {role}", "--role", role],
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        return out.split()[-1]


@contextmanager
def own_redis_server() -> Iterator[str]:
    from tests.redis_servers import RedisServer  # the tests' helper: never the shared server

    with tempfile.TemporaryDirectory(prefix="bleedwatch-bench-redis-") as tmp:
        server = RedisServer(Path(tmp), args=("--hash-max-listpack-entries", "128", "--hash-max-listpack-value", "64"))
        server.start()
        try:
            yield server.url
        finally:
            server.kill()


@contextmanager
def running_service(workers: int = 1, *, own_redis: bool = False, **settings: str) -> Iterator[Running]:
    if own_redis:
        with own_redis_server() as url, running_service(workers, redis_url=url, **settings) as running:
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
    try:
        subprocess.run([BLEEDWATCH, "migrate"], env=env, check=True, capture_output=True)
        port = free_port()
        server = subprocess.Popen([BLEEDWATCH, "serve", "--port", str(port)], env=env)
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        yield Running(url, env, server.pid, redis_url)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 1000):
            client.unlink(*keys[i : i + 1000])
        client.close()
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
        admin.close()
